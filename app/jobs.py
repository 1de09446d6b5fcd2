"""The job queue: corpus jobs (the atlas) run in the background, one at a time by default, the rest queued.

    job = jobs.submit(plan)        # a JobPlan (analyses/atlas.py): queued, or the same job as it stands
    jobs.get(id), jobs.list()      # schemas.Job: state and progress (texts done, rate, ETA)
    jobs.cancel(id)                # stops it between chunks; its finished chunks are kept
    jobs.delete(id)                # removes it: its record, partial sums, results and upload (a running one stops)
    jobs.result(id, "parquet")     # the result file of a finished job

Each job lives in its own folder under ATTNSCOPE_JOBS_DIR: job.json (what it is and its state, rewritten on every
change of state; `version` RECORD_VERSION), atlas.json (the result) and, while it runs or once stopped,
atlas.json.partial.json (the corpus job's partial sums). Every file is written under a temporary name of its own and
renamed into place (corpus/job.py replace_atomically). A restarted server lists every job it finds; one that was
queued or running becomes "interrupted", its progress what its partial sums hold; a job.json it cannot read (not
JSON, a field missing, options this version does not take, a newer version's record) is skipped, logged and listed
in /healthz (`jobs_skipped`), never fatal. POSTing the same request again (the same id) resumes a cancelled, failed or
interrupted job from its finished chunks.

Uploads: the request's corpus is written to a temporary file under uploads/ (stage_upload), checked and counted,
and renamed to its content hash only when its job is queued; a refused one leaves nothing. An upload is removed once
no job that still needs it (one not done) names it. The folder's size is bounded by ATTNSCOPE_MAX_JOBS_DISK_MB: a job
that would pass it is refused (DiskFull, 507), the request bodies being received counted as their bytes arrive
(receiving), chunked or not. A finished, failed, cancelled or interrupted job's files are removed
ATTNSCOPE_JOBS_KEEP_DAYS after it stopped (expire: at start and whenever a job is posted).

The job runs on the CLI's engines (corpus/atlas.py): a local process pool whose workers run at ATTNSCOPE_JOB_NICE,
or Ray where RAY_ADDRESS is set. The pool's workers die with the server (corpus/engines.py _die_with_parent) and keep
a pid file in workers/ while they live: a server started after one was killed stops any it left. Nothing here knows
HTTP.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import threading
import time
from collections import deque
from pathlib import Path

from pydantic import ValidationError

from ..corpus.atlas import Cancelled, run_atlas, write_parquet
from ..corpus.engines import PID_SUFFIX, is_pool_worker, started_at
from ..corpus.job import TEMPORARY, partial_path, write_json
from ..analyses.atlas import JobPlan
from ..analyses.errors import Conflict, DiskFull, QueueFull, UnknownJob
from .schemas import AtlasOptions, Job, JobProgress, SkippedJob
from .settings import Settings

log = logging.getLogger("attnscope")
RESUMABLE = ("cancelled", "failed", "interrupted")
STATES = ("queued", "running", "cancelling", "cancelled", "done", "failed", "interrupted")
FORMATS = {"json": "atlas.json", "parquet": "atlas.parquet"}
RECORD_VERSION = 2     # job.json's layout. 1: no `version` field (read as 1; the same fields); 2: `version`, `upload`
JOB_ID = re.compile(r"[0-9a-f]{16}")


class Unreadable(ValueError):
    """A job.json this version cannot use; the message says why."""


def read_record(path: Path) -> dict:
    """A job.json, checked: everything a listing shows is there and of its type, its options are this version's.
    Raises Unreadable."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise Unreadable(f"not JSON ({type(e).__name__})") from None
    if not isinstance(record, dict):
        raise Unreadable("not a JSON object")
    version = record.get("version", 1)
    if not isinstance(version, int) or not 1 <= version <= RECORD_VERSION:
        raise Unreadable(f"record version {version!r}: this server reads versions 1 to {RECORD_VERSION} (a newer "
                         f"attnscope wrote it?)")
    fields = {"id": str, "kind": str, "model": str, "corpus": str, "options": dict, "state": str,
              "texts_total": int, "texts_done": int, "created": (int, float)}
    missing = [name for name in fields if name not in record]
    if missing:
        raise Unreadable(f"no {', '.join(missing)}")
    wrong = [name for name, kind in fields.items() if not isinstance(record[name], kind)]
    if wrong:
        raise Unreadable(f"{', '.join(wrong)} of the wrong type")
    if record["id"] != path.parent.name or not JOB_ID.fullmatch(record["id"]):
        raise Unreadable(f"its id {record['id'][:40]!r} is not its folder's name")
    if record["state"] not in STATES:
        raise Unreadable(f"unknown state {record['state'][:40]!r}")
    try:
        Job(id=record["id"], kind=record["kind"], model=record["model"], corpus=record["corpus"],
            options=AtlasOptions(**record["options"]), state=record["state"],
            progress=JobProgress(texts_done=record["texts_done"], texts_total=record["texts_total"]),
            resumed_from=record.get("resumed_from") or 0, error=record.get("error"), created=record["created"],
            finished=record.get("finished"))
    except (ValidationError, TypeError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else {"loc": (), "msg": str(e)}
        where = ".".join(map(str, first["loc"]))
        raise Unreadable(f"does not match this version's schema ({where + ': ' if where else ''}{first['msg']})"
                         ) from None
    record["version"] = version
    return record


def _partial_texts(folder: Path) -> int:
    """Texts a stopped job's partial sums hold: where its resume starts (0 without them)."""
    try:
        return int(json.loads(partial_path(folder / FORMATS["json"]).read_text())["sums"]["texts"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class _Entry:
    """A job's record and what runs it: its plan (None for a job found on disk), its cancel flag, its progress."""

    def __init__(self, record: dict, plan: JobPlan | None = None):
        self.record, self.plan = record, plan
        self.cancel = threading.Event()
        self.export = threading.Lock()               # held while its Parquet export is written
        self.started, self.done_at_start = None, 0
        self.deleted = False                         # deleted while it ran: its run removes its files when it stops


class Jobs:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.folder = settings.jobs_folder()
        self.uploads = self.folder / "uploads"
        self.workers = self.folder / "workers"         # a live pool worker's pid file (corpus/engines.py)
        self.jobs: dict[str, _Entry] = {}
        self.queue: deque[str] = deque()
        self.lock = threading.Condition()
        self.threads: list[threading.Thread] = []
        self.closed = False
        self.skipped: list[SkippedJob] = []            # job.json files open() could not read
        self.stopping: dict[str, _Entry] = {}          # deleted while running: their runs still read their uploads
        self.bodies: dict[object, int] = {}            # request bodies being received -> their bytes so far
        self.bodies_lock = threading.Lock()

    # ---- on disk -------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Take over the folder a previous server left: stop the pool workers it left running, remove the
        temporary files it left, list its jobs (those that were queued or running are now interrupted, their
        progress what their partial sums hold; a record it cannot read is skipped and reported), and remove the
        uploads no job needs."""
        self._stop_strays()
        for item in self.folder.glob(f"**/.*{TEMPORARY}"):
            item.unlink(missing_ok=True)
        for path in sorted(self.folder.glob("*/job.json")):
            try:
                record = read_record(path)
            except Unreadable as e:
                self.skipped.append(SkippedJob(folder=path.parent.name, reason=str(e)))
                log.warning("jobs: skipped %s: %s", path.relative_to(self.folder), e)
                continue
            if record["state"] in ("queued", "running", "cancelling"):
                record["state"] = "interrupted"
                record["finished"] = time.time()        # it stopped now: its keep days count from here
                record["texts_done"] = _partial_texts(path.parent)
                self._save(record)
            self.jobs[record["id"]] = _Entry(record)
        self.expire()
        self._remove_unneeded_uploads()

    def _stop_strays(self) -> None:
        """Kill the pool workers a killed server left (each pid file checked: the same process, a spawned worker,
        and its server gone), and remove every pid file."""
        for path in self.workers.glob(f"*{PID_SUFFIX}"):
            try:
                info = json.loads(path.read_text())
                pid, started = int(info["pid"]), info["started"]
                parent, parent_started = int(info["parent"]), info["parent_started"]
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if parent_started is not None and started_at(parent) == parent_started:
                continue                                  # its server lives (another server on this folder)
            if is_pool_worker(pid, started):
                try:
                    os.kill(pid, signal.SIGKILL)
                    log.warning("jobs: stopped job worker %d, left running by a server that is gone", pid)
                except OSError:
                    pass
            path.unlink(missing_ok=True)

    def _save(self, record: dict) -> None:
        folder = self.folder / record["id"]
        folder.mkdir(parents=True, exist_ok=True)
        record["version"] = RECORD_VERSION
        write_json(folder / "job.json", record)

    # ---- uploads and the disk budget -------------------------------------------------------------------------
    def disk_used(self) -> int:
        """Bytes of every file under the jobs folder but the request bodies being received (incoming/: each is
        counted, while it comes, as the job it brings)."""
        total = 0
        for root, dirs, files in os.walk(self.folder):
            if root == str(self.folder) and "incoming" in dirs:
                dirs.remove("incoming")
            for name in files:
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except OSError:
                    pass
        return total

    def check_disk(self, adding: int = 0) -> None:
        """DiskFull when the folder, with `adding` bytes more, would pass ATTNSCOPE_MAX_JOBS_DISK_MB."""
        budget, used = self.settings.max_jobs_disk_mb * 2**20, self.disk_used() + self._receiving()
        if used + adding > budget:
            raise DiskFull(f"the jobs folder holds {used / 2**20:,.1f} MB and this job needs {adding / 2**20:,.1f} MB "
                           f"more, over its {self.settings.max_jobs_disk_mb:,} MB budget (ATTNSCOPE_MAX_JOBS_DISK_MB); "
                           f"free some (finished jobs' folders in ATTNSCOPE_JOBS_DIR) or raise the budget")

    def _receiving(self, but: object = None) -> int:
        with self.bodies_lock:
            return sum(n for token, n in self.bodies.items() if token is not but)

    def receiving(self, token: object, size: int, used: int) -> None:
        """A request body (`token`) has `size` bytes so far (or announced): DiskFull when the folder (`used` bytes
        when it began) with every body being received would pass the budget. Counted as the bytes arrive, so that
        chunked uploads at once cannot fill the disk before any is checked. Called on the event loop: no disk."""
        with self.bodies_lock:
            self.bodies[token] = size
            others = sum(n for t, n in self.bodies.items() if t is not token)
        budget = self.settings.max_jobs_disk_mb * 2**20
        if used + others + size > budget:
            self.received(token)
            raise DiskFull(f"the jobs folder holds {(used + others) / 2**20:,.1f} MB (uploads being received "
                           f"included) and this upload {size / 2**20:,.1f} MB so far, over its "
                           f"{self.settings.max_jobs_disk_mb:,} MB budget (ATTNSCOPE_MAX_JOBS_DISK_MB); delete "
                           f"finished jobs (DELETE /api/jobs/ID) or raise the budget")

    def received(self, token: object) -> None:
        """The body is in (or refused): no longer counted as one being received."""
        with self.bodies_lock:
            self.bodies.pop(token, None)

    def incoming(self) -> Path:
        """A new empty file under incoming/ for a request's body (removed by whoever asked for it; a server that
        starts removes any left)."""
        import tempfile
        folder = self.folder / "incoming"
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder, prefix=".body.", suffix=TEMPORARY)
        os.close(fd)
        return Path(name)

    def stage_upload(self, data: str, fmt: str) -> tuple[Path, Path]:
        """Write an uploaded corpus to a temporary file of its own under uploads/ (UTF-8); (that file, the name it
        takes once its job is queued: its content's SHA-256)."""
        import hashlib
        import tempfile
        encoded = data.encode("utf-8")
        self.check_disk(len(encoded))
        self.uploads.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.uploads, prefix=".upload.", suffix=TEMPORARY)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encoded)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
        return Path(name), self.uploads / f"{hashlib.sha256(encoded).hexdigest()}.{fmt}"

    def _needs(self, record: dict) -> str | None:
        """The upload file a job still needs (None: none, or it is done)."""
        if record["state"] == "done" or not record["corpus"].startswith("upload:"):
            return None
        return record.get("upload") or record["corpus"].split(":", 1)[1]   # version 1: the hash's first 16 digits

    def _remove_unneeded_uploads(self) -> None:
        """Remove every upload no job that is not done names."""
        entries = [*self.jobs.values(), *self.stopping.values()]
        needed = {n for n in (self._needs(e.record) for e in entries) if n}
        for path in self.uploads.glob("*"):
            if path.is_file() and path.name not in needed and path.name[:16] not in needed:
                path.unlink(missing_ok=True)

    # ---- the API's operations --------------------------------------------------------------------------------
    def submit(self, plan: JobPlan) -> tuple[Job, bool]:
        """Queue the plan's job, or resume it (cancelled, failed, interrupted); (the job, True when queued now).
        A job queued, running or done is answered as it stands. The plan's staged upload becomes its corpus file
        when the job is queued, and is removed otherwise."""
        try:
            with self.lock:
                self.expire()
                entry = self.jobs.get(plan.id)
                if entry is not None and entry.record["state"] not in RESUMABLE:
                    return self._job(entry), False
                if len(self.queue) >= self.settings.max_jobs_queued:
                    raise QueueFull(f"{len(self.queue)} jobs are waiting to run, the limit "
                                    f"(ATTNSCOPE_MAX_JOBS_QUEUED); cancel one (POST /api/jobs/ID/cancel) or post again "
                                    f"later")
                if plan.staged is not None:
                    self.check_disk()                    # the staged upload is counted already
                    if plan.path.exists():
                        plan.staged.unlink()
                    else:
                        os.replace(plan.staged, plan.path)
                record = entry.record if entry else {
                    "id": plan.id, "kind": plan.request.kind, "model": plan.runtime.spec.id, "corpus": plan.corpus,
                    "options": plan.request.options.model_dump(), "texts_total": plan.texts, "texts_done": 0,
                    "created": time.time()}
                if plan.staged is not None:
                    record["upload"] = plan.path.name
                record.update(state="queued", error=None, finished=None)
                entry = _Entry(record, plan)
                self.jobs[plan.id] = entry
                self._save(record)
                self.queue.append(plan.id)
                self._start_threads()
                self.lock.notify()
                return self._job(entry), True
        finally:
            if plan.staged is not None:
                plan.staged.unlink(missing_ok=True)

    def get(self, job_id: str) -> Job:
        return self._job(self._entry(job_id))

    def list(self) -> list[Job]:
        with self.lock:
            entries = sorted(self.jobs.values(), key=lambda e: e.record["created"], reverse=True)
            return [self._job(e) for e in entries]

    def cancel(self, job_id: str) -> Job:
        with self.lock:
            entry = self._entry(job_id)
            state = entry.record["state"]
            if state == "queued":
                self.queue.remove(job_id)
                self._set(entry, "cancelled")
            elif state == "running":
                entry.cancel.set()
                entry.record["state"] = "cancelling"
            else:
                raise Conflict(f"job {job_id} is {state}: only a queued or running job can be cancelled")
            return self._job(entry)

    def delete(self, job_id: str) -> None:
        """Remove a job: its record, partial sums, results, and its upload when no other job needs it; a GET is
        then 404. A queued job leaves the queue; a running one is told to stop and its files go when it has."""
        with self.lock:
            entry = self._entry(job_id)
            del self.jobs[job_id]
            state = entry.record["state"]
            if state == "queued":
                self.queue.remove(job_id)
            if state in ("running", "cancelling"):
                entry.deleted = True
                entry.cancel.set()
                self.stopping[job_id] = entry
                return
            self._remove(job_id)

    def _remove(self, job_id: str) -> None:
        """A deleted or expired job's folder, and the uploads no job needs any more (under the lock)."""
        shutil.rmtree(self.folder / job_id, ignore_errors=True)
        self._remove_unneeded_uploads()

    def expire(self) -> None:
        """Remove the jobs that stopped (done, failed, cancelled, interrupted) more than ATTNSCOPE_JOBS_KEEP_DAYS ago
        (under the lock, or before any job runs)."""
        days = self.settings.jobs_keep_days
        if not days:
            return
        cutoff = time.time() - days * 86400
        for job_id, entry in list(self.jobs.items()):
            r = entry.record
            stopped = r.get("finished") or r["created"]
            if r["state"] in ("done", "failed", "cancelled", "interrupted") and stopped < cutoff:
                del self.jobs[job_id]
                log.info("jobs: removed job %s, %s more than %g days ago (ATTNSCOPE_JOBS_KEEP_DAYS)", job_id,
                         r["state"], days)
                self._remove(job_id)

    def result(self, job_id: str, fmt: str) -> Path:
        entry = self._entry(job_id)
        state = entry.record["state"]
        if state != "done":
            raise Conflict(f"job {job_id} is {state}, not done: its result comes when it is done "
                           f"({entry.record['texts_done']} of {entry.record['texts_total']} texts)")
        folder = self.folder / job_id
        path = folder / FORMATS[fmt]
        if not path.exists():                         # the Parquet export is written on first request, once:
            with entry.export:                        # requests at once wait for the first one's file
                if not path.exists():
                    write_parquet(json.loads((folder / FORMATS["json"]).read_text()), path)
        return path

    def close(self) -> None:
        """At shutdown: stop the running jobs between chunks (they become interrupted) and wait for them."""
        with self.lock:
            self.closed = True
            for entry in self.jobs.values():
                entry.cancel.set()
            self.lock.notify_all()
        for t in self.threads:
            t.join(timeout=60)

    # ---- running -----------------------------------------------------------------------------------------------
    def _start_threads(self) -> None:
        while len(self.threads) < self.settings.max_jobs_running:
            t = threading.Thread(target=self._loop, name=f"attnscope-job-{len(self.threads)}", daemon=True)
            self.threads.append(t)
            t.start()

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self.queue and not self.closed:
                    self.lock.wait()
                if self.closed:
                    return
                entry = self.jobs[self.queue.popleft()]
                self._set(entry, "running")
            self._run(entry)

    def _run(self, entry: _Entry) -> None:
        try:
            self._run_one(entry)
        finally:
            if entry.deleted:                          # deleted while it ran: its files go now that it stopped
                with self.lock:
                    job_id = entry.record["id"]
                    self.stopping.pop(job_id, None)
                    if job_id not in self.jobs:        # not posted again meanwhile (that one resumes from them)
                        self._remove(job_id)

    def _run_one(self, entry: _Entry) -> None:
        plan, st, record = entry.plan, self.settings, entry.record
        first = [True]

        def progress(done: int) -> None:
            """Texts done; the first call says what the partial file held."""
            record["texts_done"] = done                 # the partial file holds these, cancelled or not
            if first[0]:
                first[0] = False
                record["resumed_from"], entry.done_at_start, entry.started = done, done, time.perf_counter()
                self._save(record)

        try:   # a cancel stops the job between chunks; one that comes once the last chunk is done comes too late
            run_atlas(plan.path, plan.runtime.spec.id, self.folder / record["id"] / FORMATS["json"], plan.examples,
                      fmt=plan.fmt, column=plan.column, sample=plan.request.options.texts,
                      seed=plan.request.options.seed, engine="ray" if st.ray_address else "local",
                      workers=st.job_workers, nice=st.job_nice, cache_dir=st.cache, ray_address=st.ray_address,
                      runtime=plan.runtime, on_progress=progress, stop=entry.cancel.is_set, pid_folder=self.workers)
        except Cancelled:
            with self.lock:
                self._set(entry, "interrupted" if self.closed else "cancelled")
            return
        except Exception as e:  # noqa: BLE001 - a job's failure is its state, not the server's
            log.warning("job %s failed: %s: %s", record["id"], type(e).__name__, e)
            with self.lock:
                record["error"] = f"{type(e).__name__}: {e}".replace(str(self.folder), "JOBS_DIR")
                self._set(entry, "failed")
            return
        with self.lock:
            record["texts_done"] = record["texts_total"]
            self._set(entry, "done")
            upload = self._needs({**record, "state": "queued"})
            if upload and not any(self._needs(e.record) == upload for e in self.jobs.values()):
                (self.uploads / upload).unlink(missing_ok=True)     # no job that is not done needs it

    # ---- records -----------------------------------------------------------------------------------------------
    def _entry(self, job_id: str) -> _Entry:
        entry = self.jobs.get(job_id)
        if entry is None:
            raise UnknownJob(f"no job {job_id!r}; GET /api/jobs lists them")
        return entry

    def _set(self, entry: _Entry, state: str) -> None:
        entry.record["state"] = state
        if state in ("done", "cancelled", "failed", "interrupted"):
            entry.record["finished"] = time.time()
        if not entry.deleted:                          # its folder is going (or another job of its id has it)
            self._save(entry.record)

    def _job(self, entry: _Entry) -> Job:
        r = entry.record
        rate = eta = None
        if r["state"] in ("running", "cancelling") and entry.started is not None:
            seconds = time.perf_counter() - entry.started
            done_now = r["texts_done"] - entry.done_at_start
            if seconds > 0 and done_now > 0:
                rate = round(done_now / seconds, 2)
                eta = round((r["texts_total"] - r["texts_done"]) / rate, 1)
        result = ({f: f"/api/jobs/{r['id']}/result?format={f}" for f in FORMATS} if r["state"] == "done" else None)
        return Job(id=r["id"], kind=r["kind"], model=r["model"], corpus=r["corpus"],
                   options=AtlasOptions(**r["options"]), state=r["state"],
                   progress=JobProgress(texts_done=r["texts_done"], texts_total=r["texts_total"], rate=rate,
                                        eta_s=eta),
                   resumed_from=r.get("resumed_from") or 0, error=r.get("error"), created=r["created"],
                   finished=r.get("finished"), result=result)
