"""The memory a run hands back is faulted in before the run (runtime/tensors.Reserve): onnxruntime's threads write a
result's attention into pages written through while the cores were idle, instead of faulting each page in the middle
of the run; the reserve writes nothing while a run is under way, and a result holds (and is charged) its buffer."""
from __future__ import annotations

import ctypes
import time

import numpy as np

from attnscope.runtime.results import footprint, root
from attnscope.runtime.tensors import RESERVE, Reserve

PAGE = 4096


def _ready(reserve: Reserve, kind: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with reserve._changed:
            if kind in reserve._ready:
                return True
        time.sleep(0.01)
    return False


def test_size_classes_are_pages_at_most_an_eighth_over():
    for n in range(Reserve.MIN_BYTES, Reserve.MAX_BYTES + 1, 104_729):     # the sizes it reserves
        kind = Reserve.size_class(n)
        assert kind % PAGE == 0 and n <= kind <= n + n // 8
    H = 12                                       # MiniLM's [H, T, T] float32 block, texts a few tokens apart: one class
    assert len({Reserve.size_class(H * T * T * 4) for T in range(129, 133)}) == 1


def test_the_reserve_writes_when_no_run_is_under_way_and_hands_that_memory_out():
    reserve = Reserve()
    reserve.QUIET = 0.05
    shape, dtype = (3, 128, 200), np.float32
    kind = reserve.size_class(int(np.prod(shape)) * 4)
    first = reserve.take(shape, dtype)                   # nothing ready: np.empty's array, memory of its own
    assert first.shape == shape and first.dtype == dtype and first.base is None
    with reserve.running():                              # a run under way: nothing is written, however long it takes
        time.sleep(4 * reserve.QUIET)
        assert not reserve._ready
    assert _ready(reserve, kind)                         # written through once the cores have been idle QUIET
    buffer = reserve._ready[kind]
    resident = _resident(buffer)
    second = reserve.take(shape, dtype)
    assert root(second) is buffer and second.shape == shape and second.dtype == dtype and second.flags.writeable
    assert kind not in reserve._ready                    # handed out once
    second[...] = 7
    assert footprint(second) >= buffer.nbytes >= second.nbytes       # the output holds, and is charged, the buffer
    assert resident == 1.0                               # every page faulted in before it was handed out
    small = reserve.take((4, 4), dtype)                  # under MIN_BYTES: never reserved
    assert small.base is None


def test_the_reserve_keeps_the_last_few_sizes_within_its_budget():
    reserve = Reserve()
    reserve.QUIET = 0.01
    sizes = [(1 << 18) * k for k in (1, 2, 3, 5, 7, 11)]
    for n in sizes:
        reserve.take((n,), np.uint8)
    with reserve.running():
        pass
    kinds = [reserve.size_class(n) for n in sizes[-reserve.MAX_KINDS:]]
    assert all(_ready(reserve, k) for k in kinds)
    time.sleep(0.1)
    assert sorted(reserve._ready) == sorted(kinds) and sum(reserve._ready) <= reserve.MAX_BYTES


def _resident(a: np.ndarray) -> float:
    """The share of an array's pages in memory now (mincore(2)): 1.0 once every page is faulted in."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    start = a.ctypes.data // PAGE * PAGE
    n = -(-(a.ctypes.data + a.nbytes - start) // PAGE)
    pages = (ctypes.c_ubyte * n)()
    assert libc.mincore(start, n * PAGE, pages) == 0, ctypes.get_errno()
    return sum(p & 1 for p in pages) / n


def test_a_runs_attention_goes_into_memory_faulted_in_before_the_run(minilm):
    """The served graph's attentions [L, B, H, T, T] (MiniLM, ~96 tokens: ~1.7 MB) are a Session output of their
    own memory: the run after one of that size writes into a buffer the reserve faulted in (every page resident
    before the run) once the first was over, and its numbers are the run's, bit for bit."""
    text = ("The animal didn't cross the street because it was too tired, and the road was wide and dark. " * 4)[:400]
    enc = minilm.encode(text)
    first = minilm.forward([enc])[0]
    kind = RESERVE.size_class(first.attentions.nbytes)
    assert _ready(RESERVE, kind)
    buffer = RESERVE._ready[kind]
    assert _resident(buffer) == 1.0
    second = minilm.forward([enc])[0]
    assert root(second.attentions) is buffer
    np.testing.assert_array_equal(second.attentions, first.attentions)
    assert footprint(second.attentions) >= kind
