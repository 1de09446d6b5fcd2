"""Forward-pass times for MiniLM: our onnxruntime path, our NumPy reference, and transformers (eager).

    .venv/bin/python bench/forward.py                 # 32, 128 and 512 tokens, median of 10 runs
    .venv/bin/python bench/forward.py --repeats 30 --threads 4

For each length, one text that tokenises to exactly that many tokens is run through
  onnx          model.runtime.Runtime.run(engine="onnx"): the fast graph (no teaching stages),
                end to end (tokenising, mask, session, trimming);
  numpy         the same Runtime.run(engine="numpy"), the NumPy reference;
  transformers  BertModel(attn_implementation="eager") forward on the same ids, output_attentions=True,
                under torch.inference_mode with torch.set_num_threads equal to onnxruntime's threads
                (the model call only, so the ratios are, if anything, kind to transformers).
Times are the median after warm-up; ratios > 1 mean onnxruntime is faster. Not part of the tests.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_ms, runtime, text_of_tokens  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per cell (median reported); default 10")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs first; default 2")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="onnxruntime intra-op threads, and torch's; default: the CPUs available")
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    args = ap.parse_args(argv)

    import torch
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from attnscope.model import zoo

    rt = runtime("minilm", providers=["CPUExecutionProvider"], threads=args.threads)
    rt.session(False)  # export (first time only) and open the fast graph before timing
    torch.set_num_threads(args.threads)
    hf = BertModel.from_pretrained(str(zoo.minilm_dir()), attn_implementation="eager").eval()

    print(f"MiniLM-L6 forward, batch 1, median of {args.repeats} after {args.warmup} warm-up; "
          f"{args.threads} threads (onnxruntime intra-op = torch); onnxruntime on "
          f"{rt.session(False).get_providers()[0]}", flush=True)
    rows = []
    for n in args.lengths:
        text = text_of_tokens(rt, n)
        enc = rt.encode(text)
        ids, types = torch.tensor([enc.ids]), torch.tensor([enc.type_ids])
        mask = torch.ones_like(ids)

        def hf_forward():
            with torch.inference_mode():
                hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_attentions=True)

        t_onnx = median_ms(lambda: rt.run(text, engine="onnx"), args.repeats, args.warmup) / 1e3
        t_numpy = median_ms(lambda: rt.run(text, engine="numpy"), args.repeats, args.warmup) / 1e3
        t_hf = median_ms(hf_forward, args.repeats, args.warmup) / 1e3
        rows.append((n, t_onnx, t_numpy, t_hf))

    head = f"{'tokens':>6} | {'onnx ms':>9} | {'numpy ms':>9} | {'transformers ms':>15} | {'transformers/onnx':>17} | {'numpy/onnx':>10}"
    print(head)
    print("-" * len(head))
    for n, t_onnx, t_numpy, t_hf in rows:
        print(f"{n:>6} | {t_onnx * 1e3:>9.2f} | {t_numpy * 1e3:>9.2f} | {t_hf * 1e3:>15.2f} | "
              f"{t_hf / t_onnx:>16.2f}x | {t_numpy / t_onnx:>9.2f}x")


if __name__ == "__main__":
    main()
