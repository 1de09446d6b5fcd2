"""attnscope command line (also `python -m attnscope`): serve the app, export graphs, or print a head's attention.

    attnscope serve [--host H --port P --log-level warning]
    attnscope export [MODEL ...]
    attnscope attend "The cat sat on the mat." --model minilm --layer 2 --head 5 [--top 3] [--causal]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def _runtime(model_id: str):
    """A zoo model configured from the settings (graph cache, model folders, providers, threads)."""
    from ..model import zoo
    from ..model.runtime import Runtime
    from .settings import get_settings

    st = get_settings()
    return Runtime(zoo.get(model_id, st.model_dirs().get(model_id)), st.providers or None, st.threads, st.cache)


def _attend(args) -> int:
    from ..model import stats

    rt = _runtime(args.model)
    spec = rt.spec
    L, H = rt.cfg.n_layers, rt.cfg.n_heads
    if not (0 <= args.layer < L and 0 <= args.head < H):
        print(f"error: {args.model} has layers 0..{L - 1} and heads 0..{H - 1}", file=sys.stderr)
        return 2
    [res] = rt.run([args.text], causal=args.causal or None, engine=args.engine)
    p = res.attentions[args.layer, args.head]
    ent = stats.entropy(p)
    print(f"{spec.title}  layer {args.layer}  head {args.head}  {len(res.tokens)} tokens"
          f"{'  (truncated)' if res.encoding.truncated else ''}  causal={res.causal}  {res.provider}")
    width = max(len(t) for t in res.tokens)
    if args.top or len(res.tokens) > 16:
        k = args.top or 3
        for i, tok in enumerate(res.tokens):
            best = np.argsort(-p[i])[:k]
            tops = "  ".join(f"{res.tokens[j]}:{p[i, j]:.3f}" for j in best)
            print(f"{i:>4} {tok:<{width}}  H={ent[i]:.3f}  {tops}")
    else:
        print(" " * (width + 5) + " ".join(f"{t[:6]:>6}" for t in res.tokens) + "  entropy")
        for i, tok in enumerate(res.tokens):
            print(f"{i:>4} {tok:<{width}} " + " ".join(f"{v:6.3f}" for v in p[i]) + f"  {ent[i]:.3f}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="attnscope", description="attention microscope")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the web app and API")
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    e = sub.add_parser("export", help="build (and cache) the ONNX graphs")
    e.add_argument("models", nargs="*", help="model ids (default: all)")
    a = sub.add_parser("attend", help="print one head's attention for a text")
    a.add_argument("text")
    a.add_argument("--model", default="minilm")
    a.add_argument("--layer", type=int, default=0)
    a.add_argument("--head", type=int, default=0)
    a.add_argument("--top", type=int, default=0, help="show the top-k keys per query instead of the matrix")
    a.add_argument("--causal", action="store_true", help="apply the look-ahead mask")
    a.add_argument("--engine", choices=["onnx", "numpy"], default="onnx")
    args = parser.parse_args(argv)
    from .settings import get_settings, setup_logging
    setup_logging()

    if args.cmd == "serve":  # uvicorn with limits and timeouts on every connection (app/server.py)
        from .server import serve
        serve(get_settings(), args.host, args.port, args.log_level)
        return 0
    if args.cmd == "export":
        from ..model import zoo
        for model_id in args.models or list(zoo.ZOO):
            rt = _runtime(model_id)
            for stages in (False, True):
                print(rt.onnx_path(stages))
        return 0
    try:
        return _attend(args)
    except (ValueError, KeyError) as e:
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
