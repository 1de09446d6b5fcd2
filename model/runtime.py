"""Text in, attention out: tokenizer, masks, onnxruntime sessions (or the NumPy reference), trimming.

    rt = load("minilm")                       # or Runtime(zoo.get("minilm"), cache_dir=...)
    res = rt("The cat sat on the mat.")       # one text -> one AttentionResult
    res.tokens, res.attentions                # [L, H, T, T], rows sum to 1
    res.summary()["previous_token_mass"]      # [L, H]

The ONNX graph is built from the NumPy model on first use and cached on disk (in `cache_dir`, which the
caller chooses) under a key made of the weights and the exporter's source, so a change to either rebuilds it.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple, Sequence

import numpy as np

from . import export as _export
from . import masks as M
from . import stats
from . import transformer as _transformer
from . import zoo
from .functional import softmax
from .tokens import is_byte_level, readable
from .weights import state_dict
from .zoo import ModelSpec

Engine = Literal["onnx", "numpy"]
DEFAULT_CACHE = Path.home() / ".cache" / "attnscope"
log = logging.getLogger("attnscope")


def default_providers() -> list[str]:
    """CUDA first where onnxruntime-gpu and a GPU are present, the CPU always."""
    import onnxruntime as ort
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


@dataclass
class Encoding:
    """One tokenised text (or sentence pair), unpadded."""
    ids: list[int]
    type_ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]   # character span in its own text (the pair's second text for segment 1)
    special: list[bool]              # [CLS], [SEP] and the like, added by the tokenizer or typed in the text
    segments: list[int]              # 0 first text, 1 second text, -1 special token
    truncated: bool


class NextToken(NamedTuple):
    """One candidate for the token after the text: readable string, exact id, probability (full softmax)."""
    token: str
    id: int
    prob: float


@dataclass
class AttentionResult:
    """Everything the model computed for one text, trimmed to its own tokens."""
    model: str
    engine: Engine
    provider: str
    causal: bool
    encoding: Encoding
    attentions: np.ndarray               # [L, H, T, T] probabilities, query x key
    hidden: np.ndarray                   # [T, D] final hidden states
    mask: np.ndarray                     # [T, T] the additive mask the model saw (0 or masks.MASKED)
    mask_tokens: list[int] = field(default_factory=list)  # token indices hidden as keys
    stages: dict[str, np.ndarray] | None = None  # transformer.STAGES: x [L, T, D]; q, k, v, ctx [L, H, T, dh];
    #                                              scores, scaled, masked [L, H, T, T]
    seconds: float = 0.0
    next_tokens: list[NextToken] | None = None    # decoders with an LM head: top-k after the last token
    token_logprobs: list[float | None] | None = None  # log p(token_i | tokens before it); None for the first
    next_token_logits: np.ndarray | None = None   # [V] logits for the token after the last one

    @property
    def tokens(self) -> list[str]:
        return self.encoding.tokens

    @property
    def token_ids(self) -> list[int]:
        return self.encoding.ids

    def entropy(self) -> np.ndarray:
        """[L, H, T] entropy of each query row, in nats."""
        return stats.entropy(self.attentions)

    def summary(self) -> dict[str, np.ndarray]:
        """Per-head statistics (stats.HEAD_STATS), each [L, H]."""
        return stats.head_stats(self.attentions)


class Runtime:
    """One model, its tokenizer, and its onnxruntime sessions (built lazily, shared across threads)."""

    def __init__(self, spec: ModelSpec, providers: Sequence[str] | None = None, threads: int = 0,
                 cache_dir: str | Path = DEFAULT_CACHE):
        self.spec = spec
        self.cache_dir = Path(cache_dir)
        self.model = spec.load_model(self.cache_dir)
        self.tokenizer = spec.load_tokenizer(self.cache_dir)
        self.tokenizer.enable_truncation(spec.max_tokens, strategy="longest_first")
        self.byte_level = is_byte_level(self.tokenizer)   # token strings shown through tokens.readable
        self.providers = list(providers) if providers else default_providers()
        self.threads = threads
        self._sessions: dict[bool, object] = {}
        self._lock = threading.Lock()
        self._key: str | None = None
        self._verified: dict[Path, tuple[int, int]] = {}   # graph -> (size, mtime) when its checksum matched
        self._scratch: Path | None = None                  # where graphs go when cache_dir cannot be written
        self._layerwise = None

    @property
    def cfg(self):
        return self.model.cfg

    @property
    def provider(self) -> str:
        """The execution provider the served graph runs on."""
        return self.session().get_providers()[0]

    def __call__(self, text: str, pair: str | None = None, **options) -> AttentionResult:
        """One text (or sentence pair) -> its result; options as in `run`."""
        return self.run([text], [pair], **options)[0]

    # ---- tokenising -------------------------------------------------------------------------
    def encode(self, text: str, pair: str | None = None) -> Encoding:
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text is empty: give at least one non-blank character")
        if pair is not None and not self.spec.pair:
            raise ValueError(f"model {self.spec.id!r} takes a single text, not a sentence pair")
        if pair is not None and not pair.strip():
            raise ValueError("text_pair is blank: leave it out or give at least one non-blank character")
        enc = self.tokenizer.encode(text, pair)
        # special: added by the tokenizer ([CLS], [SEP]), or typed into the text ("[SEP]" becomes id 102 too);
        # an [UNK] standing for real text (an emoji) is not special: its span is not the token's own string
        typed = {i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        own = (text, pair or "")
        special = [bool(m) or (i in typed and own[s or 0][a:b] == tok) for m, i, s, (a, b), tok in
                   zip(enc.special_tokens_mask, enc.ids, enc.sequence_ids, enc.offsets, enc.tokens)]
        tokens = [readable(t) for t in enc.tokens] if self.byte_level else enc.tokens
        return Encoding(enc.ids, enc.type_ids, tokens, [tuple(o) for o in enc.offsets], special,
                        [-1 if s is None else s for s in enc.sequence_ids], bool(enc.overflowing))

    # ---- masks ------------------------------------------------------------------------------
    def build_mask(self, lengths: Sequence[int], causal: bool,
                   mask_tokens: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """One additive mask [B, 1, T, T]: padding + (causal) + user-masked keys.

        A masked key is hidden from every query but itself, so each query keeps at least one key
        (the causal first token would otherwise have none and its row would be undefined).
        """
        B, T = len(lengths), max(lengths)
        keep = np.arange(T)[None, :] < np.asarray(lengths)[:, None]                 # [B, T]
        masked_out = np.zeros((B, 1, T, T), bool)                                # True: hidden from that query
        for b, keys in enumerate(mask_tokens or ()):
            for j in keys or ():
                if not 0 <= j < lengths[b]:
                    raise ValueError(f"mask_tokens index {j} is out of range: this text has {lengths[b]} tokens "
                                     f"(0..{lengths[b] - 1})")
                masked_out[b, 0, :, j] = True
        masked_out &= ~np.eye(T, dtype=bool)
        mask = M.combine(M.padding_mask(keep), M.causal_mask(T)[None, None] if causal else None, masked_out)
        return np.ascontiguousarray(np.broadcast_to(mask, (B, 1, T, T)))

    def token_string(self, token_id: int) -> str:
        """The vocabulary entry of an id, as a person reads it."""
        token = self.tokenizer.id_to_token(int(token_id))
        return readable(token) if self.byte_level else token

    # ---- running ----------------------------------------------------------------------------
    def feeds(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray, lengths: Sequence[int],
              head_mask: np.ndarray | None = None, head_mean: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The ONNX graph's inputs. Head mask defaults keep every head (head_mask 1, head_mean 0);
        given ones are [B|1, L, H] (see functional.ablate_heads)."""
        B, (L, H) = len(ids), (self.cfg.n_layers, self.cfg.n_heads)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self.model.wtt is not None:
            feeds["token_type_ids"] = types
        for name, value, default in (("head_mask", head_mask, 1.0), ("head_mean", head_mean, 0.0)):
            value = np.full((B, L, H), default, np.float32) if value is None else np.asarray(value, np.float32)
            if value.ndim != 3 or value.shape[1:] != (L, H) or value.shape[0] not in (1, B):
                raise ValueError(f"{name} must be [texts, layers, heads] = [{B}, {L}, {H}]; got shape {value.shape}")
            feeds[name] = np.ascontiguousarray(np.broadcast_to(value, (B, L, H)))
        feeds["lengths"] = np.asarray(lengths, np.int64)
        return feeds

    def run(self, texts: str | Sequence[str], pairs: Sequence[str | None] | None = None, *,
            causal: bool | None = None, mask_tokens: Sequence[Sequence[int]] | None = None,
            engine: Engine = "onnx", stages: bool = False, head_mask: np.ndarray | None = None,
            head_mean: np.ndarray | None = None, top_k: int = 10) -> list[AttentionResult]:
        """Run a batch of texts (padded together) and return one trimmed result per text.

        head_mask, head_mean [B|1, L, H]: ablate heads (functional.ablate_heads); None keeps them all.
        Decoders with an LM head also give the top_k next tokens and every token's log-probability."""
        t0 = time.perf_counter()
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise ValueError("no texts given")
        pairs = list(pairs) if pairs is not None else [None] * len(texts)
        if len(pairs) != len(texts):
            raise ValueError(f"{len(pairs)} pairs for {len(texts)} texts: give one pair (or None) per text")
        encs = [self.encode(t, p) for t, p in zip(texts, pairs)]
        return self.forward(encs, causal=causal, mask_tokens=mask_tokens, engine=engine, stages=stages,
                            head_mask=head_mask, head_mean=head_mean, top_k=top_k, started=t0)

    def encode_ids(self, ids: Sequence[int]) -> Encoding:
        """An Encoding of token ids given directly (a probe of random tokens, say): no text, no offsets."""
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("no token ids given")
        bad = [i for i in ids if not 0 <= i < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside this model's vocabulary (0..{self.cfg.vocab_size - 1})")
        specials = set(self.special_ids())
        return Encoding(ids, [0] * len(ids), [self.token_string(i) for i in ids], [(0, 0)] * len(ids),
                        [i in specials for i in ids], [-1 if i in specials else 0 for i in ids], False)

    def special_ids(self) -> list[int]:
        """Ids of the tokenizer's special tokens ([CLS], <|im_start|>, ...)."""
        return sorted({t.id if hasattr(t, "id") else i for i, t in self.tokenizer.get_added_tokens_decoder().items()
                       if t.special})

    def forward(self, encs: Sequence[Encoding], *, causal: bool | None = None,
                mask_tokens: Sequence[Sequence[int]] | None = None, engine: Engine = "onnx", stages: bool = False,
                head_mask: np.ndarray | None = None, head_mean: np.ndarray | None = None, top_k: int = 10,
                started: float | None = None) -> list[AttentionResult]:
        """Run encoded inputs (padded together); options as in `run`."""
        t0 = time.perf_counter() if started is None else started
        if engine not in ("onnx", "numpy"):
            raise ValueError(f"engine must be 'onnx' or 'numpy'; got {engine!r}")
        causal = self.cfg.causal if causal is None else bool(causal)
        lengths = [len(e.ids) for e in encs]
        B, T = len(encs), max(lengths)
        ids, types = np.zeros((B, T), np.int64), np.zeros((B, T), np.int64)
        for b, e in enumerate(encs):
            ids[b, :lengths[b]], types[b, :lengths[b]] = e.ids, e.type_ids
        mask = self.build_mask(lengths, causal, mask_tokens)
        feeds = self.feeds(ids, types, mask, lengths, head_mask, head_mean)   # checks the head mask's shape
        lm = list(_transformer.LM_OUTPUTS) if self.cfg.lm_head else []

        if engine == "numpy":
            out = self.model(ids, types if self.model.wtt is not None else None, mask, stages=stages,
                             head_mask=head_mask, head_mean=head_mean, lengths=np.asarray(lengths))
            hidden, attn, st, provider = out.hidden, out.attentions, out.stages, "numpy"
            lm_out = {name: getattr(out, name) for name in lm}
        else:
            sess = self.session(stages)
            names = ["hidden", "attentions"] + lm + (list(_transformer.STAGES) if stages else [])
            outs = dict(zip(names, self._run_session(sess, names, feeds)))
            hidden, attn, provider = outs.pop("hidden"), outs.pop("attentions"), sess.get_providers()[0]
            lm_out = {name: outs.pop(name) for name in lm}
            st = outs if stages else None
        seconds = time.perf_counter() - t0

        results = []
        for b, (e, n) in enumerate(zip(encs, lengths)):
            s = None
            if st is not None:
                s = {k: np.ascontiguousarray(v[:, b, ..., :n, :n] if k in _transformer.SQUARE_STAGES
                                             else v[:, b, ..., :n, :]) for k, v in st.items()}
            results.append(AttentionResult(
                self.spec.id, engine, provider, causal, e, np.ascontiguousarray(attn[:, b, :, :n, :n]),
                np.ascontiguousarray(hidden[b, :n]), mask[b, 0, :n, :n].copy(),
                sorted(set(mask_tokens[b])) if mask_tokens and mask_tokens[b] else [], s, seconds))
            if lm_out:
                results[-1].next_token_logits = np.ascontiguousarray(lm_out["next_token_logits"][b])
                results[-1].next_tokens = self.top_tokens(lm_out["next_token_logits"][b], top_k)
                results[-1].token_logprobs = [None] + lm_out["token_logprobs"][b, 1:n].astype(float).tolist()
        return results

    def top_tokens(self, logits: np.ndarray, k: int) -> list[NextToken]:
        """The k most probable next tokens from logits [V], probabilities from the softmax over all V."""
        probs = softmax(np.asarray(logits, np.float64))
        k = max(0, min(int(k), len(probs)))
        top = np.argpartition(-probs, k - 1)[:k] if k else np.array([], int)
        top = top[np.argsort(-probs[top], kind="stable")]
        return [NextToken(self.token_string(i), int(i), float(probs[i])) for i in top]

    _DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}

    def _run_session(self, sess, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """sess.run, with outputs that own their memory. onnxruntime's own outputs are views into its arena, and
        each one kept alive (cached, queued, being sent) grew the arena for good: 32 held 512-token results left
        a server at 2.9 GB idle. Each output is bound to a NumPy buffer of the shape the graph declares (its
        named axes sized from the inputs and the config); one that cannot be sized is copied out."""
        B, T = feeds["input_ids"].shape
        axes = {"batch": B, "tokens": T, "layers": self.cfg.n_layers, "heads": self.cfg.n_heads}
        binding, own = sess.io_binding(), {}
        for key, value in feeds.items():
            binding.bind_cpu_input(key, value)
        declared = {o.name: o for o in sess.get_outputs()}
        for name in names:
            shape = [d if isinstance(d, int) else axes.get(d) for d in declared[name].shape]
            dtype = self._DTYPES.get(declared[name].type)
            if None in shape or dtype is None:
                binding.bind_output(name, "cpu")
                continue
            own[name] = np.empty(shape, dtype)
            binding.bind_output(name, "cpu", 0, dtype, shape, own[name].ctypes.data)
        try:
            sess.run_with_iobinding(binding)
        except Exception:  # noqa: BLE001 - a declared shape that was not the real one: run plainly, copy out
            return [np.array(v) for v in sess.run(names, feeds)]
        values = dict(zip(names, binding.get_outputs()))
        return [own[n] if n in own else np.array(values[n].numpy()) for n in names]

    # ---- ONNX -------------------------------------------------------------------------------
    def cache_key(self) -> str:
        """Hash of the weights and of the exporter's source: either changing rebuilds the graph."""
        if self._key is None:
            h = hashlib.sha256()
            for mod in (_export, _transformer):
                h.update(Path(mod.__file__).read_bytes())
            h.update(repr(self.cfg).encode())
            for name, value in sorted(state_dict(self.model).items()):
                h.update(name.encode())
                h.update(np.ascontiguousarray(value).tobytes())
            self._key = h.hexdigest()[:16]
        return self._key

    def cached_path(self, stages: bool = False) -> Path:
        """Where the exported graph lives in the cache (it may not exist yet)."""
        return self.cache_dir / f"{self.spec.id}{'-stages' if stages else ''}-{self.cache_key()}.onnx"

    def onnx_path(self, stages: bool = False) -> Path:
        """The exported graph, building it (with a progress bar) if it is not cached yet or fails its checksum.
        A cache folder that cannot be written gets the graph in a temporary folder of this process instead."""
        if not self._verified:                      # first look at the cache: clear what killed exports left
            _remove_stale_temporaries(self.cache_dir)
        path = self.cached_path(stages)
        if self._intact(path):
            return path
        if self._scratch is not None and self._intact(self._scratch / path.name):
            return self._scratch / path.name
        try:
            self._build(path, stages)
            return path
        except OSError as e:
            log.warning("cannot write the graph cache %s (%s); building %s in a temporary folder for this "
                        "process (point ATTNSCOPE_CACHE at a writable folder to keep it)", self.cache_dir,
                        e.strerror or type(e).__name__, path.name)
            self._build(self._scratch_dir() / path.name, stages)
            return self._scratch / path.name

    # ---- the graph cache: a file is used only when its checksum matches ----------------------------------
    # Each graph has a sidecar NAME.sha256 with the SHA-256 of its bytes, written after the graph: a graph
    # cut short, bit-flipped or left without its sidecar (a kill between the two) is rebuilt. Temporary files
    # of exports killed half-way (NAME.tmpPID) are removed when the first graph is looked up.
    def _intact(self, path: Path) -> bool:
        try:
            st = path.stat()
        except OSError:
            return False
        stamp = (st.st_size, st.st_mtime_ns)
        if self._verified.get(path) == stamp:
            return True
        try:
            expected = _sidecar(path).read_text().strip()
        except OSError:
            expected = None
        if expected != _sha256(path):
            log.warning("cached graph %s %s; rebuilding", path.name,
                        "has no checksum" if expected is None else "does not match its checksum")
            return False
        self._verified[path] = stamp
        return True

    def _build(self, path: Path, stages: bool) -> None:
        log.info("exporting %s to %s", self.spec.id, path)
        _export.export(self.model, path, stages=stages, desc=self.spec.id)   # written atomically
        tmp = path.with_name(f"{path.name}.sha256.tmp{os.getpid()}")
        tmp.write_text(_sha256(path) + "\n")
        os.replace(tmp, _sidecar(path))
        st = path.stat()
        self._verified[path] = (st.st_size, st.st_mtime_ns)

    def _scratch_dir(self) -> Path:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix=f"attnscope-{os.getpid()}-"))
            weakref.finalize(self, shutil.rmtree, self._scratch, True)
        return self._scratch

    def session(self, stages: bool = False):
        """The onnxruntime session (with or without teaching outputs); a corrupt cached file is rebuilt."""
        sess = self._sessions.get(stages)
        if sess is not None:  # the common case takes no lock: building the other graph can take seconds
            return sess
        with self._lock:
            if stages not in self._sessions:
                self._check_providers()  # a bad option, not a corrupt file: never delete a good graph for it
                path = self.onnx_path(stages)
                try:
                    self._sessions[stages] = self._open(path, stages)
                except Exception as e:  # noqa: BLE001 - onnxruntime raises its own error types
                    log.warning("cached graph %s is unreadable (%s); rebuilding", path.name, type(e).__name__)
                    self._verified.pop(path, None)
                    try:
                        _sidecar(path).unlink(missing_ok=True)
                    except OSError:  # a read-only cache: onnx_path builds it in a temporary folder
                        pass
                    self._sessions[stages] = self._open(self.onnx_path(stages), stages)
            return self._sessions[stages]

    def layerwise(self, checkpoint_every: int = 1, group_mb: float = 256):
        """This model run layer by layer, for texts whose stacked attention is too big (model/layerwise.py)."""
        with self._lock:
            lw = self._layerwise
            if lw is None or (lw.every, lw.group_mb) != (checkpoint_every, group_mb):
                from .layerwise import Layerwise
                self._layerwise = Layerwise(self, checkpoint_every, group_mb)
            return self._layerwise

    def _check_providers(self) -> None:
        import onnxruntime as ort
        available = ort.get_available_providers()
        unknown = [p for p in self.providers if p not in available]
        if unknown:
            raise ValueError(f"execution provider(s) {unknown} are not available in this onnxruntime; "
                             f"available: {available}")

    def _open(self, path: Path, stages: bool = False):
        import onnxruntime as ort
        so = ort.SessionOptions()
        # An arena keeps its peak for good. The stages graph's peak is huge (four [L, H, T, T] outputs: two
        # 512-token runs at once leave ~1.4 GB behind), and its runs are rare: it allocates per run instead.
        # The main graph keeps its arena: without one a 512-token run is 1.8-3x slower (fresh pages every run),
        # and with one run at a time (the server's default) its peak is one run's, reached once.
        so.enable_cpu_mem_arena = not stages
        # Idle intra-op threads spin for a while after each run by default, taking the cores the server's event
        # loop and serialisation need next: off (bench/session_memory.py: Python work right after a run is
        # 1.1-1.5x faster, the run itself no slower).
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = self.threads
        so.log_severity_level = 3
        return ort.InferenceSession(str(path), so, providers=self.providers)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


_TEMPORARY = re.compile(r"\.tmp(\d+)$")


def _remove_stale_temporaries(folder: Path) -> None:
    """Delete NAME.tmpPID files whose process is gone (an export killed half-way leaves 60-90 MB behind), and
    scratch folders of dead processes in the system's temporary folder."""
    for item in [*_glob(folder, "*.tmp*"), *_glob(Path(tempfile.gettempdir()), "attnscope-*-*")]:
        m = _TEMPORARY.search(item.name) or re.match(r"attnscope-(\d+)-", item.name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            shutil.rmtree(item) if item.is_dir() else item.unlink()
            log.info("removed %s, left by a process that is gone", item)
        except OSError:
            pass


def _glob(folder: Path, pattern: str) -> list[Path]:
    try:
        return list(folder.glob(pattern))
    except OSError:
        return []


def load(model_id: str, *, folder: str | Path | None = None, cache_dir: str | Path = DEFAULT_CACHE,
         providers: Sequence[str] | None = None, threads: int = 0) -> Runtime:
    """A zoo model, ready to run: `load("minilm")("The cat sat.")`. `folder` overrides where its files come from."""
    return Runtime(zoo.get(model_id, None if folder is None else Path(folder)), providers, threads, cache_dir)


@functools.cache
def _cast_session():
    """A one-node onnxruntime graph, Cast(float32 -> float16), on the exporter's opset and IR version."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)], "to_float16",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _export.OPSET)])
    proto.ir_version = _export.IR_VERSION
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.enable_cpu_mem_arena = False  # an arena would keep its peak (tens of MB per concurrent cast) for good
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads must not slow the next run
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def to_float16(a: np.ndarray) -> np.ndarray:
    """float32 -> float16, bit for bit what numpy gives, but through onnxruntime's Cast: numpy takes a slow path
    for results below float16's normal range, and a quarter of attention weights land there (358 ms vs 2-13 ms
    for 512 tokens x 72 heads)."""
    return _cast_session().run(None, {"x": np.ascontiguousarray(a, np.float32)})[0]


def head_importance(rt: Runtime, text: str, *, ablation: Literal["zero", "mean"] = "zero", batch: int = 16,
                    pair: str | None = None) -> tuple[np.ndarray, float]:
    """Each head's single-head ablation effect, for every head: [L, H], and the intact run's value.

    Decoders (an LM head): the change in the text's mean token log-prob when that head alone is knocked out
    (negative: the head helps predict this text). Encoders: 1 - cosine similarity of the mean-pooled final
    hidden states (the sentence embedding) with and without the head. The text is run `batch` times at once,
    the batch axis carrying different head masks; the first run of all keeps every head."""
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    enc = rt.encode(text, pair)
    masks = np.ones((L * H + 1, L, H), np.float32)          # row 0 intact, row 1 + l*H + h ablates (l, h)
    masks[1:].reshape(L * H, L * H)[np.arange(L * H), np.arange(L * H)] = 0.0
    values = []
    for start in range(0, len(masks), batch):
        keep = masks[start:start + batch]
        mean = (1.0 - keep) if ablation == "mean" else np.zeros_like(keep)
        for r in rt.forward([enc] * len(keep), head_mask=keep, head_mean=mean, top_k=0):
            if r.token_logprobs is not None:
                values.append(np.mean(r.token_logprobs[1:]) if len(r.token_logprobs) > 1 else 0.0)
            else:
                values.append(r.hidden.mean(axis=0).astype(np.float64))
    if isinstance(values[0], np.ndarray):
        e = np.stack(values)
        cos = e[1:] @ e[0] / (np.linalg.norm(e[1:], axis=1) * np.linalg.norm(e[0]))
        return (1.0 - cos).reshape(L, H), 1.0
    v = np.asarray(values)
    return (v[1:] - v[0]).reshape(L, H), float(v[0])
