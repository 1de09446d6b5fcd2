"""Runs flush denormals to zero (runtime/sessions.py FLUSH_DENORMALS): a peaked head's attention weights below
float32's normal range (1.2e-38) come out 0, every other number of the run as it was, and the flush is the runs'
alone: the thread that runs or opens a session keeps its own floating-point environment for its NumPy."""
from __future__ import annotations

import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from attnscope.runtime import sessions
from attnscope.runtime.sessions import denormals_flushed
from attnscope.sources.resolve import resolve
from tests.conftest import CACHE, ROOT

# The calling thread's flush is set through the C library's fenv on Linux x86-64 (where CI runs: there it must work);
# on another platform runs keep denormals, and each test holds what the runs promise there.
X86_LINUX = sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64")
NORMAL = np.finfo(np.float32).tiny                     # 1.18e-38: below it, a float32 is a denormal


def keeps_denormals() -> bool:
    """Whether this thread's NumPy keeps a denormal (1e-39 times 1 is itself, not 0)."""
    return bool((np.full(4, 1e-39, np.float32) * np.float32(1)).all())


def test_the_flush_is_available_on_linux_x86_64():
    """On Linux x86-64 the C library's fenv sets the flush: the platform check finds it (a None there would turn
    every run's flush off in silence); elsewhere runs keep denormals and ask onnxruntime for no flush."""
    assert (sessions._libm() is not None) == X86_LINUX == sessions.flushing()


def test_the_flush_holds_inside_the_context_alone_in_every_thread():
    assert keeps_denormals()

    def run(_):
        seen = []
        for _ in range(50):
            with denormals_flushed():
                seen.append(keeps_denormals())
                with denormals_flushed():               # nested: the outer one's flush stays
                    seen.append(keeps_denormals())
                seen.append(keeps_denormals())
            seen.append(keeps_denormals())
        return seen

    with ThreadPoolExecutor(4) as pool:                 # four threads at once
        seen = list(pool.map(run, range(4)))
    inside = not sessions.flushing()                    # elsewhere the context changes nothing
    assert seen == [[inside, inside, inside, True] * 50] * 4 and keeps_denormals()


def test_opening_the_first_session_leaves_the_threads_environment():
    """onnxruntime sets the flush for good on the thread that opens a process's first session when that session asks
    it: a fresh process opens one (the float16 cast) and its NumPy still keeps denormals."""
    code = ("import numpy as np\n"
            "from attnscope.runtime.sessions import open_helpers, to_float16\n"
            "x = np.full(4, 1e-39, np.float32)\n"
            "assert (x * np.float32(1)).all()\n"
            "open_helpers()                                     # the process's first session, as a server opens it\n"
            "assert (x * np.float32(1)).all(), 'opening the session left the flush on'\n"
            "assert (to_float16(np.full(4, 1e-6, np.float32)) > 0).all()   # float16's subnormals are not flushed\n"
            "assert (x * np.float32(1)).all(), 'the session left the flush on'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """The 2-layer Llama-shaped folder of the 32k browser test, q and k drawn wide, and a 700-token text."""
    from tests.browser.conftest import tiny_llama
    from tests.test_rope_scaling import long_text
    folder = tiny_llama(tmp_path_factory.mktemp("denormals") / "peaked", peaked=True)
    return folder, long_text(folder, 700)


def test_a_peaked_heads_weights_below_the_normal_range_are_zero_and_nothing_else_moves(peaked, monkeypatch):
    from attnscope.runtime import Runtime
    folder, text = peaked
    runs = {}
    for flush in (False, True):
        monkeypatch.setattr(sessions, "FLUSH_DENORMALS", flush)
        rt = Runtime(resolve(f"peaked={folder}", cache=CACHE), cache_dir=CACHE, threads=2)
        [res] = rt.run([text])
        runs[flush] = res
    kept, flushed = runs[False].attentions, runs[True].attentions
    if not X86_LINUX:                                   # runs keep denormals there: the two runs are one
        np.testing.assert_array_equal(flushed, kept)
        return
    tiny = (kept > 0) & (kept < NORMAL)
    assert tiny.sum() > 1000, tiny.sum()                # peaked: the test means something (the kept run has them)
    assert not ((flushed > 0) & (flushed < NORMAL)).any()
    assert (flushed[tiny] == 0).all()
    np.testing.assert_array_equal(flushed[~tiny], kept[~tiny])
    np.testing.assert_allclose(runs[True].hidden, runs[False].hidden, rtol=0, atol=1e-6)
    np.testing.assert_allclose(runs[True].next_token_logits, runs[False].next_token_logits, rtol=0, atol=1e-6)
