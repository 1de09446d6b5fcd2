"""Independent references for the parity tests: attention written out plainly, as textbooks write it, apart from the
package's one implementation (model/attention.attention), so that a test comparing the two compares two codes."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np

from attnscope.model.functional import AttentionStages, score_scale, soft_cap, softmax
from attnscope.model.precision import scalar


def attention_stages(q: np.ndarray, k: np.ndarray, mask: np.ndarray | None = None, scale: float | None = None,
                     softcap: float = 0.0) -> AttentionStages:
    """The steps from queries and keys to attention probabilities.

    q: [..., Tq, d], k: [..., Tk, d], mask: additive, broadcastable to [..., Tq, Tk]. scale: what the scores are
    multiplied by (score_scale; None: 1 / sqrt(d)). softcap: the scaled scores are soft-capped (soft_cap, Gemma 2)
    before the mask, as part of `scaled`.
    """
    scores = q @ np.swapaxes(k, -1, -2)                                   # [..., Tq, Tk]
    scaled = scores * (scalar(1.0 / np.sqrt(q.shape[-1])) if scale is None else scale)
    scaled = soft_cap(scaled, softcap)                                    # cap * tanh(scaled / cap), or as it was
    masked = scaled if mask is None else scaled + mask
    return AttentionStages(scores, scaled, masked, softmax(masked, axis=-1))


def scaled_dot_product_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                                 mask: np.ndarray | None = None,
                                 temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q k^T / sqrt(d) + mask) v. Returns (output [..., Tq, dv], weights [..., Tq, Tk])."""
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension (d_head); got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys; got {k.shape[-2]} and {v.shape[-2]}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    probs = attention_stages(q, k, mask, score_scale(SimpleNamespace(d_head=q.shape[-1], temperature=temperature))).probs
    return probs @ v, probs


def greedy_under_policy(rt, ids: list[int], n: int, policy):
    """Our side of a KV-policy parity check: n greedy tokens after ids under `policy` (runtime/generation.Generator),
    past an end-of-text token too (n tokens, as transformers runs them) -> (the generator, each step's next-token
    logits [n, vocab] in float64)."""
    from attnscope.runtime.generation import Generator, Sampling

    gen = Generator(rt, ids, Sampling(greedy=True), n, policy=policy)
    gen.prefill()
    logits = []
    for _ in range(n):
        logits.append(gen._logits.astype(np.float64))
        next(gen)
        gen.stop_reason = None
    return gen, np.stack(logits)


def hf_greedy_masked(hf, ids: list[int], n: int, hidden, window: int = 0, dtype=None):
    """transformers' eager model generating n tokens greedily with the keys `hidden(T)` hides ([T, T] bool, True =
    hidden) masked by a 4-D additive attention mask. With window 0, the prompt once and then a token at a time on
    transformers' DynamicCache, each step's mask its query's row; window > 0 (a model with local layers, Gemma 3:
    their cache keeps only the window) the whole sequence run again for each token, with a mask per layer type, the
    local layers' with their sliding window added. Returns (tokens, the logits [n, V] that chose them)."""
    import torch

    dtype = dtype or next(hf.parameters()).dtype

    def additive(m):
        return torch.zeros(m.shape, dtype=dtype).masked_fill(torch.tensor(m), torch.finfo(dtype).min)[None, None]

    def masks(T: int, rows: slice):
        distance = np.subtract.outer(np.arange(T), np.arange(T))[rows]
        masked = hidden(T)[rows] | (distance < 0)
        if not window:
            return additive(masked)
        return {"full_attention": additive(masked), "sliding_attention": additive(masked | (distance >= window))}

    seq, tokens, rows, cache = list(ids), [], [], None
    # the decoding cache's keyword: `cache` from transformers 5.x (`past_key_values`, deprecated there, goes in 5.40)
    key = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.inference_mode():
        for _ in range(n):
            T = len(seq)
            if window:
                out = hf(input_ids=torch.tensor([seq]), attention_mask=masks(T, slice(None)), use_cache=False,
                         logits_to_keep=1)
            else:
                new = seq if cache is None else seq[-1:]
                out = hf(input_ids=torch.tensor([new]), attention_mask=masks(T, slice(T - len(new), T)),
                         use_cache=True, logits_to_keep=1, **{key: cache})
                cache = getattr(out, key)
            logits = out.logits[0, -1]
            rows.append(logits.double().numpy())
            tokens.append(int(logits.argmax()))
            seq.append(tokens[-1])
    return tokens, np.stack(rows)


class _PlainMaps:
    """NumPy, for gguf's reader, except that np.memmap gives a plain ndarray view of the mapping: the reader slices it
    twice per string of the vocabulary, and a memmap's slices cost ~3x a plain array's (Gemma 3's 262,144 tokens:
    its parse 15.5 s -> 6.1 s; every field and tensor the same)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def memmap(*args, **kwargs):
        return np.memmap(*args, **kwargs).view(np.ndarray)


def hf_from_gguf(gguf, cache, tokenizer: bool = False):
    """transformers' own reading of a GGUF file (its GGUF loader parses the file with gguf's reader for the config,
    the weights and the tokenizer: ~15 s each on 2 cores, one parse shared here), eager attention, float32: the
    independent reference of the zoo's GGUF models. The first reader keeps what transformers read (its state dict and
    config written by safetensors and transformers, its tokenizer by save_pretrained: our code touches none of it;
    transformers' save_pretrained refuses a GGUF-loaded model) in `cache`, so the suite's later readers and pytest
    processes read it in a fraction of a second; read back, its logits and attentions equal the GGUF-read model's bit
    for bit. -> the model, or (tokenizer, model) with `tokenizer`."""
    import contextlib
    import tempfile
    from pathlib import Path

    import gguf as gguf_
    import torch
    import transformers

    gguf, cache = Path(gguf), Path(cache)
    kept = cache / f"transformers-{gguf.stem}-{gguf.stat().st_size}"
    if (kept / "model.safetensors").exists():
        model = transformers.AutoModelForCausalLM.from_pretrained(kept, attn_implementation="eager",
                                                                  dtype=torch.float32).eval()
        return (transformers.AutoTokenizer.from_pretrained(kept), model) if tokenizer else model
    read, parsed = gguf_.GGUFReader, {}

    def read_once(file, *args, **kwargs):
        key = (str(file), args, tuple(sorted(kwargs.items())))
        if key not in parsed:
            module, real = gguf_.gguf_reader, gguf_.gguf_reader.np
            module.np = _PlainMaps()       # the same arrays, parsed 2.5x faster
            try:
                parsed[key] = read(file, *args, **kwargs)
            finally:
                module.np = real
        return parsed[key]

    gguf_.GGUFReader = read_once
    try:
        tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                  attn_implementation="eager", dtype=torch.float32)
    finally:
        gguf_.GGUFReader = read
    with contextlib.suppress(OSError):      # a read-only cache: every reader parses the GGUF
        from safetensors.torch import save_file
        tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".hf-"))
        model.config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tied = model.config.tie_word_embeddings
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")},
                  tmp / "model.safetensors", metadata={"format": "pt"})
        tmp.rename(kept)
    return (tok, model.eval()) if tokenizer else model.eval()
