"""The CUDA provider against torch on the same GPU, in one run of a few minutes (issue 38): correctness first, then
the timings as ratios (ours over torch's, both measured here, now).

    python bench/gpu.py                      # on a machine with a GPU, onnxruntime-gpu and torch (+ transformers)
    python bench/gpu.py --tokens 128,512     # fewer lengths

Packing the wheels for an offline GPU box: ../shared/tools/gpu-carry.sh (README, "CUDA"). The model is a random
checkpoint of SmolLM2-135M's exact shape (bench/checkpoints.py "smol": 30 layers x 9 heads over 3 key/value heads,
d_model 576), float32, queries and keys drawn wide (peaked attention), served by path as the app serves it
(runtime.Runtime with the CUDA provider first). Printed, each line one measurement:

  exact      largest |attention| difference to torch float32 (TF32 off) at each length, and the next-token top-1
             agreement; and each fast mode's (tf32: the provider's default TF32, what a session without use_tf32=0
             gives; float16; bfloat16) largest difference to our float32 run at that length
  precision  each fast mode against our float32 run over short texts (bench/precision.py's measure): the largest
             attention difference, the top-1 agreement and the total-variation distance of the next-token
             distributions after every token (NDIF's measures)
  forward    Runtime.forward (the stacked graph, every layer's attention to the host) over torch eager
             (output_attentions) at each length the stacked graph takes
  answer     a long text's summaries of every head + one layer's attention (the layer-by-layer path, what
             /api/attention runs) at the longest length, over torch eager's forward
  patching   every one of the 270 heads patched on a 14-token pair (runtime.patching), seconds
  generate   greedy tokens/s, ours (key/value cache on the decoding graph) over transformers' generate
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn, repeats: int = 3, sync=None) -> float:
    """Median seconds of fn() after one warm-up call."""
    fn()
    if sync:
        sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="128,512,2048")
    ap.add_argument("--folder", type=Path, default=None)
    ap.add_argument("--cpu", action="store_true", help="the same script on the CPU (to check it before a GPU run)")
    args = ap.parse_args()
    lengths = [int(t) for t in args.tokens.split(",")]

    import onnxruntime as ort
    import torch
    from transformers import LlamaForCausalLM

    from attnscope.analysis.effects import Metric
    from attnscope.runtime.layerwise import Want
    from attnscope.runtime.patching import patch
    from attnscope.runtime.runtime import Runtime
    from attnscope.sources.resolve import resolve
    from bench.checkpoints import llama, text

    providers = ort.get_available_providers()
    print("onnxruntime", ort.__version__, providers, "| torch", torch.__version__,
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU", flush=True)
    gpu = not args.cpu
    if gpu and ("CUDAExecutionProvider" not in providers or not torch.cuda.is_available()):
        sys.exit("needs onnxruntime-gpu (the CUDA provider) and a GPU torch can see (--cpu: the same on the CPU)")
    dev = "cuda" if gpu else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    root = args.folder or Path(tempfile.mkdtemp(prefix="attnscope-gpu-"))
    folder = llama(root / "smol", "smol", "float32")
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"] if gpu else ["CPUExecutionProvider"]
    rt = Runtime(resolve(f"smol={folder}"), providers=cuda, cache_dir=root / "cache")
    print("served on", rt.provider, "| weights bound on", rt.weights.device, flush=True)
    hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").to(dev).eval()
    sync = torch.cuda.synchronize if gpu else None
    H = rt.cfg.n_heads
    fast = {mode: rt.with_compute_dtype(mode) for mode in (("tf32", "float16", "bfloat16") if gpu else ("float16",))}

    for T in lengths:
        enc = rt.encode(text(T - 1))
        ids = torch.tensor([enc.ids], device=dev)
        with torch.inference_mode():
            out = hf(ids, output_attentions=True)
        ref = torch.stack(out.attentions)[:, 0].float().cpu().numpy()            # [L, H, T, T]
        top1 = int(out.logits[0, -1].argmax())
        peaked = float(ref.max(-1).mean())
        layers = (0, rt.cfg.n_layers // 2, rt.cfg.n_layers - 1)
        want = Want(layers=layers, heads=tuple(range(H)), attention=True)
        res = rt.layerwise().forward(enc, want=want)
        got = np.stack([res.asked.attention[l] for l in layers])
        modes = []
        for mode, f in fast.items():
            r_fast = f.layerwise().forward(enc, want=want)
            worst = float(np.abs(np.stack([r_fast.asked.attention[l] for l in layers]) - got).max())
            modes.append(f"{mode} {worst:.2e} (top-1 same: {r_fast.next_tokens[0].id == res.next_tokens[0].id})")
        print(f"exact T={T}: |attention - torch f32| float32 mode {float(np.abs(got - ref[list(layers)]).max()):.2e} "
              f"(top-1 same: {res.next_tokens[0].id == top1}); rows peaked {peaked:.2f}; fast modes vs our float32: "
              f"{', '.join(modes)}", flush=True)

        def theirs():
            with torch.inference_mode():
                hf(ids, output_attentions=True)
        t_torch = timed(theirs, sync=sync)
        if rt.cfg.n_layers * H * T * T * 4 <= 2**30:
            t_ours = timed(lambda: rt.forward([enc]))
            print(f"forward T={T}: ours {t_ours * 1e3:.1f} ms, torch eager {t_torch * 1e3:.1f} ms, ratio "
                  f"{t_ours / t_torch:.2f}", flush=True)
        lw = rt.layerwise()
        one = Want(layers=(0,), heads=tuple(range(H)), attention=True)
        t_answer = timed(lambda: lw.forward(enc, want=one))
        print(f"answer T={T}: summaries of all {rt.cfg.n_layers * H} heads + layer 0's attention {t_answer * 1e3:.1f} "
              f"ms, torch eager forward {t_torch * 1e3:.1f} ms, ratio {t_answer / t_torch:.2f}", flush=True)

    from bench.precision import line, measure
    texts = [text(n) for n in (15, 31, 63)]     # each mode's next tokens after every token of these (short: a run each)
    for mode, f in fast.items():
        print("precision", line("smol", mode, measure(rt, f, texts)), flush=True)

    clean, corrupt = rt.encode("Mary got John"), rt.encode("Mary got Jane")     # 14 byte tokens each, BOS in
    n = len(clean.ids)
    metric = Metric(int(clean.ids[1]), int(clean.ids[10]))
    t_patch = timed(lambda: patch(rt, clean, corrupt, metric), repeats=2)
    print(f"patching: {rt.cfg.n_layers * H} heads on a {n}-token pair {t_patch:.2f} s", flush=True)

    from attnscope.runtime.generation import Generator, Sampling
    prompt = rt.encode(text(30)).ids
    new = 32

    def ours_generate():
        for _ in Generator(rt, prompt, Sampling(greedy=True), new):
            pass

    def theirs_generate():
        with torch.inference_mode():
            hf.generate(torch.tensor([prompt], device=dev), do_sample=False, max_new_tokens=new,
                        min_new_tokens=new, pad_token_id=0)
    t_ours, t_theirs = timed(ours_generate, 2), timed(theirs_generate, 2, sync)
    print(f"generate: ours {new / t_ours:.1f} tokens/s, transformers generate {new / t_theirs:.1f} tokens/s, ratio "
          f"{t_theirs / t_ours:.2f}", flush=True)


if __name__ == "__main__":
    main()
