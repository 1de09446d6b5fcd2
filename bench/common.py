"""Shared by the bench scripts: texts of an exact token length, a uvicorn server on loopback, and the inputs of a
raw onnxruntime session on a served graph."""
from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
         "in the old market square near the river").split()


def session_feeds(rt, enc, sess=None, causal: bool | None = None) -> dict:
    """One encoded text's inputs to the served graph (Runtime.feeds: ids, token types, mask, lengths, no head
    mask); with `sess`, only those that session takes (the no-stages graph of an encoder takes no lengths), and the
    model's arrays a raw onnxruntime session reads as inputs (graphs hold no weights: runtime/tensors.Weights binds
    them for the app's sessions)."""
    import numpy as np
    T = len(enc.ids)
    feeds = rt.feeds(np.array([enc.ids]), np.array([enc.type_ids]),
                     rt.build_mask([T], rt.cfg.causal if causal is None else causal), [T])
    if sess is None:
        return feeds
    names = {i.name for i in sess.get_inputs()}
    return {k: v for k, v in feeds.items() if k in names} | {n: rt.weights.array(n) for n in names
                                                             if n not in feeds and rt.weights.binds(n)}


def median_ms(fn, repeats: int, warmup: int = 2) -> float:
    """Median wall time of fn() in milliseconds, after warm-up calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """The first quartile, the median and the third quartile (one value: itself three times)."""
    return tuple(statistics.quantiles(values, n=4)) if len(values) > 1 else (values[0],) * 3


def wait_until_idle(limit: float) -> None:
    """Wait (at most `limit` seconds) until this process is the only one runnable (/proc/loadavg)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with open("/proc/loadavg") as f:
            if int(f.read().split()[3].split("/")[0]) <= 1:
                return
        time.sleep(0.05)


def text_of_tokens(rt, n: int) -> str:
    """A text that the runtime's tokenizer turns into exactly n tokens (specials included)."""
    words = []
    while True:
        e = rt.encode(" ".join(words + [WORDS[len(words) % len(WORDS)]]))
        if len(e.ids) > n or e.truncated:   # the runtime truncates at max_tokens: stop there too
            break
        words.append(WORDS[len(words) % len(WORDS)])
    if len(rt.encode(" ".join(words)).ids) < n:   # the next word took two tokens: end on a one-token word
        words += next(([w] for w in WORDS if len(rt.encode(" ".join(words + [w])).ids) == n), [])
    text = " ".join(words)
    assert len(rt.encode(text).ids) == n, (n, len(rt.encode(text).ids))
    return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float = 180, log: Path | None = None) -> None:
    """Poll /healthz until every model is loaded (it answers at once, `status` "loading" until then); raise if the
    process exits or the time runs out (with the end of the server's stderr `log`, when given)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.get(url + "/healthz", timeout=2)
            if r.status_code == 200 and r.json()["status"] == "ok":
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("server did not start" + (f":\n{log.read_text()[-2000:]}" if log else ""))
        time.sleep(0.2)


@contextlib.contextmanager
def server(env: dict[str, str] | None = None, timeout: float = 180):
    """`attnscope serve` (uvicorn with the app's connection limits, app/server.py) on a free 127.0.0.1 port;
    yields (base_url, pid); always stopped. `timeout`: seconds to wait for it to answer /healthz."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "attnscope", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], cwd=ROOT,
                            # no answers kept on disk (app/kept.py) unless asked: a bench's repeated long run, or a
                            # test's, would otherwise be read back from an earlier session's files
                            env={"ATTNSCOPE_KEPT_MB": "0", **os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc, timeout)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


CACHE = Path(os.environ.setdefault("ATTNSCOPE_CACHE", str(ROOT / ".cache" / "onnx")))  # shared with the tests


# The benches time MiniLM up to its 512 positions; by default it stops at the 256 tokens it was trained on.
WIDEST = {"minilm": 512}
WIDEST_ENV = {"ATTNSCOPE_MAX_TOKENS": ",".join(f"{k}={v}" for k, v in WIDEST.items())}   # the same, for a server


def runtime(model_id: str, **options):
    """A zoo model on the benches' (and tests') graph cache, at its widest token limit (WIDEST)."""
    from dataclasses import replace

    from attnscope.sources import zoo
    from attnscope.runtime import Runtime
    spec = zoo.get(model_id)
    return Runtime(replace(spec, max_tokens=WIDEST.get(model_id, spec.max_tokens)), cache_dir=CACHE, **options)


# headless chromium for the page benches (bench/browser.py, bench/long_page.py)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DRAWN_JS = """(view) => {
  const v = document.querySelector('.view:not([hidden])');
  return !!v && v.dataset.view === view && v.dataset.state === location.search
    && document.getElementById('view-area').getAttribute('aria-busy') === 'false';
}"""


def sgemm_gflops(n: int = 2048, repeats: int = 5) -> float:
    """This machine's float32 matrix product rate now, GFLOP/s (NumPy, its threads, n x n): what a bench's times are
    relative to."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return 2 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e9
