"""What a key/value-cache policy forgets (issue 52): a needle's answer under StreamingLLM, H2O and SnapKV at several
budgets, and the full-size streaming check against transformers. Not a test.

    .venv/bin/python bench/kv_policies.py                                  # Gemma 3, ~4,000 tokens, 256..2048
    .venv/bin/python bench/kv_policies.py --haystack FILE --tokens 8192    # a haystack of your own (a text file)
    .venv/bin/python bench/kv_policies.py --parity                         # streaming vs transformers, full size

Needle: a haystack (the --haystack file, or else this repository's README.md, its paragraphs repeated) cut to about
--tokens tokens, a needle sentence put in at --depth (a fraction of the text), then a question whose answer is the
needle's number. The answer's tokens are teacher-forced (runtime/generation.Generator's `forced`) under each policy:
streaming (sinks 4, window budget - 4), h2o (recent budget / 2, as the paper splits it) and snapkv (window 32, kernel
5, avg), and the full cache runs alongside (Generator's second run). Printed per policy and budget: the answer's
probability (all its tokens), its first token's, the mean KL(full || policy) over the answer's tokens, and the share
of the needle's positions the policy still kept at the last answer token (over layers and key/value heads). H2O's and
SnapKV's first answer token is always the full cache's: their prompt runs with every key.

--parity: streaming (sinks 4, window 256), greedy, 32 tokens (past any end-of-text token) after a ~600-token prompt, on SmolLM2 and Gemma 3, against
transformers with the same keys hidden by a 4-D attention mask (tests/references.hf_greedy_masked; Gemma 3 in
float64, as tests/test_gemma3_zoo.py reads it): tokens equal, and the largest logit difference.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
NEEDLE = "The code that opens the lighthouse door is 4817."
QUESTION = "\n\nWhat is the code that opens the lighthouse door?\nThe code that opens the lighthouse door is"
ANSWER = " 4817"


def haystack(rt, path: Path | None, tokens: int, depth: float) -> tuple[str, int, int]:
    """The prompt (haystack with the needle at depth, then the question) and the needle's token positions [a, b)."""
    text = (path or ROOT / "README.md").read_text(encoding="utf-8")
    paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 80 and not p.lstrip().startswith("```")]
    body, n = [], 0
    while n < tokens:
        body.append(paragraphs[len(body) % len(paragraphs)])
        if len(body) % 8 == 0:
            n = len(rt.encode("\n\n".join(body)).ids)
    while len(rt.encode("\n\n".join(body)).ids) > tokens:
        body.pop()
    cut = int(len(body) * depth)
    before = "\n\n".join(body[:cut]) + "\n\n"
    prompt = before + NEEDLE + "\n\n" + "\n\n".join(body[cut:]) + QUESTION
    a = len(rt.encode(before).ids)
    b = len(rt.encode(before + NEEDLE).ids)
    return prompt, a, b


def needle(args) -> None:
    from attnscope.model.kv_policies import H2O, Full, SnapKV, Streaming
    from attnscope.runtime import Runtime
    from attnscope.runtime.generation import Generator, Sampling
    from attnscope.sources import zoo

    rt = Runtime(zoo.get(args.model), threads=args.threads)
    prompt, a, b = haystack(rt, args.haystack, args.tokens, args.depth)
    ids, whole = rt.encode(prompt).ids, rt.encode(prompt + ANSWER).ids
    assert whole[:len(ids)] == ids, "the answer changed the prompt's tokens"
    answer = whole[len(ids):]
    print(f"{args.model}: prompt {len(ids)} tokens, needle at tokens {a}..{b - 1} (depth {args.depth}), answer "
          f"{[rt.token_string(i) for i in answer]}")
    rows = []
    for policy in [Full()] + [p for budget in args.budgets for p in (
            Streaming(4, budget - 4), H2O(budget, budget // 2), SnapKV(budget, 32, 5))]:
        started = time.perf_counter()
        gen = Generator(rt, ids, Sampling(greedy=True), len(answer), policy=policy, forced=tuple(answer))
        tokens = list(gen)
        p = float(np.prod([t.probability for t in tokens]))
        name = policy.name if isinstance(policy, Full) else f"{policy.name} {getattr(policy, 'budget', None) or policy.window + 4}"
        if gen.views:
            kl = float(np.mean([v.kl for v in gen.views]))
            kept = gen._eviction.visible(len(ids) + len(answer) - 2)[:, :, a:b]     # the last answer step's query
            share = float(kept.mean())
        else:
            kl, share = 0.0, 1.0
        rows.append((name, p, tokens[0].probability, kl, share, time.perf_counter() - started))
        print(f"{name:16s} answer {p:.3g}  first token {tokens[0].probability:.3g}  KL {kl:.4f}  needle kept "
              f"{share:.2f}  ({rows[-1][-1]:.0f} s)", flush=True)
    print("\n| policy | budget | answer probability | first token | mean KL (nats) | needle kept |")
    print("|---|---|---|---|---|---|")
    for name, p, first, kl, share, _ in rows:
        policy, _, budget = name.partition(" ")
        print(f"| {policy} | {budget or 'all'} | {p:.3g} | {first:.3g} | {kl:.3f} | {share:.2f} |")


def parity(args) -> None:
    """Streaming against transformers, the issue's sizes."""
    import torch
    import transformers

    from attnscope.model.kv_policies import Streaming
    from attnscope.runtime import Runtime
    from attnscope.runtime.generation import Generator, Sampling
    from attnscope.sources import zoo
    from tests.references import hf_greedy_masked

    torch.set_num_threads(args.threads)
    policy = Streaming(4, 256)
    for name in args.parity_models:
        rt = Runtime(zoo.get(name), threads=args.threads)
        text, _, _ = haystack(rt, None, 600, 0.5)
        ids = rt.encode(text).ids
        gen = Generator(rt, ids, Sampling(greedy=True), 32, policy=policy)
        gen.prefill()
        ours = []
        for _ in range(32):
            ours.append(gen._logits.astype(np.float64))
            next(gen)
            gen.stop_reason = None           # past an end-of-text token too: 32 tokens compared, as transformers runs
        path = zoo.smollm2_path() if name == "smollm2" else zoo.gemma3_path(None, rt.cache_dir)
        file = path.name
        hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=file, attn_implementation="eager",
                                                               dtype=torch.float32).eval()
        if name == "gemma3":
            hf = hf.double()
        started = time.perf_counter()
        theirs, logits = hf_greedy_masked(hf, ids, len(ours), lambda T: policy.hidden(T, T, 0),
                                          window=rt.cfg.sliding_window if rt.cfg.local_layers else 0)
        worst = float(np.abs(np.stack(ours) - logits).max())
        kl = max(v.kl for v in gen.views)
        print(f"{name}: prompt {len(ids)} tokens, streaming sinks 4 window 256, {len(ours)} greedy tokens: tokens "
              f"{'equal' if gen.new_ids == theirs else 'DIFFER'}; largest logit difference {worst:.2e} "
              f"(limit 1e-4); the policy's largest KL from the full cache {kl:.3f} nats "
              f"(transformers {time.perf_counter() - started:.0f} s)", flush=True)
        del hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3")
    ap.add_argument("--haystack", type=Path, default=None, help="a text file (default: README.md, repeated)")
    ap.add_argument("--tokens", type=int, default=4000, help="the haystack's length (the model's max_tokens bounds it)")
    ap.add_argument("--depth", type=float, default=0.5, help="where the needle goes, 0 (start) .. 1 (end)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parity", action="store_true", help="streaming against transformers instead")
    ap.add_argument("--parity-models", nargs="+", default=["smollm2", "gemma3"])
    args = ap.parse_args()
    parity(args) if args.parity else needle(args)


if __name__ == "__main__":
    main()
