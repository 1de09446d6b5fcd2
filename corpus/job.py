"""The corpus job: read the texts (corpus/readers.py), run them in chunks on an engine (corpus/engines.py), add up
their per-head sums (corpus/sums.py), and write the means, head-to-head JS distances and a head map.

    job = run_corpus("texts.txt", "minilm", out="minilm.corpus.json")           # engine="local" by default
    job["stats"]["previous_token_mass"][layer][head], job["js_distance"][a][b]  # a, b = layer * H + head

Partial results: after each finished chunk the running sums and the finished chunk numbers are written
(atomically, at most once a second) to OUT.partial.json; running the same job again with the same out resumes
from it, so a crash at 90 % keeps 90 %. The finished job writes OUT and removes the partial file.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..runtime import DEFAULT_CACHE, Runtime
from ..runtime.options import cores
from ..sources import get
from .engines import BATCH_SIZE, CHUNK_SIZE, Chunk, Engine, chunks, ray_start, start
from .errors import Cancelled, CorpusError
from .examples import ExampleOptions
from .readers import MAX_CHARS, Problem, count_records, detect_format, read_corpus
from .sums import JS_ROWS, Sums, head_map

KEPT_PROBLEMS = 1000      # problems listed in the output (all are counted)
SUMS_VERSION = 3          # the partial file's sums: a statistic's sums and counts, as statistics.STATISTICS defines them (3: corpus statistics, top examples)


def default_out(path, model_id: str) -> Path:
    return Path(Path(path).stem + f".{model_id}.corpus.json")


def partial_path(out) -> Path:
    return Path(str(out) + ".partial.json")


TEMPORARY = ".tmp"        # the suffix of replace_atomically's temporary files: a folder's leftovers end in it


def replace_atomically(path, write: Callable[[Path], None]) -> None:
    """write(tmp) into a new temporary file of a unique name beside `path`, then rename it over `path`: a reader
    sees the old file or the new one, never part of one, and writers at once (threads of one process included)
    never share a temporary file; the last rename wins, each wrote a whole file. A failed write leaves nothing."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY)
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, 0o644 & ~_umask())
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, obj) -> None:
    """obj as JSON at `path`, atomically (replace_atomically)."""
    data = json.dumps(obj)
    replace_atomically(path, lambda tmp: tmp.write_text(data))


def _ranges(done: set[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in sorted(done):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _lists(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    return x


def _write_parquet(path: Path, job: dict) -> None:
    """Long form: one row per (stat, layer, head[, key_layer, key_head]); scalars in the schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    H = job["heads"]
    rows = {"stat": [], "layer": [], "head": [], "key_layer": [], "key_head": [], "value": []}

    def put(name, arr, pairs=False):
        arr = np.asarray(arr)
        for idx in np.ndindex(arr.shape):
            a = idx[0] if pairs else idx[0] * H + idx[1]
            rows["stat"].append(name)
            rows["layer"].append(a // H)
            rows["head"].append(a % H)
            rows["key_layer"].append(idx[1] // H if pairs else None)
            rows["key_head"].append(idx[1] % H if pairs else None)
            rows["value"].append(float(arr[idx]))
    for name, v in job["stats"].items():
        put(name, v)
    for tok, v in job["special_token_mass"].items():
        put(f"special_token_mass:{tok}", v)
    for name in ("js_divergence", "js_distance"):
        if job[name] is not None:
            put(name, job[name], pairs=True)
    meta = {k: v for k, v in job.items() if k not in ("stats", "special_token_mass", "js_divergence", "js_distance")}
    table = pa.table(rows).replace_schema_metadata({"attnscope": json.dumps(meta)})
    replace_atomically(path, lambda tmp: pq.write_table(table, tmp))


def run_corpus(path, model_id: str, *, engine: Engine = "local", out=None, sample: int | None = None,
               seed: int = 0, column: str | None = None, fmt: str | None = None, workers: int | None = None,
               batch_size: int = BATCH_SIZE, chunk_size: int = CHUNK_SIZE, max_chars: int = MAX_CHARS,
               js_rows: int = JS_ROWS, restart: bool = False, progress: bool = True,
               on_chunk: Callable[[Chunk, Sums], None] | None = None,
               log: Callable[[str], None] | None = None, runtime=None, cache_dir=None,
               ray_address: str | None = None, examples: ExampleOptions | None = None,
               on_progress: Callable[[int], None] | None = None, nice: int = 0,
               stop: Callable[[], bool] | None = None, pid_folder=None) -> dict:
    """Run the corpus job and write its result to `out` (JSON, or Parquet when out ends in .parquet; default
    INPUT_STEM.MODEL.corpus.json in the current folder). Returns the result (lists, as written).

    workers: local engine, processes (default: one per core; 0 runs in this process); Ray, actors (default: the
    cluster's CPUs). Each worker's onnxruntime gets cores // workers threads (local) or 1 thread (Ray actors,
    one CPU each). on_chunk(chunk, sums) is called after each finished chunk, on_progress(texts done) once the
    partial file is read and after each chunk; either may raise to stop the job (its partial sums are kept).
    examples: keep each head's top examples too (corpus/examples.py; the atlas). nice: the local pool's workers'
    niceness. stop: asked before the first chunk and after each one but the last; True stops the job there
    (Cancelled; its partial sums are kept). A job whose last chunk is done always finishes: a stop asked then came
    too late. pid_folder: the local pool's workers keep a pid file there while they live (engines.run_local), so
    that a server started after this one was killed can find any it left. runtime: an open Runtime of
    this model to use in this process (workers=0), e.g. the server's. ray_address: the Ray cluster to join (the
    CLI passes RAY_ADDRESS); None starts a local one."""
    from tqdm import tqdm

    path = Path(path)
    try:
        spec = get(model_id)
    except KeyError as e:
        raise CorpusError(e.args[0]) from None
    if engine not in ("local", "ray"):
        raise CorpusError(f"engine must be 'local' or 'ray'; got {engine!r}")
    if sample is not None and sample < 1:
        raise CorpusError(f"--sample must be at least 1; got {sample}")
    if batch_size < 1 or chunk_size < 1:
        raise CorpusError("--batch-size and the chunk size must be at least 1")
    if workers is not None and workers < (1 if engine == "ray" else 0):
        raise CorpusError(f"--workers must be at least {1 if engine == 'ray' else 0} for the {engine} engine "
                          f"(0: in this process, local engine only); got {workers}")
    fmt = fmt or detect_format(path)
    records = read_corpus(path, column, fmt, max_chars)     # checks the file and column; reads nothing yet
    out = Path(out) if out else default_out(path, model_id)
    part = partial_path(out)
    st = path.stat() if path.is_file() else None
    job_key = {"sums": SUMS_VERSION, "model": model_id, "input": str(path.resolve()), "size": st and st.st_size,
               "mtime_ns": st and st.st_mtime_ns, "format": fmt, "column": column, "sample": sample, "seed": seed,
               "chunk_size": chunk_size, "max_chars": max_chars, "js_rows": js_rows,
               "examples": examples and vars(examples)}
    say = log or (lambda msg: tqdm.write(f"attnscope corpus: {msg}", file=sys.stderr))
    problems: list[Problem] = []          # the reader's, found again on a resumed run
    refused: list[Problem] = []           # the model's, kept in the partial file

    shown = [0]

    def report(p: Problem) -> None:
        shown[0] += 1
        if shown[0] <= 20:
            say(str(p))
        elif shown[0] == 21:
            say(f"more records skipped; all are counted (and the first {KEPT_PROBLEMS} listed) in {out}")

    def on_problem(p: Problem) -> None:
        problems.append(p)
        report(p)

    total, done = None, set()
    if part.exists() and not restart:
        try:
            saved = json.loads(part.read_text())
        except ValueError:
            saved = None
        if not saved or saved.get("job") != job_key:
            raise CorpusError(f"{part} holds partial results of a different job (input, model or options differ); "
                              f"delete it or pass --restart")
        total = Sums.from_json(saved["sums"])
        done = {i for a, b in saved["done"] for i in range(a, b + 1)}
        refused = [Problem(**p) for p in saved["refused"]]
        say(f"resuming from {part}: {total.texts} texts in {len(done)} chunks already done")

    # the model, built here once so that its ONNX graph is exported once, not by every worker at the same time
    n_cores = cores()
    if runtime is not None and runtime.spec.id != model_id:
        raise CorpusError(f"the runtime given is {runtime.spec.id!r}, not {model_id!r}")
    rt = runtime or Runtime(spec, threads=n_cores if engine == "local" and workers == 0 else 1,
                            cache_dir=cache_dir or DEFAULT_CACHE)
    rt.onnx_path()
    total = total or Sums(rt.cfg.n_layers, rt.cfg.n_heads)
    resumed = total.texts

    unit = "row" if fmt in ("csv", "tsv", "parquet") else "line"
    bar = tqdm(total=min(sample, count_records(path, fmt)) if sample else count_records(path, fmt),
               initial=total.texts, unit="text", desc=model_id, disable=not progress, file=sys.stderr,
               dynamic_ncols=True, smoothing=0.1)

    seen = {"chunks": 0, "read": False}   # the input's chunks so far; read: all of them (the input is read)

    def work() -> Iterator[Chunk]:
        """The chunks still to do, each handed out once the next is known (so that `read` is set when the last
        one is handed out); once the input is read, the bar's total becomes the exact count of texts."""
        texts, ahead = 0, None
        for c in chunks(records, unit, chunk_size, sample, seed, on_problem):
            texts += len(c.texts)
            seen["chunks"] += 1
            if c.index not in done:
                if ahead is not None:
                    yield ahead
                ahead = c
        bar.total = texts
        bar.refresh()
        seen["read"] = True
        if ahead is not None:
            yield ahead

    def stopped() -> None:
        """Raise Cancelled when the caller asks to stop and a chunk is still to do."""
        if stop is not None and not (seen["read"] and len(done) >= seen["chunks"]) and stop():
            raise Cancelled()

    def checkpoint() -> None:
        write_json(part, {"job": job_key, "done": _ranges(done), "sums": total.to_json(),
                           "refused": [vars(p) for p in refused]})

    started, ray_started, last_write, texts_now = time.perf_counter(), False, 0.0, 0
    try:
        if engine == "ray":
            ray_started = ray_start(n_cores, ray_address)
        if on_progress is not None:
            on_progress(total.texts)
        stopped()
        stream, workers, threads = start(engine, work(), model_id, workers, batch_size, js_rows, chunk_size, rt,
                                         say, examples, nice, pid_folder)
        for chunk, sums, worker_problems in stream:
            total.add(sums)
            done.add(chunk.index)
            for p in worker_problems:
                refused.append(p)
                report(p)
            texts_now += sums.texts
            bar.update(sums.texts + len(worker_problems))
            if time.perf_counter() - last_write >= 1.0:
                checkpoint()
                last_write = time.perf_counter()
            if on_chunk is not None:
                on_chunk(chunk, sums)
            if on_progress is not None:
                on_progress(total.texts)
            stopped()
    except BaseException as e:
        bar.close()
        if done:
            checkpoint()
            say(f"stopped after {total.texts} texts ({type(e).__name__}); their sums are kept in {part}: "
                f"run the same command again to resume")
        from concurrent.futures.process import BrokenProcessPool
        if isinstance(e, BrokenProcessPool):
            raise CorpusError(f"a worker process died ({e}); out of memory? Try fewer --workers or a smaller "
                              f"--batch-size, then run the same command to resume") from None
        if type(e).__module__.startswith("ray"):     # RayTaskError and friends: the cause's last line
            lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            cause = lines[-1] if lines else type(e).__name__
            hint = ("; every Ray node needs the driver's Python environment: attnscope and the model packages"
                    if "ModuleNotFoundError" in cause or "ModelUnavailable" in str(e) else "")
            raise CorpusError(f"the Ray job failed: {cause}{hint}") from None
        raise
    finally:
        if ray_started:
            import ray
            ray.shutdown()
    bar.close()
    seconds = time.perf_counter() - started
    problems += refused
    if total.texts == 0:
        raise CorpusError(f"no texts to process in {path}" + (f": all {len(problems)} records were skipped"
                                                              if problems else ""))

    res = total.result()
    reasons: dict[str, int] = {}
    for p in problems:
        key = "over the character limit" if "--max-chars" in p.reason else p.reason.split(" (")[0]
        reasons[key] = reasons.get(key, 0) + 1
    job = {"model": model_id, "title": spec.title, "kind": spec.kind, "layers": total.layers, "heads": total.heads,
           "texts": res["texts"], "tokens": res["tokens"], "truncated": res["truncated"], "js_rows": res["js_rows"],
           "stats": res["stats"], "special_token_mass": res["special_token_mass"],
           "js_divergence": res["js_divergence"], "js_distance": res["js_distance"],
           "head_index": "js_* and js_map index heads layer-major: (layer, head) is layer * heads + head",
           "js_map": None if res["js_distance"] is None else head_map(res["js_distance"]),
           **({} if total.examples is None else {"examples": total.examples.result(),
                                                 "example_options": vars(total.examples.options)}),
           "input": {"path": str(path), "format": fmt, "column": column, "sample": sample, "seed": seed,
                     "max_chars": max_chars, "skipped": len(problems), "skipped_by_reason": reasons,
                     "problems": [p.to_json() for p in problems[:KEPT_PROBLEMS]]},
           "run": {"engine": engine, "workers": workers, "threads_per_worker": threads, "batch_size": batch_size,
                   "chunk_size": chunk_size, "js_rows": js_rows, "seconds": round(seconds, 3), "resumed": resumed,
                   "texts_per_s": round(texts_now / seconds, 1) if seconds else None}}
    job = _lists(job)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() in (".parquet", ".pq"):
        _write_parquet(out, job)
    else:
        write_json(out, job)
    part.unlink(missing_ok=True)
    say(f"{res['texts']} texts, {res['tokens']} tokens, {len(problems)} skipped, {seconds:.1f} s -> {out}")
    return job
