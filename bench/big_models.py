"""Big models on this machine: random checkpoints of Llama 3.2 1B's and Llama 3.1 8B's exact published shapes
(bench/checkpoints.py), served by path by a real `attnscope serve`, one server per model; prints each model's start
times (a cold graph cache, then a warm one), the requests' times and the server's peak RSS (VmHWM: the high-water
mark of its resident memory, weight pages included).

    python bench/big_models.py                           # l1b-bf16, l1b-f32, l8b-bf16
    python bench/big_models.py --models l1b-bf16 --folder /data/ckpt

The checkpoints are written once into --folder (default ATTNSCOPE_CACHE/checkpoints: l1b 2.5 + 4.9 GB, l8b 16 GB,
written tensor by tensor so that 16 GB never sit in memory). The requests:
  l1b: a 512-token text's summaries of every head and layer 0's attention (what a first view asks), then every
       head's attention of layers 0-3 in the binary form;
  l8b: a 128-token text's summaries of all 1,024 heads, then layer 0's attention (its heads recomputed from the
       layer-by-layer run's checkpoints).
Targets (issue 36): l1b peak RSS <= 7 GB from bf16, <= 11 GB from f32; a warm start <= 20 s; l8b <= 120 s for both
requests, peak RSS <= 21 GB.
Each model's first request is also a share of the FLOP bound (issue 49): 2 x its multiplied parameters (every weight
matrix but the token embedding) x the text's tokens, at this machine's sgemm rate measured in this run (NumPy,
4096^3 float32, between the requests, while the server idles: the median). l8b's summaries are asked for three more
fresh texts (the result cache never answers) and their median is the share: the first run also reads the weights'
pages from disk.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.checkpoints import SHAPES, llama, tensors, text, widened  # noqa: E402
from bench.common import CACHE, free_port, sgemm_gflops, wait_until_up  # noqa: E402

BINARY = "application/vnd.attnscope.tensors"


def hwm_gb(pid: int) -> float:
    """The process's peak resident memory (VmHWM) in GiB (2**30 bytes), as every "_gb" key here is."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def rss_gb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def serve(name: str, folder: Path, cache: Path):
    """Start `attnscope serve` with this one model; returns (url, process, seconds to /healthz)."""
    import subprocess

    port = free_port()
    env = {**os.environ, "ATTNSCOPE_MODELS": f"{name}={folder}", "ATTNSCOPE_CACHE": str(cache)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "attnscope", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_until_up(url, proc, timeout=900)
    return url, proc, time.perf_counter() - t0


def post(url: str, body: dict, binary: bool = False) -> float:
    t0 = time.perf_counter()
    r = httpx.post(url + "/api/attention", json=body, timeout=900, headers={"Accept": BINARY} if binary else {})
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
    return time.perf_counter() - t0


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except Exception:   # noqa: BLE001
        proc.kill()


def measure(name: str, folder: Path, cache: Path) -> dict:
    out = {}
    for start in ("cold", "warm"):                         # the graph cache empty, then filled by the first start
        if start == "cold":
            for f in cache.glob(f"{name}-*.onnx*"):
                f.unlink()
        url, proc, seconds = serve(name, folder, cache)
        out[f"start_{start}_s"] = seconds
        if start == "cold":
            stop(proc)
    try:
        model = httpx.get(url + "/api/models").json()[0]
        caps = model["capabilities"]
        out |= {"dtype": caps["dtype"], "weights_gb": caps["weights_bytes"] / 2**30,
                "runs": "whole" if caps["features"]["stacked"] else "layer by layer",
                "rss_after_start_gb": rss_gb(proc.pid)}
        rates = [sgemm_gflops(4096, 3)]
        if name.startswith("l8b"):
            t = text(127)
            out["summaries_s"] = post(url, {"model": name, "text": t, "include": ["summary"]})
            rates.append(sgemm_gflops(4096, 3))
            out["layer0_attention_s"] = post(url, {"model": name, "text": t, "layers": [0], "include": ["attention"]},
                                             binary=True)
            again = []
            for i in range(1, 4):                  # fresh texts of the same length: the pages read, the cache unused
                again.append(post(url, {"model": name, "text": text(127 + 7 * i)[7 * i:], "include": ["summary"]}))
                rates.append(sgemm_gflops(4096, 3))
            out["summaries_again_s"] = statistics.median(again)
            first, tokens = out["summaries_again_s"], 128
        else:
            t = text(511)
            out["summaries_layer0_s"] = post(url, {"model": name, "text": t, "layers": [0],
                                                   "include": ["attention", "summary", "predictions"]}, binary=True)
            rates.append(sgemm_gflops(4096, 3))
            out["four_layers_s"] = post(url, {"model": name, "text": t, "layers": [0, 1, 2, 3],
                                              "include": ["attention"]}, binary=True)
            first, tokens = out["summaries_layer0_s"], 512
        out["peak_rss_gb"] = hwm_gb(proc.pid)
    finally:
        stop(proc)
    out["sgemm_gflops"] = statistics.median(rates)
    out["flop_bound_s"] = 2 * multiplied(name.split("-")[0]) * tokens / (out["sgemm_gflops"] * 1e9)
    out["share_of_flop_bound"] = out["flop_bound_s"] / first
    return out


def multiplied(shape: str) -> int:
    """The parameters a forward multiplies by: every weight matrix but the token embedding (a lookup)."""
    return sum(math.prod(s) for n, s in tensors(SHAPES[shape]).items() if len(s) == 2 and "embed_tokens" not in n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="l1b-bf16,l1b-f32,l8b-bf16")
    ap.add_argument("--folder", type=Path, default=CACHE.parent / "checkpoints")
    args = ap.parse_args()
    cache = CACHE / "big"
    cache.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        shape, dtype = name.split("-")
        t0 = time.perf_counter()
        folder = llama(args.folder / f"{shape}-bfloat16", shape, "bfloat16")
        if dtype == "f32":
            folder = widened(folder, args.folder / f"{shape}-float32")
        written = time.perf_counter() - t0
        print(f"{name}: checkpoint ready in {written:.0f} s ({folder})", flush=True)
        result = measure(name, folder, cache)
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main()
