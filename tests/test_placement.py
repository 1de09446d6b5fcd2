"""A session that takes every core places its threads (runtime/options.placement): onnxruntime's pool threads one on
each core but the first, the thread that calls a run on the first for the run's duration and back on its own cores
after it. Unplaced, the scheduler put the pool's thread on its waker's core whenever the other was busy, and a
server's run waited out whole time slices (the docstring of placement has the measurements)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from attnscope.runtime.options import on_core, placement
from tests.conftest import DEVICE, PROVIDERS, ROOT


@pytest.mark.parametrize("threads, allowed, placed", [
    (0, [0, 1], (0, (1,))),                     # one thread per core: the caller on the first, the pool on the rest
    (2, [4, 6], (4, (6,))),
    (0, [3, 5, 7, 9], (3, (5, 7, 9))),
    (4, [3, 5, 7, 9], (3, (5, 7, 9))),
    (1, [0, 1], (None, ())),                    # one thread: nothing to place
    (0, [5], (None, ())),
    (2, [0, 1, 2, 3], (None, ())),              # fewer threads than cores: processes that share the machine
    (3, [0, 1], (None, ())),                    # more threads than cores
])
def test_placement_of_a_sessions_threads(threads, allowed, placed):
    assert placement(threads, allowed) == placed


def test_on_core_holds_the_thread_there_and_gives_its_cores_back():
    def check():
        own = os.sched_getaffinity(0)
        core = max(own)
        with on_core(core):
            inside = os.sched_getaffinity(0)
        with pytest.raises(RuntimeError), on_core(core):       # a run that fails gives them back too
            raise RuntimeError("the run failed")
        with on_core(None):
            untouched = os.sched_getaffinity(0)
        with on_core(max(range(os.cpu_count() or 1)) + 4096):   # a core it may not use: left where it is
            elsewhere = os.sched_getaffinity(0)
        return own, inside, os.sched_getaffinity(0), untouched, elsewhere

    got = []
    thread = threading.Thread(target=lambda: got.append(check()))   # a worker thread, as the server's runs are
    thread.start()
    thread.join()
    own, inside, after, untouched, elsewhere = got[0]
    assert inside == {max(own)} and after == untouched == elsewhere == own
    assert os.sched_getaffinity(0) == own                        # another thread's mask never moved this one's


# The first two cores of the machine for a process of its own (a test part may hold one), as the scripts below start.
TWO_CORES = r"""
import os
online = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
cores = []
for cpu in online:                          # the first two cores this process may be moved to
    try:
        os.sched_setaffinity(0, set(cores) | {cpu})
        cores.append(cpu)
    except OSError:
        pass
    if len(cores) == 2:
        break
os.sched_setaffinity(0, set(cores))
"""

# A process of its own on the first two cores of the machine (a test part may hold one): a Session on a small graph,
# on the suite's providers (argv[1]), its threads' cores as /proc shows them (onnxruntime's pool, and the threads NumPy
# and onnxruntime start on import), and the caller's cores as they are when onnxruntime's run starts and after it.
SESSION = TWO_CORES + r"""
import json, sys, threading
import numpy as np
from onnx import TensorProto, helper
from attnscope.graphs.builder import Graph, model_proto
from attnscope.runtime.sessions import Session

g = Graph()
g.op("MatMul", "x", "x", out="y")
value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [256, 256])
graph = model_proto(g, [value("x")], [value("y")], "square").SerializeToString()
sess = Session(graph, json.loads(sys.argv[1]), 0)
seen = []
run = sess.ort.run_with_iobinding
sess.ort.run_with_iobinding = lambda *a: (seen.append(sorted(os.sched_getaffinity(0))), run(*a))[1]
x = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)
out = []
worker = threading.Thread(target=lambda: out.append((sess.run(["y"], {"x": x})[0], sorted(os.sched_getaffinity(0)))))
worker.start()
worker.join()
y, after = out[0]
threads = []
for t in os.listdir("/proc/self/task"):         # every thread but this one (the worker may be on its way out)
    try:
        if int(t) != os.getpid():
            listed = open(f"/proc/self/task/{t}/status").read().split("Cpus_allowed_list:")[1].split()[0]
            threads.append(sorted(c for part in listed.split(",") for a, _, b in [part.partition("-")]
                                  for c in range(int(a), int(b or a) + 1)))
    except FileNotFoundError:
        pass
print(json.dumps({"cores": cores, "caller": sess.caller, "threads": threads, "seen": seen, "after": after,
                  "right": bool(np.allclose(y, x @ x, rtol=1e-4, atol=1e-3))}))
"""


def test_a_session_places_its_pool_and_its_runs_caller():
    got = json.loads(subprocess.run([sys.executable, "-c", SESSION, json.dumps(PROVIDERS)], check=True, cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip().splitlines()[-1])
    cores = got["cores"]
    assert got["right"] and got["after"] == cores            # the run's answer, and the caller's cores given back
    pinned = sorted(t for t in got["threads"] if t != cores)        # threads held on fewer cores than the process
    if len(cores) == 2 and DEVICE == "cpu":    # two threads on two cores: the pool's on the second, the caller first
        assert got["caller"] == cores[0] and pinned == [[cores[1]]] and got["seen"] == [[cores[0]]]
    else:                            # one core, or a GPU's session (its CPU threads are the scheduler's): none placed
        assert got["caller"] is None and pinned == [] and got["seen"] == [cores]


# A server's sessions as ATTNSCOPE_PLACE_THREADS has them (Settings.place_threads), after an answer.
APP = TWO_CORES + r"""
import json, sys
from fastapi.testclient import TestClient
from attnscope.app.main import create_app
from attnscope.app.settings import Settings

with TestClient(create_app(Settings(models=["tiny-gpt"], place_threads=sys.argv[1] == "true"))) as c:
    c.post("/api/attention", json={"model": "tiny-gpt", "text": "The cat sat on the mat"}).raise_for_status()
    sessions = c.app.state.service.runtimes["tiny-gpt"]._sessions.values()
    print(json.dumps({"cores": cores, "callers": sorted({s.caller for s in sessions}, key=str)}))
"""


@pytest.mark.parametrize("placed", ["true", "false"])
def test_the_setting_places_a_servers_sessions_or_leaves_them(placed):
    got = json.loads(subprocess.run([sys.executable, "-c", APP, placed], check=True, cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip().splitlines()[-1])
    placing = placed == "true" and len(got["cores"]) == 2 and DEVICE == "cpu"      # a GPU's sessions: never
    assert got["callers"] == ([got["cores"][0]] if placing else [None])
