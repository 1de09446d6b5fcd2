"""Shared pytest setup, in sections: environment, model runtimes (and, later, live server, browser)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# ---- environment ---------------------------------------------------------------------------
# Exported ONNX graphs go to a stable, gitignored folder in the repo, so repeated runs reuse them
# (the cache key covers weights and exporter source, so stale graphs are never used). Set at
# import time, before any test builds a Runtime; an ATTNSCOPE_CACHE already set wins.
CACHE = Path(os.environ.setdefault("ATTNSCOPE_CACHE", str(ROOT / ".cache" / "onnx")))
# The suite's servers and in-process apps serve the quick models; SmolLM2 (30 layers, 0.5 GB, ~9 s to open) has
# its own tests and its own live server (live_server_smollm2). An ATTNSCOPE_MODELS already set wins.
os.environ.setdefault("ATTNSCOPE_MODELS", "minilm,tiny-gpt,induction")
# No long answers kept on disk (app/kept.py) by the suite's servers and apps: a long run read back from an earlier
# session's files would skip the progress and cancel the tests watch; the tests of kept answers ask for them.
os.environ.setdefault("ATTNSCOPE_KEPT_MB", "0")

from attnscope.runtime.options import default_providers, device_of  # noqa: E402 (after the environment)

# What the suite's sessions run on: the CUDA provider first where onnxruntime-gpu and a GPU are present, as the app
# chooses (issue 38: tests never assume the CPU). DEVICE: where a session's bound weights live.
PROVIDERS = default_providers()
DEVICE = device_of(PROVIDERS)


# ---- model runtimes ------------------------------------------------------------------------
# Zoo models too big to keep in the suite's process (Gemma 3 270M: ~10 GB at the peak of its parity tests): their
# tests are marked own_process, and `make test` runs them in a pytest process of their own.
OWN_PROCESS = ("gemma3",)


class _Runtimes(dict):
    """id -> Runtime, each built on first use (SmolLM2 holds 0.5 GB: only tests that use it pay for it)."""

    def __missing__(self, model_id):
        from attnscope.sources import zoo
        from attnscope.runtime import Runtime

        self[model_id] = rt = Runtime(zoo.get(model_id), cache_dir=CACHE)
        return rt

    def values(self):
        """Every zoo model but those whose tests run in a pytest process of their own (OWN_PROCESS)."""
        from attnscope.sources import zoo

        return [self[model_id] for model_id in zoo.ZOO if model_id not in OWN_PROCESS]


@pytest.fixture(scope="session")
def runtimes():
    """id -> Runtime for every zoo model, built once per session on first use (sessions open lazily)."""
    return _Runtimes()


@pytest.fixture(scope="session")
def hf_smollm2():
    """transformers' own reading of SmolLM2's GGUF, eager attention, float32 (tests/references.hf_from_gguf: kept in
    the suite's cache after the first session's read): the independent reference of every SmolLM2 test, loaded once
    per session."""
    from attnscope.sources import zoo

    from .references import hf_from_gguf
    return hf_from_gguf(zoo.smollm2_path(), CACHE)


@pytest.fixture(scope="session")
def minilm(runtimes):
    """The real all-MiniLM-L6-v2 Runtime."""
    return runtimes["minilm"]


@pytest.fixture(scope="session")
def local_smollm2(runtimes, tmp_path_factory):
    """The in-process Python API (attnscope.Model) on the suite's SmolLM2 and tiny-gpt Runtimes (no second load), its
    jobs in a temporary folder: shared by the tests that compare it with the server, so their runs are cached once."""
    import attnscope
    from attnscope.app.settings import Settings

    settings = Settings(models=["smollm2", "tiny-gpt"], default_model="smollm2", cache=CACHE,
                        jobs_dir=tmp_path_factory.mktemp("local-jobs"))
    model = attnscope.Model(runtimes["smollm2"], settings=settings)
    model.service.runtimes["tiny-gpt"] = runtimes["tiny-gpt"]
    yield model
    model.close()


@contextlib.contextmanager
def serving(folders: dict[str, Path], **settings):
    """The app in this process (a TestClient) serving each checkpoint folder by path, under its key: how the family
    tests (test_checkpoints, test_decoder_families, test_rope_scaling, test_gemma, test_encdec) serve theirs."""
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    entries = [f"{name}={path}" for name, path in folders.items()]
    with TestClient(create_app(Settings(models=entries, cache=CACHE, **settings))) as c:
        yield c


# ---- live server ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def live_server():
    """A real uvicorn serving attnscope.app.main:app on a free loopback port; yields its base URL."""
    from bench.common import server

    # the fuzz tests post jobs here: they are checked and queued, never run (tests/test_atlas.py runs jobs), and the
    # queue has room for all of them, so the README's job examples still get theirs. Generations stop at 16 new
    # tokens (no test here asks for more): the live fuzzers' 256-token cases were most of their time
    with tempfile.TemporaryDirectory() as jobs, \
            server({"ATTNSCOPE_MAX_JOBS_RUNNING": "0", "ATTNSCOPE_MAX_JOBS_QUEUED": "100000",
                    "ATTNSCOPE_MAX_NEW_TOKENS": "16", "ATTNSCOPE_JOBS_DIR": jobs}) as (url, _pid):
        yield url


@pytest.fixture(scope="session")
def live_server_smollm2():
    """A real uvicorn serving SmolLM2 (and tiny-gpt) with default settings otherwise."""
    from bench.common import server

    with tempfile.TemporaryDirectory() as jobs, server({"ATTNSCOPE_MODELS": "smollm2,tiny-gpt",
                                                        "ATTNSCOPE_DEFAULT_MODEL": "smollm2",
                                                        "ATTNSCOPE_JOBS_DIR": jobs}) as (url, _pid):
        yield url


# ---- browser (pytest-playwright on Debian's chromium; never `playwright install`) ------------
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {**browser_type_launch_args, "executable_path": os.environ.get("CHROMIUM", "/usr/bin/chromium"),
            "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def base_url(live_server):
    """Lets browser tests call page.goto("/")."""
    return live_server


@pytest.fixture
def console_errors(page):
    """Console errors, uncaught page errors and failed requests seen while the test ran."""
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"requestfailed: {r.url} {r.failure}"))
    return errors


# ---- ablation in transformers (the independent reference for head masks) --------------------------------
@contextlib.contextmanager
def ablation_hooks(output_projections, d_head: int, heads, mode: str):
    """Knock heads out of a transformers model the way one must once head_mask is gone (transformers v5): a
    forward pre-hook on each layer's output projection replaces the listed heads' slice of its input by zeros
    ("zero") or by that slice's mean over the positions ("mean"). output_projections(layer) -> the module."""
    hooks = []
    for layer in sorted({l for l, _ in heads}):
        mine = [h for l, h in heads if l == layer]

        def pre_hook(module, args, mine=mine):
            (x,) = args
            x = x.clone()
            for h in mine:
                part = x[..., h * d_head:(h + 1) * d_head]
                x[..., h * d_head:(h + 1) * d_head] = 0 if mode == "zero" else part.mean(dim=1, keepdim=True)
            return (x,)
        hooks.append(output_projections(layer).register_forward_pre_hook(pre_hook))
    try:
        yield
    finally:
        for hk in hooks:
            hk.remove()


def in_thread(fn, *args):
    """Run fn in a thread of its own: pytest-playwright's sync API keeps an event loop running in the main thread
    once a browser test has run, so whatever starts an asyncio loop (asyncio.run) must run elsewhere."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


def run_in_fresh_loop(coro):
    """asyncio.run(coro) in a thread of its own (see in_thread)."""
    return in_thread(asyncio.run, coro)
