"""What a key/value-cache policy forgets (issue 52): a needle's answer under StreamingLLM, H2O and SnapKV at several
budgets, and the full-size streaming check against transformers. Not a test.

    .venv/bin/python bench/kv_policies.py --needle                         # Gemma 3, 8,192 tokens, 256..2048
    .venv/bin/python bench/kv_policies.py --needle --tokens 1000 --budgets 64 128 256     # a quick check first
    .venv/bin/python bench/kv_policies.py --needle --haystack FILE         # a haystack of your own (a text file)
    .venv/bin/python bench/kv_policies.py --parity                         # streaming vs transformers, full size

--needle: the bundled needle-in-a-haystack probe of /api/retrieval (analyses/retrieval.py: its essay
analyses/data/haystack.txt, repeated past its ~3,800 tokens to reach --tokens, cut there; its needle sentence put in at
the sentence start nearest --depth; its question, then its answer " marmalade sunrise"), the prompt about --tokens
tokens. The comparison is
/api/kv_compare's own (analyses/kv_compare.py compare): the answer's tokens teacher-forced under each policy, the full
cache run alongside: streaming (sinks 4, window budget - 4), h2o (recent budget / 2, as the paper splits it) and snapkv
(window 32, kernel 5, avg). Only the prompt's run and the answer's steps are computed (no generation past them).
Printed per policy and budget, as a Markdown table: the answer's probability (all its tokens), its first token's, the
mean and max KL(full || policy) over the answer's tokens, and the top-1 agreement. H2O's and SnapKV's first answer token
is always the full cache's: their prompt runs with every key.

--parity: streaming (sinks 4, window 256), greedy, 32 tokens (past any end-of-text token) after a ~600-token prompt, on SmolLM2 and Gemma 3, against
transformers with the same keys hidden by a 4-D attention mask (tests/references.hf_greedy_masked; Gemma 3 in
float64, as tests/test_gemma3_zoo.py reads it): tokens equal, and the largest logit difference.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]


def haystack(rt, path: Path | None, tokens: int, depth: float) -> tuple[str, str]:
    """The probe's prompt (the haystack cut at `tokens` tokens, the needle at depth, the question) and its answer:
    /api/retrieval's bundled probe, its essay repeated as often as `tokens` needs."""
    from attnscope.analyses import retrieval

    text = path.read_text(encoding="utf-8") if path else retrieval.bundled()
    whole = text
    while len(rt.encode(whole).ids) < tokens + 16:
        whole += "\n\n" + text
    extra = len(rt.encode(f"{retrieval.NEEDLE} \n\n{retrieval.QUESTION}").ids)      # the prompt is ~`tokens` tokens
    hay, _ = retrieval.haystack(rt, whole, tokens - extra, rt.spec.max_tokens)
    placed, _ = retrieval.place(hay, retrieval.NEEDLE, depth)
    return f"{placed.rstrip()}\n\n{retrieval.QUESTION}", retrieval.ANSWER


def needle(args) -> None:
    from attnscope.analyses.kv_compare import CompareRequest, compare, grid
    from attnscope.runtime import Runtime
    from attnscope.sources import zoo

    rt = Runtime(zoo.get(args.model), threads=args.threads)
    prompt, answer = haystack(rt, args.haystack, args.tokens, args.depth)
    ids, whole = rt.encode(prompt).ids, rt.encode(prompt + answer).ids
    assert whole[:len(ids)] == ids, "the answer changed the prompt's tokens"
    req = CompareRequest(model=args.model, text=prompt, answer=answer, budgets=args.budgets, snapkv_window=32)
    runs = grid(req, rt.cfg)
    print(f"{args.model}: prompt {len(ids)} tokens (needle at depth {args.depth}), answer "
          f"{[rt.token_string(i) for i in whole[len(ids):]]}; {len(runs) + 1} runs; load {os.getloadavg()[0]:.1f}",
          flush=True)
    started = time.perf_counter()

    def progress(done, total):
        print(f"  {done}/{total} runs, {time.perf_counter() - started:.0f} s", flush=True)
    out = compare(rt, ids, whole[len(ids):], 0, runs, progress, lambda: False)
    print(f"\n{args.model}, {len(ids)}-token prompt, needle at depth {args.depth}; {out.seconds / 60:.1f} min\n")
    print("| policy | budget | answer probability | first token | mean KL (nats) | max KL | top-1 agreement |")
    print("|---|---|---|---|---|---|---|")
    for r in out.rows:
        print(f"| {r['policy']} | {r['budget'] or 'all'} | {r['answer_probability']:.3g} | "
              f"{r['probabilities'][0]:.3g} | {r['kl_mean']:.3f} | {r['kl_max']:.3f} | {r['top1_agreement']:.2f} |")


def parity(args) -> None:
    """Streaming against transformers, the issue's sizes."""
    import torch
    import transformers

    from attnscope.model.kv_policies import Streaming
    from attnscope.runtime import Runtime
    from attnscope.sources import zoo
    from tests.references import greedy_under_policy, hf_greedy_masked

    torch.set_num_threads(args.threads)
    policy = Streaming(4, 256)
    for name in args.parity_models:
        rt = Runtime(zoo.get(name), threads=args.threads)
        text, _ = haystack(rt, None, 600, 0.5)
        ids = rt.encode(text).ids
        gen, ours = greedy_under_policy(rt, ids, 32, policy)     # past an end-of-text token too, as transformers runs
        path = zoo.smollm2_path() if name == "smollm2" else zoo.gemma3_path(None, rt.cache_dir)
        file = path.name
        hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=file, attn_implementation="eager",
                                                               dtype=torch.float32).eval()
        if name == "gemma3":
            hf = hf.double()
        started = time.perf_counter()
        theirs, logits = hf_greedy_masked(hf, ids, len(ours), lambda T: policy.hidden(T, T, 0),
                                          window=rt.cfg.sliding_window if rt.cfg.local_layers else 0)
        worst = float(np.abs(ours - logits).max())
        kl = max(v.kl for v in gen.views)
        print(f"{name}: prompt {len(ids)} tokens, streaming sinks 4 window 256, {len(ours)} greedy tokens: tokens "
              f"{'equal' if gen.new_ids == theirs else 'DIFFER'}; largest logit difference {worst:.2e} "
              f"(limit 1e-4); the policy's largest KL from the full cache {kl:.3f} nats "
              f"(transformers {time.perf_counter() - started:.0f} s)", flush=True)
        del hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--haystack", type=Path, default=None, help="a text file (default: the bundled essay, repeated)")
    ap.add_argument("--tokens", type=int, default=8192, help="the haystack's length (the model's max_tokens bounds it)")
    ap.add_argument("--depth", type=float, default=0.5, help="where the needle goes, 0 (start) .. 1 (end)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--needle", action="store_true", help="the needle's answer per policy and budget (the default)")
    ap.add_argument("--parity", action="store_true", help="streaming against transformers instead")
    ap.add_argument("--parity-models", nargs="+", default=["smollm2", "gemma3"])
    args = ap.parse_args()
    parity(args) if args.parity else needle(args)


if __name__ == "__main__":
    main()
