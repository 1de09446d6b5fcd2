"""An API answer's time against a raw onnxruntime forward of the whole model, and where the answer's time goes.

    .venv/bin/python bench/answer.py [--model minilm] [--tokens 128] [--repeats 15]

1. Interleaved, with a fresh text for every call (the server's result cache never answers): a raw forward (this
   process's own onnxruntime session on the server's graph file, every output, `sess.run` alone) three times: with
   onnxruntime's default session options and the model's arrays fed as inputs; with the app's options
   (runtime/options.open_session, its threads placed as the server's are: options.placement), fed; and with the app's
   options and the float32 product weights opened as initializers, which onnxruntime prepacks, and its other weights
   with them, as the server's graphs open them within ATTNSCOPE_PREPACK_MB (the fastest plain forward of the graph,
   and the one whose kernels the server's run shares: the ratio to it is what the answer adds), and the same with
   its threads left to the scheduler (placing them must not flatter the ratio). Then the binary
   answer from a real server (`attnscope serve`) for the first layer and for the last, each through the project's own
   client (attnscope.Client: the standard library's http.client, the answer read into one buffer) and through httpx
   (a general-purpose client: ~0.5-1.5 ms more per answer here), and through the project's client from a second
   server whose threads the scheduler places (ATTNSCOPE_PLACE_THREADS=0: runtime/options.placement says what placing
   them changed). Printed: the medians and each answer's ratio to each raw forward; the median of each round's own
   ratio (answer over the prepacked raw forward of the same round: a slow spell of a shared VM moves both), with its
   quartiles; and, from the answer's timing_ms, the run and the server's time from parsing to encoding, so what the
   answer adds is split into the server's part and the rest (loopback, the event loop before and after, the
   client). A request for the first layers runs a graph cut after them (Runtime.depth_for): the first layer's answer
   is under the whole model's forward; the last layer needs every block, so its ratio is what the answer adds to the
   forward.
2. The same answers split by stage, in this process, with the server's own functions (analyses/attention.py,
   app/sending.py): plan (validate, tokenise), run (the forward), payload (statistics), encode (the binary form);
   HTTP is the end-to-end time less their sum (the request and answer on loopback, the event loop, the client's
   parsing).
The raw sessions and the server's take turns on the cores: the server's threads spin only while a run is under way
(open_session), and the default session's spinning ends long before the next call (each call waits 50 ms first).
On a shared 2-core VM the raw forward's median moves between runs of this script (10-18 ms seen for MiniLM at 128
tokens, either session), far more than the answer's does: compare ratios within one run, and run it a few times.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from attnscope.python.client import Client  # noqa: E402
from attnscope.app.wire import BINARY, from_binary  # noqa: E402
from bench.common import WORDS, quartiles, runtime, server, session_feeds, wait_until_idle  # noqa: E402


def fresh_text(rt, n: int, seed: int) -> str:
    """A text of about n tokens that no earlier call used: words in an order drawn from the seed."""
    rng = np.random.default_rng(seed)
    words = [WORDS[rng.integers(len(WORDS))] for _ in range(n // 2)]
    while len(rt.encode(" ".join(words)).ids) < n:
        words.append(WORDS[rng.integers(len(WORDS))])
    return " ".join(words)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="on a shared machine: before each timed call wait up to S seconds for other processes "
                         "to stop running")
    args = ap.parse_args(argv)

    from attnscope.runtime.options import on_core, open_session, placement

    rt = runtime(args.model)
    rt.weights.prepack_bytes = 1 << 40    # its whole graph prepacked, whatever ATTNSCOPE_PREPACK_MB lets the server do
    L = rt.cfg.n_layers
    import onnxruntime as ort
    path = rt.onnx_path()                                              # the whole model, every output
    caller, pool = placement(rt.threads)         # the app's sessions' threads, as runtime/sessions.Session places them
    raws = {"default": ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]),
            "app": open_session(path, ["CPUExecutionProvider"], rt.threads, pool=pool),
            "prepacked": open_session(path, ["CPUExecutionProvider"], rt.threads, initial=rt.weights.value,
                                      prepack=rt.weights.prepacks, pool=pool),   # the server's rule: Weights.prepacks
            "unplaced": open_session(path, ["CPUExecutionProvider"], rt.threads, initial=rt.weights.value,
                                     prepack=rt.weights.prepacks)}       # the same, its threads the scheduler's
    seeds = iter(range(10**6))

    def raw_forward(raw):
        feeds = session_feeds(rt, rt.encode(fresh_text(rt, args.tokens, next(seeds))), raw)
        with on_core(caller if raw in (raws["app"], raws["prepacked"]) else None):
            t0 = time.perf_counter()
            raw.run(None, feeds)
            return time.perf_counter() - t0

    # the answer's own timing_ms, (the run, the server's time from parsing to encoding), by server
    inside = {(layer, placed): [] for layer in (0, L - 1) for placed in (True, False)}
    with server({"ATTNSCOPE_MODELS": args.model}) as (url, _), httpx.Client(base_url=url, timeout=120) as http, \
            server({"ATTNSCOPE_MODELS": args.model, "ATTNSCOPE_PLACE_THREADS": "0"}) as (unplaced, _):
        api, api_unplaced = Client(url), Client(unplaced)

        def answer(layer: int, via: str):
            body = {"model": args.model, "text": fresh_text(rt, args.tokens, next(seeds)), "layers": [layer]}
            t0 = time.perf_counter()
            if via != "httpx":
                got = (api if via == "client" else api_unplaced).attention(body.pop("text"), **body)
            else:
                r = http.post("/api/attention", json=body, headers={"Accept": BINARY})
                r.raise_for_status()
                got = from_binary(r.content)
            elapsed = time.perf_counter() - t0
            inside[layer, via != "unplaced"].append((got["timing_ms"]["model"], got["timing_ms"]["total"]))
            return elapsed

        answers = {(layer, via): (lambda layer=layer, via=via: answer(layer, via))
                   for via in ("client", "httpx", "unplaced") for layer in (0, L - 1)}
        calls = {name: (lambda raw=raw: raw_forward(raw)) for name, raw in raws.items()} | answers
        for _ in range(3):                      # warm-up: sessions opened (the cut graphs too), arenas sized
            for call in calls.values():
                call()
        times = {name: [] for name in calls}
        for layer in inside:
            inside[layer].clear()
        for _ in range(args.repeats):
            for name, call in calls.items():
                time.sleep(0.05)
                wait_until_idle(args.wait_quiet)
                times[name].append(call())
        api.close()
        api_unplaced.close()
        ms = {name: statistics.median(t) * 1000 for name, t in times.items()}
        print(f"{rt.spec.title}, ~{args.tokens} tokens, {args.repeats} interleaved rounds, fresh texts, medians; "
              f"ratios: to each raw forward, and the median of each round's own ratio to the prepacked one:")
        labels = {"default": "onnxruntime's default options, weights fed", "app": "the app's options, weights fed",
                  "prepacked": "the app's options, product weights prepacked (as served)",
                  "unplaced": "the same, threads left to the scheduler"}
        for name, label in labels.items():
            print(f"  raw forward, whole model, {label:<58}{ms[name]:7.1f} ms")
        print(f"  {'':<58}{'':>10}   {' / '.join(raws)}")
        for (layer, via) in answers:
            name = (layer, via)
            rounds = [a / b for a, b in zip(times[name], times["prepacked"])]
            q1, paired, q3 = quartiles(rounds)
            label = f"API answer, layer {layer} (binary), " + {"client": "attnscope.Client", "httpx": "httpx",
                                                                "unplaced": "attnscope.Client, unplaced"}[via]
            ratios = " / ".join(f"{ms[name] / ms[raw]:.2f}x" for raw in raws)
            print(f"  {label:<58}{ms[name]:7.1f} ms   {ratios}   (each round: {paired:.2f}x, {q1:.2f}-{q3:.2f}x)")
        for (layer, placed), rows in inside.items():
            run, total = (statistics.median(v) for v in zip(*rows))
            print(f"  layer {layer}: in the {'' if placed else 'unplaced '}server, the run {run:.1f} ms of {total:.1f} "
                  f"ms from parsing to encoding")
        e2e = {layer: ms[(layer, "client")] for layer in (0, L - 1)}
    stages(args, rt, e2e, seeds)


def stages(args, rt, e2e: dict[int, float], seeds) -> None:
    """The answer's stages in this process, with the server's own functions."""
    from attnscope.analyses.base import Computed, Context
    from attnscope.analyses.registry import Plans
    from attnscope.analyses.attention import AttentionRequest
    from attnscope.app.sending import encode
    from attnscope.app.settings import Settings

    settings = Settings(models=[args.model], default_model=args.model)
    rt.stop_early_mb = settings.stop_early_mb
    planner = Plans(Context({args.model: rt}, settings))
    print("\nby stage (in-process medians; HTTP = end-to-end above less the stages):")
    print(f"  {'layer':>5} | {'plan':>6} | {'run':>6} | {'payload':>7} | {'encode':>6} | {'HTTP':>6} | ms")
    for layer, total in e2e.items():
        parts = {"plan": [], "run": [], "payload": [], "encode": []}
        for _ in range(args.repeats + 2):
            req = AttentionRequest(model=args.model, text=fresh_text(rt, args.tokens, next(seeds)), layers=[layer])
            t0 = time.perf_counter()
            plan = planner.attention(req, True)
            t1 = time.perf_counter()
            computed = Computed(plan.run.call(), False, {})         # the run itself, in this thread
            t2 = time.perf_counter()
            plan.payload(computed)
            t3 = time.perf_counter()
            encode(plan, computed, t0)            # payload again, then the binary form
            t4 = time.perf_counter()
            for name, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2, (t4 - t3) - (t3 - t2))):
                parts[name].append(value * 1000)
        med = {name: statistics.median(v[2:]) for name, v in parts.items()}
        print(f"  {layer:>5} | {med['plan']:6.2f} | {med['run']:6.2f} | {med['payload']:7.2f} | {med['encode']:6.2f} | "
              f"{total - sum(med.values()):6.2f} |")


if __name__ == "__main__":
    main()
