"""How far a float32 computation may be from the exact one: a bound derived against a float64 reference.

Two float32 computations of one function (our NumPy model and our ONNX graph; ours and transformers') differ by how
each CPU and kernel rounds: the order of a matrix product's sums, fused multiply-adds or not, the polynomial `exp` is
computed with. A bound measured from one machine's float32 run does not hold on the next machine (issue 37: 1.9e-5
apart against a measured 1.1e-5). The bound here is derived instead, for any order of summation and any IEEE-754
binary32 kernel (x86 or ARM, with or without FMA), from the float64 model alone:

1. Local errors (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., ch. 2-3). Every rounding of
   float32 arithmetic is x(1 + d) with |d| <= u = 2^-24, so each primitive's result carries a sum of roundings, each
   bounded by u times a value the float64 model knows:
   - a dot product of n terms (matmul, linear, einsum) summed in ANY order: n products and n - 1 partial sums (one
     more with a bias), each partial sum at most sum_i |a_i b_i| (+ |bias|) whatever the order: root-sum-square of
     the bounds c = u (sqrt(n) + 1) (|a| |b| + |bias|); a sum or mean of n terms likewise;
   - +, -, *, /, a square, a cast to float32: one rounding, c = u |result|;
   - exp, log, sqrt, rsqrt, tanh, erf, sigmoid: within ULPS = 4 units in the last place (glibc, NumPy's SIMD loops
     and onnxruntime's MLAS approximations are within that), c = ULPS u |result|;
   - softmax, LayerNorm, RMSNorm, GELU and SiLU are taken apart into those primitives (below); copies, reshapes,
     lookups, max/min, masking and ReLU are exact.
2. Propagation. To first order (second-order terms are O((sqrt(n) u)^2) relative), an output o of the model is off
   by sum_j (d o / d z_j) r_j over every rounding r_j, where z_j is the result the rounding lands on.
3. The probabilistic model of rounding errors (Higham & Mary, "A new approach to probabilistic rounding error
   analysis", SIAM J. Sci. Comput. 41(5), 2019): the roundings are independent with mean zero. Hoeffding's
   inequality then bounds the sum: |o_float32 - o_exact| <= LAMBDA sigma(o), sigma(o)^2 = sum_j (d o / d z_j)^2 c_j^2,
   but with probability 2 exp(-LAMBDA^2 / 2) = 4.6e-11 per element at LAMBDA = 7. (The worst case, every
   rounding at its bound with the sign that hurts, is 50-200x larger on our models: a bound no CPU comes near.)
4. sigma(o) is estimated with the float64 model itself, run on SAMPLES copies of the input at once (the batch
   axis), every primitive's result z replaced by z + xi c, xi ~ N(0, 1) drawn independently for each element of each
   copy: to first order each copy's o is o_exact + N(0, sigma(o)^2), so the copies' root-mean-square deviation s
   estimates sigma(o). s^2 SAMPLES / sigma(o)^2 is chi-square with SAMPLES degrees of freedom: sigma(o) <= CHI s but
   with probability 1e-6, CHI = sqrt(SAMPLES / chi2.ppf(1e-6, SAMPLES)) = 1.642 at 64 copies. Each element's bound
   is LAMBDA CHI s. (A seeded generator: the same bound on every run. A result the copies share, such as T5's
   position bias [1, H, T, T], is perturbed per copy as it broadcasts; the batch axis may be merged with the next,
   as GPT-2's Conv1D views [B, T, D] as [B T, D]; a rounded result without one is refused.)
5. Inputs are exact: the weights are float32 numbers (widened exactly), token ids are integers.

A float32 path that performs these primitives (our graphs mirror the NumPy model step by step; transformers' eager
model is made of the same primitives) is within bound(o) of the float64 value; two such paths are within 2 bound(o)
of each other. `float32_bound(model, select, **inputs)` runs a torch model (transformers') in float64 and returns
the exact value and the bound of each element of select(outputs).
"""
from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

U = 2.0 ** -24          # float32's unit roundoff
ULPS = 4                # the accuracy of exp, erf, tanh, rsqrt... on every kernel we run
LAMBDA = 7.0            # Hoeffding: 2 exp(-LAMBDA^2 / 2) = 4.6e-11, the chance one element exceeds its bound
SAMPLES = 64            # copies of the input that estimate each element's sigma
CHI = 1.642             # sqrt(SAMPLES / scipy.stats.chi2.ppf(1e-6, SAMPLES)): sigma <= CHI s but once in 1e6
CHIS = {SAMPLES: CHI, 16: 3.321}   # the same for fewer copies (a wider bound, a quarter of the work)

# results that are exact: copies, views, lookups, selections, masking, sign flips, max/min
EXACT = {"view", "reshape", "transpose", "permute", "contiguous", "clone", "expand", "expand_as", "unsqueeze",
         "squeeze", "flatten", "unflatten", "narrow", "select", "getitem", "index_select", "gather", "embedding",
         "cat", "stack", "split", "chunk", "unbind", "masked_fill", "where", "tril", "triu", "neg", "abs", "relu",
         "dropout", "max", "min", "amax", "amin", "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "repeat",
         "repeat_interleave", "roll", "flip", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
         "new_full", "new_empty", "detach", "type_as", "t", "split_with_sizes", "movedim", "pad", "index", "to",
         "double", "float", "type", "view_as", "reshape_as", "broadcast_to", "diagonal", "masked_select", "setitem", "get"}
ROUNDED = {"add", "sub", "mul", "div", "truediv", "rsub", "square", "pow", "true_divide", "multiply", "subtract",
           "reciprocal"}
TRANSCENDENTAL = {"exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "sin", "cos", "log1p", "expm1"}
DOTS = {"matmul", "bmm", "mm", "linear", "einsum", "baddbmm", "addmm"}
REDUCED = {"matmul", "bmm", "mm", "linear"}   # the products a fast mode's bound takes in its reduced type


class _Rounding(TorchFunctionMode):
    """Replaces each primitive's result z by z + xi c: xi ~ N(0, 1) for each element of each of the batch's copies,
    c the root-sum-square bound of the roundings that land on it."""

    def __init__(self, copies: int, seed: int = 0, products: float | None = None):
        """products: the unit roundoff of a reduced type the run's matrix products run in (a fast mode,
        `reduced_bound`: `reduced_product`); None: float32, as every other primitive."""
        super().__init__()
        self.copies, self.generator = copies, torch.Generator().manual_seed(seed)
        self.products = products

    def term(self, z, c):
        c = torch.nan_to_num(torch.as_tensor(c, dtype=z.dtype), nan=0.0, posinf=0.0, neginf=0.0)   # masked: -inf
        if z.ndim == 0 or z.shape[0] % self.copies and z.shape[0] != 1:
            if not c.any():
                return z
            raise ValueError(f"float32 bound: a rounded result of shape {tuple(z.shape)} has no batch axis; pass "
                             "the model inputs it is made from (position_ids...) with one")
        shape = (self.copies, *z.shape[1:]) if z.shape[0] == 1 else z.shape    # [1, ...]: shared, broadcast per copy
        return torch.addcmul(z, torch.randn(shape, generator=self.generator, dtype=z.dtype), c)

    def rounded(self, z, ulps=1):
        return self.term(z, ulps * U * z.abs())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        key = name.strip("_").removesuffix("_")
        if name.startswith("__r") and key[1:] in ROUNDED | {"matmul"}:
            key = key[1:]
        tensors = [x for x in args if isinstance(x, torch.Tensor)]
        if key in ("to", "float", "type") and tensors and tensors[0].dtype == torch.float64 and \
                (key == "float" or torch.float32 in (*args[1:], kwargs.get("dtype"))):
            x = tensors[0]
            if not self.batched(x) and torch.equal(x, x.float().double()):
                return x * 1     # a model constant float32 already holds (RoPE's inverse frequencies): cast exactly
            return self.rounded(x * 1)                   # the model's own float32 casts: charged, kept in float64
        if not tensors or tensors[0].dtype != torch.float64:
            return func(*args, **kwargs)
        if key == "softmax":
            return self.softmax(tensors[0], kwargs.get("dim", args[1] if len(args) > 1 else -1))
        if key == "layer_norm":
            return self.layer_norm(*args, **kwargs)
        if key == "gelu":
            return self.gelu(tensors[0], kwargs.get("approximate", "none"))
        if key == "silu":
            x = tensors[0]
            return self.rounded(x * self.rounded(torch.sigmoid(x), ULPS))
        if self.products is not None and key in REDUCED and (self.batched(args[0]) or self.batched(args[1])):
            return self.reduced_product(key, args, kwargs)
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float64 or not tensors or key in EXACT:
            return out   # constants, integers, exact results, what the model computes in float32 on purpose (T5's buckets)
        if key in DOTS:
            return self.term(out, self.dot(key, args, kwargs))
        if key in ("sum", "mean"):
            n = tensors[0].numel() // max(1, out.numel())
            return self.term(out, U * (math.sqrt(n) + 1) * func(tensors[0].abs(), *args[1:], **kwargs))
        if key in ROUNDED:
            return self.rounded(out)
        if key in TRANSCENDENTAL:
            return self.rounded(out, ULPS)
        raise NotImplementedError(f"float32 bound: no rule for {name!r}; give it one in tests/float32.py")

    def batched(self, x) -> bool:
        """Whether x is the run's data, one per copy (its first axis the copies'), not a constant or position table."""
        return isinstance(x, torch.Tensor) and x.ndim > 0 and x.shape[0] == self.copies

    def reduced_product(self, key, args, kwargs):
        """A product of the run's data in the reduced type (graphs/reduced.py: operands cast to it, the result cast
        back; a linear layer's bias added after, in float32). Its roundings, independent with mean zero (point 3):
        - each operand's elements rounded to the reduced type, |d| <= u: an operand of the run's data (batched) is
          perturbed itself, each copy's elements independently (so what the roundings share downstream is kept); a
          shared one (a weight) through the product, the root-sum-square of its n roundings' terms,
          u sqrt(sum_i (a_i w_i)^2);
        - the sum in float32 (onnxruntime's CPU float16 MatMul was within 2 float16 units in the last place of a
          float32-accumulating emulation at n = 64-8192; cuBLAS's float16 GEMM with 32F compute likewise):
          U (sqrt(n) + 1) sum_i |a_i w_i| <= U (sqrt(n) + 1) sqrt(n) sqrt(sum_i (a_i w_i)^2) (Cauchy-Schwarz);
        - the result rounded to the reduced type, u |result|; the bias, one float32 rounding."""
        u, a, b = self.products, args[0], args[1]
        bias = (args[2] if len(args) > 2 else kwargs.get("bias")) if key == "linear" else None
        turn = (lambda m: m.T) if key == "linear" else (lambda m: m)   # noqa: E731  linear: x W^T

        def rounded_operand(x):
            return torch.addcmul(x, torch.randn(x.shape, generator=self.generator, dtype=x.dtype), u * x.abs()) \
                if self.batched(x) else x
        product = rounded_operand(a) @ turn(rounded_operand(b))
        squares = (a * a) @ turn(b * b)                                   # sum_i (a_i b_i)^2
        n = a.shape[-1]
        c2 = (U * (math.sqrt(n) + 1) * math.sqrt(n)) ** 2 * squares + (u * product.abs()) ** 2
        for x in (a, b):
            if not self.batched(x):
                c2 = c2 + u * u * squares
        out = self.term(product, c2.sqrt())
        return out if bias is None else self.rounded(out + bias)

    @staticmethod
    def dot(key, args, kwargs):
        if key == "einsum":
            eq, ops = args[0], [x for x in args[1:] if isinstance(x, torch.Tensor)] or list(args[1])
            n = torch.einsum(eq, *[torch.ones_like(x) for x in ops]).max().item()     # terms per result
            return U * (math.sqrt(n) + 1) * torch.einsum(eq, *[x.abs() for x in ops])
        if key == "linear":
            x, w = args[0], args[1]
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            n = w.shape[-1] + (b is not None)
            return U * (math.sqrt(n) + 1) * (x.abs() @ w.abs().T + (b.abs() if b is not None else 0))
        if key in ("baddbmm", "addmm"):
            c, a, b = args[:3]
            return U * (math.sqrt(a.shape[-1] + 1) + 1) * (c.abs() + a.abs() @ b.abs())
        a, b = args[0], args[1]
        return U * (math.sqrt(a.shape[-1]) + 1) * (a.abs() @ b.abs())

    # ---- composites, taken apart into primitives (each call below bypasses the mode: the terms are explicit) ----
    def mean(self, x, dims):
        n = math.prod(x.shape[d] for d in dims)
        return self.term(x.mean(dims, keepdim=True), U * (math.sqrt(n) + 1) * x.abs().mean(dims, keepdim=True))

    def softmax(self, x, dim):
        shifted = self.rounded(x - x.amax(dim, keepdim=True))
        e = self.rounded(torch.exp(shifted), ULPS)
        n = x.shape[dim]
        s = self.term(e.sum(dim, keepdim=True), U * math.sqrt(n) * e.abs().sum(dim, keepdim=True))
        return self.rounded(e / s)

    def layer_norm(self, x, shape, weight=None, bias=None, eps=1e-5):
        dims = tuple(range(-len(shape), 0))
        d = self.rounded(x - self.mean(x, dims))
        v = self.rounded(self.mean(self.rounded(d * d), dims) + eps)
        y = self.rounded(d * self.rounded(torch.rsqrt(v), ULPS))
        if weight is not None:
            y = self.rounded(y * weight)
        return self.rounded(y + bias) if bias is not None else y

    def gelu(self, x, approximate):
        if approximate == "tanh":
            inner = self.rounded(x + self.rounded(0.044715 * self.rounded(x * self.rounded(x * x))))
            f = self.rounded(torch.tanh(self.rounded(math.sqrt(2 / math.pi) * inner)), ULPS)
        else:
            f = self.rounded(torch.erf(self.rounded(x * 2 ** -0.5)), ULPS)
        return self.rounded(self.rounded(0.5 * x) * self.rounded(1 + f))


def reduced_bound(model: torch.nn.Module, select, unit: float, samples: int = SAMPLES, **inputs
                  ) -> tuple[np.ndarray, np.ndarray]:
    """float32_bound of a fast mode (model/precision.py): the products of the run's data (an operand one per copy) in
    a reduced type of unit roundoff `unit` (float16: 2^-11; bfloat16: 2^-8; _Rounding.reduced_product), everything
    else float32 (softmax, norms, sums, products of constants such as RoPE's angles, which transformers computes with
    autocast off and graphs/reduced.py leaves in float32)."""
    return float32_bound(model, select, products=unit, samples=samples, **inputs)


def float32_bound(model: torch.nn.Module, select, products: float | None = None, samples: int = SAMPLES, **inputs
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(exact value, bound) of each element of select(model(**inputs)), as float64 arrays. The inputs hold one text
    (batch axis first, of size 1); select(outputs) returns a tensor whose first axis is the batch. The model runs in
    float64 (a copy; its float32 weights widen exactly), once as it is and once on `samples` perturbed copies (the
    module's docstring; a number of CHIS). products: reduced_bound's unit."""
    exact = copy.deepcopy(model).double().eval()
    with torch.inference_mode():
        value = select(exact(**inputs)).numpy()
        assert value.shape[0] == 1, "select(outputs) keeps the batch axis first"
        batch = {k: v.repeat(samples, *[1] * (v.ndim - 1)) if isinstance(v, torch.Tensor) else v
                 for k, v in inputs.items()}
        with _Rounding(samples, products=products):
            runs = select(exact(**batch)).numpy()
    s = np.sqrt(((runs - value) ** 2).mean(axis=0))
    return value[0], LAMBDA * CHIS[samples] * s


def assert_within(actual, exact: np.ndarray, bound: np.ndarray, name: str = "") -> float:
    """|actual - exact| <= bound, element by element; returns the largest |actual - exact| / bound (for messages)."""
    err = np.abs(np.asarray(actual, np.float64) - exact)
    assert err.shape == bound.shape, (name, err.shape, bound.shape)
    over = err > bound
    worst = np.unravel_index(int(np.argmax(err - bound)), err.shape)
    assert not over.any(), (f"{name}: {int(over.sum())} of {err.size} elements beyond their float32 bound; worst at "
                            f"{worst}: {err[worst]:.3g} > {bound[worst]:.3g}")
    return float((err / np.where(bound > 0, bound, np.inf)).max())
