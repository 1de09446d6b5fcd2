"""The job queue: corpus jobs (the atlas) run in the background, one at a time by default, the rest queued.

    job = jobs.submit(plan)        # a JobPlan (app/plans.py): queued, or the same job as it stands
    jobs.get(id), jobs.list()      # schemas.Job: state and progress (texts done, rate, ETA)
    jobs.cancel(id)                # stops it between chunks; its finished chunks are kept
    jobs.result(id, "parquet")     # the result file of a finished job

Each job lives in its own folder under ATTNSCOPE_JOBS_DIR: job.json (what it is and its state, rewritten on every
change of state), atlas.json (the result) and, while it runs or once stopped, atlas.json.partial.json (the corpus
job's partial sums). A restarted server lists every job it finds; one that was queued or running becomes
"interrupted". POSTing the same request again (the same id) resumes a cancelled, failed or interrupted job from its
finished chunks. The job runs on the CLI's engines (corpus/atlas.py): a local process pool whose workers run at
ATTNSCOPE_JOB_NICE, or Ray where RAY_ADDRESS is set; nothing here knows HTTP.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from pathlib import Path

from ..corpus.atlas import Cancelled, run_atlas, write_parquet
from ..corpus.job import write_json
from .errors import Conflict, QueueFull, UnknownJob
from .plans import JobPlan
from .schemas import AtlasOptions, Job, JobProgress
from .settings import Settings

log = logging.getLogger("attnscope")
RESUMABLE = ("cancelled", "failed", "interrupted")
FORMATS = {"json": "atlas.json", "parquet": "atlas.parquet"}


class _Entry:
    """A job's record and what runs it: its plan (None for a job found on disk), its cancel flag, its progress."""

    def __init__(self, record: dict, plan: JobPlan | None = None):
        self.record, self.plan = record, plan
        self.cancel = threading.Event()
        self.export = threading.Lock()               # held while its Parquet export is written
        self.started, self.done_at_start = None, 0


class Jobs:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.folder = settings.jobs_folder()
        self.jobs: dict[str, _Entry] = {}
        self.queue: deque[str] = deque()
        self.lock = threading.Condition()
        self.threads: list[threading.Thread] = []
        self.closed = False

    # ---- on disk -------------------------------------------------------------------------------------------
    def open(self) -> None:
        """List the jobs a previous server left: those that were queued or running are now interrupted."""
        for path in sorted(self.folder.glob("*/job.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if record.get("state") in ("queued", "running", "cancelling"):
                record["state"] = "interrupted"
                self._save(record)
            self.jobs[record["id"]] = _Entry(record)

    def _save(self, record: dict) -> None:
        folder = self.folder / record["id"]
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "job.json", record)

    # ---- the API's operations --------------------------------------------------------------------------------
    def submit(self, plan: JobPlan) -> tuple[Job, bool]:
        """Queue the plan's job, or resume it (cancelled, failed, interrupted); (the job, True when queued now).
        A job queued, running or done is answered as it stands."""
        with self.lock:
            entry = self.jobs.get(plan.id)
            if entry is not None and entry.record["state"] not in RESUMABLE:
                return self._job(entry), False
            if len(self.queue) >= self.settings.max_jobs_queued:
                raise QueueFull(f"{len(self.queue)} jobs are waiting to run, the limit (ATTNSCOPE_MAX_JOBS_QUEUED); "
                                f"cancel one (DELETE /api/jobs/ID) or post again later")
            record = entry.record if entry else {
                "id": plan.id, "kind": plan.request.kind, "model": plan.runtime.spec.id, "corpus": plan.corpus,
                "options": plan.request.options.model_dump(), "texts_total": plan.texts, "texts_done": 0,
                "created": time.time()}
            record.update(state="queued", error=None, finished=None)
            entry = _Entry(record, plan)
            self.jobs[plan.id] = entry
            self._save(record)
            self.queue.append(plan.id)
            self._start_threads()
            self.lock.notify()
            return self._job(entry), True

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
        plan, st, record = entry.plan, self.settings, entry.record
        first = [True]

        def progress(done: int) -> None:
            """Texts done; the first call says what the partial file held. A cancel stops the job here."""
            record["texts_done"] = done                 # the partial file holds these, cancelled or not
            if first[0]:
                first[0] = False
                record["resumed_from"], entry.done_at_start, entry.started = done, done, time.perf_counter()
                self._save(record)
            if entry.cancel.is_set():
                raise Cancelled()

        try:
            run_atlas(plan.path, plan.runtime.spec.id, self.folder / record["id"] / FORMATS["json"], plan.examples,
                      fmt=plan.fmt, column=plan.column, sample=plan.request.options.texts,
                      seed=plan.request.options.seed, engine="ray" if st.ray_address else "local",
                      workers=st.job_workers, nice=st.job_nice, cache_dir=st.cache, ray_address=st.ray_address,
                      runtime=plan.runtime, on_progress=progress)
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
