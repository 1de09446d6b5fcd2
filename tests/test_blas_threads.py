"""A walk's value norms run NumPy's BLAS on one thread (runtime/options.one_blas_thread), in a server where walks run
in worker threads, several at once: every product inside sees one thread, and the process's BLAS is given back as
it was. (Before: overlapping contexts of three threads saw two threads inside, and left the process on one.)"""
from __future__ import annotations

import threading

import numpy  # noqa: F401  (the BLAS threadpoolctl finds is the one NumPy loaded)
from threadpoolctl import threadpool_info

from attnscope.runtime.options import one_blas_thread


def blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_one_blas_thread_in_overlapping_threads_and_the_count_given_back():
    before = blas_threads()
    seen, start = [], threading.Barrier(3)

    def walk():
        start.wait()
        for _ in range(100):
            with one_blas_thread():
                seen.extend(blas_threads())

    threads = [threading.Thread(target=walk) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(seen) <= {1} and blas_threads() == before, (set(seen), before, blas_threads())
