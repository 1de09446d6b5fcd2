"""The whole suite, as `make test` runs it: three pytest processes, the first two side by side.

    .venv/bin/python tests/parts.py

Parts 0 and 1 (the tests not marked own_process) run at once, each pinned to half the cores this process may use
(its affinity, as a container's cpuset sets it): on a 1-core machine, one after the other. Pinned, every thread
pool follows its cores (onnxruntime's intra-op threads, torch's and OpenBLAS's: one thread each on a 2-core
machine), so no thread spins on a core the other part is using. On this 2-core VM, side by side they took 670 s and
647 s (the whole run: 15.3 min) against ~1,110 s one after the other (22.3 min); unpinned, side by side, they had
taken 954 s with both cores 100 % busy. Each part writes to test-artifacts/part-N.log, printed when both are done.
  0: the browser tests, tests/test_[abg]* and tests/test_c[hl]*  (chromium runs ~1.4x slower on one core: the split
     evens the parts: 886 + 37 and 952 - 37 s in the last clean-clone run)
  1: tests/test_co*, tests/test_[d-f]* and tests/test_[h-z]*
  own_process: the tests marked own_process (Gemma 3 270M read twice, ~15 GB at its peak; the big-model checkpoints,
     up to ~11 GB on disk), alone on every core once the others have given back what they held, collected from
     the files that name the mark.
Exit status 0 when every part passed; pytest's 5 (nothing collected) counts as a failure.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
PARTS = [["tests/browser", "tests/test_[abg]*.py", "tests/test_c[hl]*.py"],
         ["tests/test_co*.py", "tests/test_[d-f]*.py", "tests/test_[h-z]*.py"]]
NOTHING_COLLECTED = 5


def files(patterns: list[str]) -> list[str]:
    """The patterns' paths, relative to the checkout (a folder stands for itself)."""
    return [p for pattern in patterns for p in (sorted(str(f.relative_to(ROOT)) for f in ROOT.glob(pattern))
                                                if any(c in pattern for c in "*?[") else [pattern])]


def halves(cores: set[int]) -> list[set[int]]:
    """The cores in two halves, one per part (one half only on a 1-core machine)."""
    c = sorted(cores)
    return [set(h) for h in (c[:len(c) // 2], c[len(c) // 2:]) if h]


def pytest(args: list[str], **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", *args], cwd=ROOT, **popen)


def failed(part: str, rc: int) -> bool:
    if rc == NOTHING_COLLECTED:
        print(f"ERROR: no tests were collected in part {part}", flush=True)
    return rc != 0


def main() -> int:
    ARTIFACTS.mkdir(exist_ok=True)
    pins = halves(os.sched_getaffinity(0))
    runs = []
    for i, patterns in enumerate(PARTS):
        cpus = pins[i % len(pins)]
        log = ARTIFACTS / f"part-{i}.log"
        print(f"part {i}: {' '.join(patterns)} (cores {','.join(map(str, sorted(cpus)))}, log {log.relative_to(ROOT)})",
              flush=True)
        with open(log, "wb") as out:   # the child holds its own copy of the file
            proc = pytest(["-m", "not own_process", *files(patterns)], stdout=out, stderr=subprocess.STDOUT,
                          preexec_fn=lambda cpus=cpus: os.sched_setaffinity(0, cpus))
        runs.append((i, log, proc))
        if len(pins) == 1:             # one core: one part after the other
            proc.wait()
    bad = False
    for i, log, proc in runs:
        rc = proc.wait()
        print(f"==== part {i}: exit {rc}", flush=True)
        sys.stdout.buffer.write(log.read_bytes())
        sys.stdout.flush()
        bad |= failed(str(i), rc)
    own = [f for f in files(["tests/test_*.py", "tests/browser/test_*.py"]) if "own_process" in (ROOT / f).read_text()]
    bad |= failed("own_process", pytest(["-m", "own_process", *own]).wait())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
