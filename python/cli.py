"""attnscope command line (also `python -m attnscope`): serve the app, export graphs, or print a head's attention.

    attnscope serve [--host H --port P --log-level warning] [--model MODEL ...] [--compute-dtype float16]
    attnscope export [MODEL ...]
    attnscope attend "The cat sat on the mat." --model minilm --layer 2 --head 5 [--top 3] [--causal]
    attnscope corpus texts.txt --model minilm [--engine local|ray] [--out FILE] [--sample N] [--column NAME]
    attnscope mcp [--transport stdio|http] [--host H --port P] [--token TOKEN] [--model MODEL ...] [--url URL]

MODEL is a zoo id (minilm, smollm2, tiny-gpt, induction), NAME=PATH (a Hugging Face folder or a .gguf file) or
NAME=hf:ORG/REPO (the local Hugging Face cache), as in ATTNSCOPE_MODELS.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def _runtime(entry: str):
    """A model (zoo id, NAME=PATH or NAME=hf:ORG/REPO) configured from the settings (graph cache, model folders,
    providers, threads, compute dtype)."""
    from ..runtime import Runtime
    from ..sources import resolve
    from ..app.settings import get_settings

    st = get_settings()
    return Runtime(resolve(entry, st.model_dirs(), cache=st.cache), st.providers or None, st.threads, st.cache,
                   compute_dtype=st.compute_dtype)


def _attend(args) -> int:
    from ..analysis import statistics as stats

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
          f"{'  (truncated)' if res.encoding.truncated else ''}  causal={res.causal}  {res.provider}"
          f"{'' if args.engine == 'numpy' else '  ' + rt.compute_dtype}")
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


def _corpus(args) -> int:
    from ..corpus import CorpusError, run_corpus
    from ..app.settings import get_settings
    st = get_settings()
    try:
        run_corpus(args.input, args.model, engine=args.engine, out=args.out, sample=args.sample, seed=args.seed,
                   column=args.column, fmt=args.format, workers=args.workers, batch_size=args.batch_size,
                   chunk_size=args.chunk_size, max_chars=args.max_chars, js_rows=args.js_rows, restart=args.restart,
                   progress=not args.quiet, cache_dir=st.cache, ray_address=st.ray_address)
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv=None) -> int:
    from ..model.precision import COMPUTE_DTYPES
    parser = argparse.ArgumentParser(prog="attnscope", description="attention microscope")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the web app and API")
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--model", action="append", default=None, metavar="MODEL",
                   help="a model to serve (repeatable): a zoo id, NAME=PATH (Hugging Face folder or .gguf file) or "
                        "NAME=hf:ORG/REPO; replaces ATTNSCOPE_MODELS")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    s.add_argument("--compute-dtype", default=None, choices=COMPUTE_DTYPES,
                   help="what the models' matrix products run in: float32 (exact; the default), or a fast mode, "
                        "labelled in every answer: float16, bfloat16 or tf32 (the last two on a GPU only); replaces "
                        "ATTNSCOPE_COMPUTE_DTYPE")
    e = sub.add_parser("export", help="build (and cache) the ONNX graphs")
    e.add_argument("models", nargs="*", help="zoo ids, NAME=PATH or NAME=hf:ORG/REPO (default: the zoo)")
    a = sub.add_parser("attend", help="print one head's attention for a text")
    a.add_argument("text")
    a.add_argument("--model", default="minilm", help="a zoo id, NAME=PATH or NAME=hf:ORG/REPO")
    a.add_argument("--layer", type=int, default=0)
    a.add_argument("--head", type=int, default=0)
    a.add_argument("--top", type=int, default=0, help="show the top-k keys per query instead of the matrix")
    a.add_argument("--causal", action="store_true", help="apply the look-ahead mask")
    a.add_argument("--engine", choices=["onnx", "numpy"], default="onnx")
    from ..corpus import engines, readers, sums
    c = sub.add_parser("corpus", help="per-head statistics over a corpus (Clark et al. 2019), locally or on Ray",
                       description="Token-weighted per-head statistics and head-to-head Jensen-Shannon distances "
                                   "over every text of INPUT. Skipped records are reported with their line or row "
                                   "number; partial sums go to OUT.partial.json, and the same command resumes.")
    c.add_argument("input", help="one text per line (.txt), JSON Lines (.jsonl), CSV/TSV or Parquet")
    c.add_argument("--model", default="minilm", help="a model id, as GET /api/models lists them (%(default)s)")
    c.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: a process pool on this machine; ray: Ray Data (RAY_ADDRESS, else a local cluster)")
    c.add_argument("--out", help="result file, .json or .parquet (default: INPUT_STEM.MODEL.corpus.json)")
    c.add_argument("--sample", type=int, help="a uniform random sample of N texts (seeded by --seed)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--column", help="the text field/column of JSONL, CSV or Parquet input (default: text)")
    c.add_argument("--format", choices=readers.FORMATS, help="default: from the suffix")
    c.add_argument("--workers", type=int, help="processes (local; 0: this process) or actors (ray); default: "
                                                "one per CPU")
    c.add_argument("--batch-size", type=int, default=engines.BATCH_SIZE, help="texts per model run (%(default)s)")
    c.add_argument("--chunk-size", type=int, default=engines.CHUNK_SIZE,
                   help="texts per unit of work and of the partial file (%(default)s)")
    c.add_argument("--max-chars", type=int, default=readers.MAX_CHARS,
                   help="longer texts are skipped and reported (%(default)s)")
    c.add_argument("--js-rows", type=int, default=sums.JS_ROWS, help="query rows per text in the head-to-head "
                   "JS matrix (evenly spaced; %(default)s; 0: no JS matrix)")
    c.add_argument("--restart", action="store_true", help="ignore (and replace) OUT.partial.json")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    m = sub.add_parser("mcp", help="the analyses as Model Context Protocol tools, for agents",
                       description="An MCP server (the official SDK): every analysis a tool with typed inputs and "
                                   "compact outputs, the served models and finished atlases as resources. stdio for "
                                   "a client that starts it; http: streamable HTTP at http://HOST:PORT/mcp.")
    m.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=8765)
    m.add_argument("--model", action="append", default=None, metavar="MODEL",
                   help="a model to load in this process (repeatable); replaces ATTNSCOPE_MODELS")
    m.add_argument("--url", help="answer the tools with a running attnscope server's API instead (no model loaded)")
    m.add_argument("--token", default=None, metavar="TOKEN",
                   help="http: every request must send Authorization: Bearer TOKEN (default: ATTNSCOPE_MCP_TOKEN); "
                        "required for a --host beyond loopback (0.0.0.0, a host name)")
    m.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                   help="http: on SIGTERM, what open sessions and calls in flight get to end before they are "
                        "cancelled, and as long again before the process exits anyway (default: python/agents.py GRACE_S)")
    args = parser.parse_args(argv)
    from ..app.settings import get_settings, setup_logging
    if args.cmd in ("serve", "mcp") and args.model:   # the app (imported by uvicorn) reads its settings from the environment
        os.environ["ATTNSCOPE_MODELS"] = ",".join(args.model)
        get_settings.cache_clear()
    if args.cmd == "serve" and args.compute_dtype:
        os.environ["ATTNSCOPE_COMPUTE_DTYPE"] = args.compute_dtype
        get_settings.cache_clear()
    setup_logging()

    if args.cmd == "serve":  # uvicorn with limits and timeouts on every connection (app/server.py)
        from ..app.server import serve
        serve(get_settings(), args.host, args.port, args.log_level)
        return 0
    if args.cmd == "mcp":      # stdout is the protocol's: logs go to stderr (setup_logging)
        from .agents import main as mcp_main
        mcp_main("stdio" if args.transport == "stdio" else "http", args.host, args.port, args.url, args.grace,
                 args.token)
        return 0
    from ..sources import ZOO, ModelUnavailable
    if args.cmd == "export":
        for model_id in args.models or list(ZOO):
            rt = _runtime(model_id)
            for stages in (False, True):
                print(rt.onnx_path(stages))
        return 0
    if args.cmd == "corpus":
        return _corpus(args)
    try:
        return _attend(args)
    except (ValueError, KeyError, ModelUnavailable) as e:
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
