"""Attention at the lengths models read (issue 48): time and peak memory of a long text's layer-by-layer run, as a
fraction of this machine's FLOP bound (numpy's sgemm measured in the same run), and the time of a question asked
after it (exact rows, a tile), each length in a fresh process.

    .venv/bin/python bench/long_context.py                          # gemma3 4k..32k, smollm2 and l1b 4k and 8k
    .venv/bin/python bench/long_context.py --models gemma3 --lengths 30000   # the issue's 30,000-token request
    .venv/bin/python bench/long_context.py --models gemma3 --lengths 30000 --reference   # + float64 rows (minutes)
    .venv/bin/python bench/long_context.py --models l1b --lengths 32768 --resolution 0   # 134 TFLOP: tens of min
    .venv/bin/python bench/long_context.py --models smollm2 --lengths 4096 --denormals both  # runs keeping denormals

Each run is the issue's request on the model's runtime (runtime/layerwise.py, what POST /api/attention runs for a
long text): every head's rows (the summaries), every head's overview at resolution 512, and the full rows of 6
queries of 4 layers (local and global ones on Gemma 3), in a fresh process whose peak resident memory (VmHWM) is
reported. work: runtime/capabilities.forward_flop (block weights, each head's visible query-key pairs), the LM head
at the last position only (the request asks no predictions: runtime/blocks.final_parts); bound: that work at the sgemm rate (4096^3, float32, measured before each run with the same
threads); fraction = bound / time. Checkpoints are kept as a server keeps them (runtime/blocks.checkpoint_spacing
against half its default result cache: e.g. every layer's at 4k on Gemma 3, one in 16 layers at 32k on l1b).
rows / tile: a question after the run, recomputed from its nearest checkpoint: the full rows of one query of a
global layer's every head, and a 256 x 256 tile.
l1b: a random checkpoint of Llama 3.2 1B's exact shape in bfloat16 (bench/checkpoints.llama, written once into
ATTNSCOPE_CACHE/checkpoints/l1b-bfloat16, 2.5 GB), its byte tokenizer reading the same English words.
pool TFLOP: the overview's pooling products (pool_flop), which the work leaves out; +pool: the fraction with them.
With 64-wide heads at resolution 512 they were more than the attention's own work (l1b at 32k: ~190 TFLOP against a
134 TFLOP forward) until a block over more than 256 cells gathered its keys by cells instead (runtime/blocks.py
CELLS_GATHERED): --resolution 0 measures the summaries alone.
--reference: transformers' Gemma 3 from the same GGUF in float64, its attention replaced (RECIPES.md 15) by one that
computes the same rows one block of queries at a time (no [T, T]), logits at the last position only: the largest
difference of the rows and whether the next-token top-1 agrees. Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYERS = {"gemma3": (0, 5, 8, 17), "smollm2": (0, 10, 20, 29), "l1b": (0, 5, 10, 15)}  # gemma3: 5, 17 global
DEFAULT = [("gemma3", 4096), ("gemma3", 8192), ("gemma3", 16384), ("gemma3", 32768),
           ("smollm2", 4096), ("smollm2", 8192), ("l1b", 4096), ("l1b", 8192)]     # l1b at 32k: the line above


def spec_of(model_id: str):
    """The zoo's model, or l1b: the random Llama 3.2 1B-shaped bf16 folder (written once)."""
    from attnscope.sources import zoo
    from attnscope.sources.resolve import resolve
    from bench.common import CACHE
    if model_id != "l1b":
        return zoo.get(model_id)
    from bench.checkpoints import llama
    return resolve(f"l1b={llama(CACHE / 'checkpoints' / 'l1b-bfloat16', 'l1b', 'bfloat16')}")


def server_spacing(cfg, T: int) -> int:
    """How many layers apart a server with default settings keeps a T-token run's checkpoints."""
    from attnscope.analyses.attention import CHECKPOINTS_SHARE
    from attnscope.app.settings import Settings
    from attnscope.runtime.blocks import checkpoint_spacing
    st = Settings()
    return checkpoint_spacing(cfg, T, st.checkpoint_every, st.cache_mb * 2**20 * CHECKPOINTS_SHARE)


def pool_flop(rt, T: int, R: int, group_mb: float) -> float:
    """The overview's pooling products in a run's attend graphs (graphs/reductions.py thumbnail: each block's
    probabilities times the pooling columns of the cells its keys touch, [Tq, Tk] x [Tk, d - c], then the cells of its
    queries times that): work forward_flop does not count. A block over more than CELLS_GATHERED cells gathers each
    cell's keys instead (no product: only its queries' cells count); with the product alone, at resolution 512 on
    64-wide heads it was ~4x the attention's own work (2 R against 4 d_head FLOP a visible query-key pair)."""
    from attnscope.analysis.thumbnails import block_edges
    from attnscope.runtime.blocks import CELLS_GATHERED, blocked, query_blocks
    if not R or T <= R:
        return 0.0
    edges, cfg = np.asarray(block_edges(T, R)), rt.cfg
    cells = lambda a, b: (int(np.searchsorted(edges, a, "right") - 1), int(np.searchsorted(edges, b - 1, "right")))  # noqa: E731
    total = 0
    for layer in range(cfg.n_layers):
        window = rt.model.blocks[layer].window or 0
        split = blocked(T, group_mb * 2**20)
        plan = query_blocks(T, cfg.causal, window, group_mb * 2**20) if split else [(0, T, 0, T)]
        for q0, q1, k0, k1 in plan:
            (a, b), (c, d) = cells(q0, q1), cells(k0, k1)
            keys = 0 if split and d - c > CELLS_GATHERED else k1 - k0
            total += 2 * (q1 - q0) * (d - c) * (keys + (b - a))
    return float(total * cfg.n_heads)


def sgemm_rate(threads: int) -> float:
    """FLOP/s of a 4096^3 float32 product (numpy's BLAS, `threads` threads), best of 3."""
    n = 4096
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = min(_timed(lambda: a @ a) for _ in range(3))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def ids_of(rt, T: int) -> list[int]:
    """T token ids of English text (bench.common's words, in turn)."""
    from bench.common import WORDS
    ids = rt.encode(" ".join(WORDS[i % len(WORDS)] for i in range(T))).ids
    assert len(ids) >= T, (len(ids), T)
    return ids[:T]


def queries_of(T: int) -> tuple[int, ...]:
    return (0, 1, T // 3, T // 2, T - 2, T - 1)


def child(model_id: str, T: int, out: Path | None) -> None:
    """One run in this (fresh) process; prints a JSON line."""
    from attnscope.model.weights import state_dict
    from attnscope.runtime import Runtime
    from attnscope.runtime.capabilities import forward_flop
    from attnscope.runtime.layerwise import Want
    from bench.common import CACHE

    from attnscope.runtime import sessions
    sessions.FLUSH_DENORMALS = os.environ.get("DENORMALS", "flushed") == "flushed"
    rt = Runtime(spec_of(model_id), cache_dir=CACHE, threads=int(os.environ.get("THREADS", "2")))
    every = server_spacing(rt.cfg, T)
    lw = rt.layerwise(checkpoint_every=every)
    lw.open()
    enc = rt.encode_ids(ids_of(rt, T))
    H, layers = rt.cfg.n_heads, LAYERS[model_id]
    R = int(os.environ.get("RESOLUTION", "512"))
    want = Want(layers, tuple(range(H)), resolution=R, queries=queries_of(T), logprobs=False)   # no predictions
    t0 = time.perf_counter()
    res = lw.forward(enc, want=want)
    seconds = time.perf_counter() - t0
    glob = next(layer for layer in layers if not rt.model.blocks[layer].window)
    rows_s = _timed(lambda: lw.recompute(res, Want((glob,), tuple(range(H)), queries=(T // 2,))))
    tile_s = _timed(lambda: lw.recompute(res, Want((glob,), tuple(range(H)), tile=((T - 256, T), (T - 512, T - 256)))))
    blocks = sum(int(a.size) for name, a in state_dict(rt.model).items() if name.startswith("blocks."))
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) * 1024
    if out is not None:
        np.savez(out, ids=np.asarray(enc.ids), top=res.next_tokens[0].id,
                 **{f"rows_{layer}": res.asked.rows[layer] for layer in layers})
    flop = forward_flop(rt.cfg, blocks, T) - 2.0 * (T - 1) * rt.cfg.vocab_size * rt.cfg.d_model   # LM head: last only
    print(json.dumps({"model": model_id, "T": T, "seconds": seconds, "flop": flop,
                      "peak": hwm, "rows_s": rows_s, "tile_s": tile_s, "top": res.next_tokens[0].id,
                      "every": every, "pool": pool_flop(rt, T, R, lw.group_mb)}))


def reference(model_id: str, saved: Path) -> tuple[float, bool]:
    """transformers' model from the same GGUF in float64 (reference_rows) against a run's saved rows: (largest row
    difference, top-1 agrees)."""
    got = np.load(saved)
    layers, T = LAYERS[model_id], len(got["ids"])
    kept, logits = reference_rows(model_id, got["ids"], layers, queries_of(T))
    diff = max(float(np.abs(got[f"rows_{layer}"] - kept[layer]).max()) for layer in layers)
    return diff, int(logits.argmax()) == int(got["top"])


def reference_rows(model_id: str, ids, layers, queries, block: int = 256, model=None
                   ) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """transformers' model from the same GGUF in float64, its attention computed one block of queries at a time
    (RECIPES.md 15: no [T, T]; each block over the keys its queries may see), keeping the rows of `queries` at
    `layers` ({layer: [H, Q, T]}), and the next-token logits at the last position [V]. model: transformers' reading
    of the file already loaded (its attention is replaced); None: tests/references.hf_from_gguf's.
    tests/test_long_context.py holds a long run to it at a short length."""
    import torch
    from transformers import AttentionInterface

    from attnscope.sources import zoo
    from bench.common import CACHE

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    T, queries = len(ids), list(queries)
    kept: dict[int, np.ndarray] = {}

    def rows(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, softcap=None,
             **kw):
        B, H, _, D = query.shape
        rep = H // key.shape[1]
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
        out = torch.empty(B, T, H, D, dtype=query.dtype)
        layer = module.layer_idx
        for q0 in range(0, T, block):
            q1 = min(T, q0 + block)
            k0 = max(0, q0 - sliding_window + 1) if sliding_window else 0     # keys before k0 or from q1: weight 0
            s = query[:, :, q0:q1] @ key[:, :, k0:q1].transpose(-1, -2) * scaling
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            i, j = torch.arange(q0, q1)[:, None], torch.arange(k0, q1)[None, :]
            hide = j > i
            if sliding_window:
                hide |= i - j >= sliding_window
            p = torch.softmax(s.masked_fill(hide, float("-inf")), -1)
            out[:, q0:q1] = (p @ value[:, :, k0:q1]).transpose(1, 2)
            if layer in layers:
                for n, q in enumerate(queries):
                    if q0 <= q < q1:
                        kept.setdefault(layer, np.zeros((H, len(queries), T)))[:, n, k0:q1] = p[0, :, q - q0].numpy()
        return out, None

    AttentionInterface.register("rows", rows)
    if model is None:
        from tests.references import hf_from_gguf             # the suite's reading, kept in the cache after the first
        model = hf_from_gguf(zoo.gemma3_path(None, CACHE) if model_id == "gemma3" else zoo.smollm2_path(None), CACHE)
    model.set_attn_implementation("rows")
    model = model.eval().double()
    with torch.inference_mode():
        logits = model(input_ids=torch.from_numpy(np.asarray(ids, np.int64)[None]), logits_to_keep=1).logits[0, -1]
    return kept, logits.numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--lengths", nargs="*", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--resolution", type=int, default=512, help="every head's overview at this resolution (0: none, "
                    "the summaries alone): its pooling is a [Tq, Tk] x [Tk, R] product per block, which the work "
                    "column does not count")
    ap.add_argument("--reference", action="store_true", help="float64 rows from transformers (minutes at 30k)")
    ap.add_argument("--denormals", choices=("flushed", "kept", "both"), default="flushed",
                    help="flushed: as served (runtime/sessions.py FLUSH_DENORMALS); kept: runs that keep them; both: "
                         "each run twice, kept then flushed, and the time's ratio")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--save", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), args.save)
    runs = [(m, T) for m, T in DEFAULT if (args.models is None or m in args.models)]
    if args.lengths:
        runs = [(m, T) for m in dict.fromkeys(m for m, _ in runs) for T in args.lengths]
    os.environ["THREADS"], os.environ["RESOLUTION"] = str(args.threads), str(args.resolution)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), {args.threads} threads, overview at resolution {args.resolution}")
    print(f"{'model':8} {'tokens':>7} {'denormals':>9} {'time s':>8} {'TFLOP':>7} {'sgemm GF/s':>10} {'of bound':>8} "
          f"{'peak GB':>8} {'rows s':>7} {'tile s':>7} {'every':>5} {'pool TFLOP':>10} {'+pool':>6}")
    arms = ("kept", "flushed") if args.denormals == "both" else (args.denormals,)
    times: dict[tuple, float] = {}
    for model_id, T, arm in ((m, T, arm) for m, T in runs for arm in arms):
        os.environ["DENORMALS"] = arm
        rate = sgemm_rate(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            saved = Path(tmp) / "rows.npz"
            cmd = [sys.executable, __file__, "--child", model_id, str(T)] + (["--save", str(saved)] if args.reference
                                                                            else [])
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if out.returncode != 0:
                print(f"{model_id} {T}: failed\n{out.stderr[-3000:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{model_id:8} {T:>7} {arm:>9} {r['seconds']:>8.1f} {r['flop'] / 1e12:>7.2f} {rate / 1e9:>10.0f} "
                  f"{r['flop'] / r['seconds'] / rate:>8.0%} {r['peak'] / 2**30:>8.2f} {r['rows_s']:>7.2f} "
                  f"{r['tile_s']:>7.2f} {r['every']:>5} {r['pool'] / 1e12:>10.2f} "
                  f"{(r['flop'] + r['pool']) / r['seconds'] / rate:>6.0%}", flush=True)
            times[model_id, T, arm] = r["seconds"]
            if arm == "flushed" and (model_id, T, "kept") in times:
                print(f"  flushing denormals: {times[model_id, T, 'kept'] / r['seconds']:.2f}x faster "
                      f"(rows s and tile s above: the questions after the run)", flush=True)
            if args.reference:
                diff, top = reference(model_id, saved)
                print(f"  float64 reference: rows within {diff:.2e}, next-token top-1 {'equal' if top else 'DIFFERS'}")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
