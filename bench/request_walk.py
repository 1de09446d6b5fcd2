"""Which of attnscope's files and functions one API request passes through, in-process (a real app, a real model).

    python bench/request_walk.py                       # POST /api/attention for SmolLM2, a fresh text
    python bench/request_walk.py --model minilm --endpoint /api/stages --body '{"layer": 0, "head": 0}'

A profiler hook on every thread (the event loop's and the worker threads' that run the model and encode the
answer) records each call into a function of the package. Printed: the files and functions visited, how often
the request *entered* each file, i.e. a call from another of the package's files into it (a file entered five
times is one the request bounces back into; a coroutine counts once, not at every resumption; a helper called once
per token counts once per token), and by how many distinct calls (caller -> callee) it is entered. The model is loaded and warmed first; the traced request uses a text
the server has not seen, so it runs the model rather than answering from the cache. The app computes no circuits in the
background (`precompute_mb` 0), which the hook would otherwise count as the request's work.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import threading
from collections import Counter
from pathlib import Path



RESUMABLE = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--endpoint", default="/api/attention")
    ap.add_argument("--body", default="{}", help="JSON merged into the request body")
    ap.add_argument("--list", action="store_true", help="print every function visited")
    ap.add_argument("--pair", action="store_true", help="the texts go in `clean` and `corrupt` (patching, path "
                    "patching), each pair of one token count")
    args = ap.parse_args()

    import attnscope
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    pkg = Path(attnscope.__file__).resolve().parent

    def ours(path: Path) -> bool:
        """A file of the package itself (not its tests, benches or a virtual environment inside the checkout)."""
        if pkg not in path.parents or path.name.startswith("<"):
            return False
        top = path.relative_to(pkg).parts[0]
        return not top.startswith(".") and top not in ("tests", "bench")
    # no circuits computed in the background at start (precompute_mb 0): the hook traces every thread, and a
    # model's weight products still under way would be counted as the request's
    app = create_app(Settings(models=[args.model], default_model=args.model, precompute_mb=0))
    body = {"model": args.model, **json.loads(args.body)}
    calls: list[tuple[str, str, str | None, str | None]] = []    # (file, function, caller's file, caller)
    tracing = threading.Event()
    started: list = []                                 # coroutine and generator frames seen (kept alive: ids stay unique)

    def hook(frame, event, _arg):
        if event != "call" or not tracing.is_set():
            return
        if frame.f_code.co_filename.startswith("<"):         # <frozen ...>, <string>: not a file of ours
            return
        path = Path(frame.f_code.co_filename).resolve()
        if not ours(path):
            return
        name = frame.f_code.co_name
        if name.startswith("<"):                       # comprehensions, lambdas, module bodies
            return
        if frame.f_code.co_flags & RESUMABLE:          # a coroutine or generator: its first start only, not each
            if any(f is frame for f in started):       # resumption after an await or a yield
                return
            started.append(frame)
        caller = frame.f_back
        while caller is not None and not ours(Path(caller.f_code.co_filename).resolve()):
            caller = caller.f_back                     # the nearest caller in the package, through libraries
        calls.append((str(path.relative_to(pkg)), frame.f_code.co_qualname,
                      None if caller is None else str(Path(caller.f_code.co_filename).resolve().relative_to(pkg)),
                      None if caller is None else caller.f_code.co_qualname))

    threading.setprofile(hook)          # every thread started from here on: the portal's, anyio's workers
    sys.setprofile(hook)
    with TestClient(app) as client:
        client.post(args.endpoint, json={**body, **texts(args.pair, "A warm-up text, so that sessions are open.")})
        tracing.set()
        r = client.post(args.endpoint, json={**body, **texts(args.pair, "The traced request reads a text nobody "
                                                                        "sent before.")})
        tracing.clear()
    sys.setprofile(None)
    threading.setprofile(None)
    if r.status_code != 200:
        print(f"the request failed: {r.status_code} {r.text[:300]}", file=sys.stderr)
        return 1
    files = Counter(f for f, _, _, _ in calls)
    counted = Counter((f, fn) for f, fn, _, _ in calls)
    functions = sorted(counted)
    entries = Counter(f for f, _, caller, _ in calls if caller != f)
    edges = {(cf, cfn, f, fn) for f, fn, cf, cfn in calls if cf != f}     # distinct calls from one file into another
    into = Counter(f for _, _, f, _ in edges)
    print(f"POST {args.endpoint} ({args.model}): {len(files)} files, {len(functions)} functions of the package, "
          f"{len(edges)} distinct calls from one file into another")
    print(f"{'file':<28} {'functions':>9} {'entered':>8} {'by calls':>9}")
    for f in sorted(files):
        print(f"{f:<28} {sum(1 for g, _ in functions if g == f):>9} {entries[f]:>8} {into[f]:>9}")
    if args.list:
        for f, fn in functions:
            print(f"  {f}: {fn}" + (f"  x{counted[f, fn]}" if counted[f, fn] > 1 else ""))
    return 0


def texts(pair: bool, text: str) -> dict:
    """The request's text, or (--pair) a clean and a corrupt text of the same token count: the text and the text
    with its first and last words swapped."""
    if not pair:
        return {"text": text}
    words = text.rstrip(".").split()
    return {"clean": text, "corrupt": " ".join([words[-1], *words[1:-1], words[0]]) + "."}


if __name__ == "__main__":
    sys.exit(main())
