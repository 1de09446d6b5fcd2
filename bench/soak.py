"""Soak: minutes of mixed traffic against a live server this script starts on loopback, and what it leaves behind.

    .venv/bin/python bench/soak.py [--minutes 30] [--warmup 2] [--clients 4] [--models tiny-gpt,induction,...]

Every endpoint gets distinct inputs (a counter picks each text's words, so the result cache cannot answer for the
model): attention (JSON, binary, NDJSON progress), stages, importance, patching (per head and per position), knockout,
QK, the lens, circuits, generation; corpus jobs (the bundled corpus and uploads, each with its own options; some
cancelled; results downloaded as JSON and Parquet, several at once), hostile and refused bodies, and clients that go
away mid-answer (a generation's stream closed after its first token, an attention request given up after 50 ms).

It prints the server's RSS at start (models loaded), after the warm-up (every path taken once per model, then
--warmup minutes of the traffic, and on until the result cache is 90 % full, its steady state, at most --warmup-max
minutes; read with the traffic paused and the server idle), its peak, and at the end (idle,
after the traffic; queued and running jobs cancelled), the job workers' peak RSS, the count of 5xx answers (the target: 0),
every status by operation, and the disk the jobs folder holds. The target for memory: end RSS within 1.2x of the
post-warm-up RSS (issue 37). --json FILE writes the same numbers.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.common import WORDS, server  # noqa: E402

MB = 2**20
DEFAULT_MODELS = "tiny-gpt,induction,minilm,smollm2"


FULL = 0.9     # the result cache's share of its budget at which the warm-up ends


def cache_fill(url: str) -> float:
    """How full the server's result cache is (/healthz: cache_bytes of cache_max_bytes)."""
    h = httpx.get(f"{url}/healthz", timeout=30).json()
    return h["cache_bytes"] / h["cache_max_bytes"]


class Traffic:
    """The request mix: each call of next() is one distinct request, sent and counted."""

    def __init__(self, url: str, models: list[str], seed: int):
        self.url, self.models, self.seed = url, models, seed
        self.statuses: dict[str, Counter] = defaultdict(Counter)
        self.lock = threading.Lock()
        self.local = threading.local()         # each client thread's random stream
        self.n = 0
        self.jobs: list[str] = []             # job ids posted
        self.lm = [m for m in models if m in ("induction", "smollm2")]           # next-token logits
        self.decoders = [m for m in models if m in ("tiny-gpt", "induction", "smollm2")]
        self.small = [m for m in ("tiny-gpt", "induction") if m in models] or models     # what jobs run on
        self.mix = [(self.attention, 6), (self.attention_binary, 2), (self.attention_stream, 1), (self.stages, 2),
                    (self.attention_dropped, 1), (self.hostile, 2), (self.job, 0.5), (self.job_upload, 0.5),
                    (self.job_results, 2), (self.list_jobs, 1), (self.healthz, 2)]
        if self.decoders:
            self.mix += [(self.importance, 1), (self.qk, 2), (self.lens, 2), (self.circuits, 1)]
        if self.lm:
            self.mix += [(self.patching, 2), (self.knockout, 2), (self.generate, 2), (self.generate_dropped, 1)]

    @property
    def rng(self) -> random.Random:
        if not hasattr(self.local, "rng"):
            with self.lock:
                self.n += 1
                self.local.rng = random.Random(self.seed * 1000 + self.n)
        return self.local.rng

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _count(self, op: str, status) -> None:
        with self.lock:
            self.statuses[op][status] += 1

    def _text(self, words: int) -> str:
        with self.lock:
            self.n += 1
            n = self.n
        r = random.Random(n)
        return f"{n} " + " ".join(r.choice(WORDS) for _ in range(words))

    def _model(self, choices: list[str], smollm2_share: float = 0.15) -> str:
        """A model among `choices`; SmolLM2 (slow) only for a share of the requests. The warm-up names one."""
        forced = getattr(self.local, "model", None)
        if forced in choices:
            return forced
        fast = [m for m in choices if m != "smollm2"]
        if "smollm2" in choices and (not fast or self.rng.random() < smollm2_share):
            return "smollm2"
        return self.rng.choice(fast)

    def _post(self, op: str, path: str, body: dict, http: httpx.Client, **kwargs) -> httpx.Response | None:
        try:
            r = http.post(path, json=body, **kwargs)
        except httpx.TimeoutException:
            self._count(op, "client timeout")
            return None
        except httpx.TransportError as e:
            self._count(op, f"transport {type(e).__name__}")
            return None
        self._count(op, r.status_code)
        return r

    # ---- the operations -----------------------------------------------------------------------------------------
    def attention(self, http):
        model = self._model([m for m in self.models])
        self._post("attention", "/api/attention", {"model": model, "text": self._text(self.rng.randint(5, 60)),
                                                   "include": ["attention", "summary", "entropy"]}, http)

    def attention_binary(self, http):
        model = self._model([m for m in self.models])
        self._post("attention (binary)", "/api/attention", {"model": model, "text": self._text(40)}, http,
                   headers={"Accept": "application/vnd.attnscope.tensors"})

    def attention_stream(self, http):
        model = self._model([m for m in self.models])
        self._post("attention (ndjson)", "/api/attention", {"model": model, "text": self._text(30)}, http,
                   headers={"Accept": "application/x-ndjson"})

    def attention_dropped(self, http):
        """A client that gives up after 50 ms (usually mid-run)."""
        model = self._model([m for m in self.models], smollm2_share=0.5)
        try:
            http.post("/api/attention", json={"model": model, "text": self._text(200)}, timeout=0.05)
            self._count("attention (dropped)", "answered in time")
        except httpx.TimeoutException:
            self._count("attention (dropped)", "dropped")

    def stages(self, http):
        model = self._model([m for m in self.models if m != "smollm2"] or self.models)
        self._post("stages", "/api/stages", {"model": model, "text": self._text(20), "layer": 0, "head": 0}, http)

    def importance(self, http):
        self._post("importance", "/api/importance", {"model": self._model(self.decoders), "text": self._text(12)},
                   http)

    def patching(self, http):
        model = self._model(self.lm, smollm2_share=0.1)
        words = self._text(30 if model != "smollm2" else 8).split()
        corrupt = words.copy()
        corrupt[2] = "river" if words[2] != "river" else "market"
        per_position = model != "smollm2" and self.rng.random() < 0.5
        body = {"model": model, "clean": " ".join(words), "corrupt": " ".join(corrupt), "target": " the"
                if model == "smollm2" else "the", "per_position": per_position}
        if self.rng.random() < 0.3:
            body["distractor"] = " a" if model == "smollm2" else "a"
        r = self._post("patching", "/api/patching", body, http)
        if r is not None and r.status_code == 422 and "same token count" in r.text:
            self._count("patching", "(422: token counts differ)")

    def knockout(self, http):
        self._post("knockout", "/api/knockout", {"model": self._model(self.lm), "text": self._text(16),
                                                 "queries": [6], "keys": [1, 2]}, http)

    def qk(self, http):
        self._post("qk", "/api/qk", {"model": self._model(self.decoders), "text": self._text(16), "layer": 1,
                                     "head": 0, "query": 8, "key": 3}, http)

    def lens(self, http):
        self._post("lens", "/api/lens", {"model": self._model(self.decoders), "text": self._text(16)}, http)

    def circuits(self, http):
        self._post("circuits", "/api/circuits", {"model": self._model(self.decoders, smollm2_share=0.05)}, http)

    def generate(self, http):
        body = {"model": self._model(self.lm), "text": self._text(10), "max_new_tokens": 8,
                "seed": self.rng.randrange(2**31)}
        try:
            with http.stream("POST", "/api/generate", json=body) as r:
                lines = sum(1 for _ in r.iter_lines())
                self._count("generate", r.status_code if lines else "empty")
        except httpx.TransportError as e:
            self._count("generate", f"transport {type(e).__name__}")

    def generate_dropped(self, http):
        """A client that reads the first token of a generation and hangs up."""
        body = {"model": self._model(self.lm), "text": self._text(10), "max_new_tokens": 64}
        try:
            with http.stream("POST", "/api/generate", json=body) as r:
                self._count("generate (dropped)", r.status_code)
                for _ in r.iter_lines():
                    break
        except httpx.TransportError as e:
            self._count("generate (dropped)", f"transport {type(e).__name__}")

    def hostile(self, http):
        bodies = [{"model": "nope", "text": "x"}, {"text": "\u0000" * 10}, {"text": "a", "layers": [999]},
                  {"text": "a", "precision": 4.5}, {"text": "x" * 30_000}, {"text": ""}]
        body = self.rng.choice(bodies)
        self._post("hostile", "/api/attention", body, http)
        try:
            r = http.post("/api/attention", content=b'{"text": "unclosed', headers={"content-type":
                                                                                   "application/json"})
            self._count("hostile", r.status_code)
        except httpx.TransportError as e:
            self._count("hostile", f"transport {type(e).__name__}")

    def job(self, http):
        model = self._model(self.small, smollm2_share=0.0)
        body = {"model": model, "corpus": "bundled", "options": {"texts": self.rng.randint(20, 120),
                                                                   "seed": self.rng.randrange(10**6)}}
        r = self._post("job (bundled)", "/api/jobs", body, http)
        if r is not None and r.status_code in (200, 202):
            job_id = r.json()["id"]
            with self.lock:
                self.jobs.append(job_id)
            if self.rng.random() < 0.2:
                try:
                    self._count("job cancel", http.post(f"/api/jobs/{job_id}/cancel", json={}).status_code)
                except httpx.TransportError as e:
                    self._count("job cancel", f"transport {type(e).__name__}")

    def job_upload(self, http):
        model = self._model(self.small, smollm2_share=0.0)
        lines = [self._text(self.rng.randint(4, 30)) for _ in range(self.rng.randint(20, 400))]
        kind = self.rng.random()
        if kind < 0.15:      # refused: malformed CSV, or an unclosed quote
            corpus = {"format": "csv", "data": "text,b\n1,2,3\n" if kind < 0.07 else 'text\nok\n"open\nrest\n'}
        elif kind < 0.3:
            corpus = {"format": "jsonl", "data": "\n".join(json.dumps({"text": t}) for t in lines) + "\n"}
        else:
            corpus = {"format": "text", "data": "\n".join(lines) + "\n"}
        r = self._post("job (upload)", "/api/jobs", {"model": model, "corpus": corpus,
                                                     "options": {"texts": min(len(lines), 60)}}, http)
        if r is not None and r.status_code in (200, 202):
            with self.lock:
                self.jobs.append(r.json()["id"])

    def job_results(self, http):
        with self.lock:
            ids = list(self.jobs)
        if not ids:
            return self.healthz(http)
        job_id = self.rng.choice(ids)
        try:
            job = http.get(f"/api/jobs/{job_id}").json()
        except (httpx.TransportError, ValueError):
            self._count("job result", "transport")
            return
        fmt = self.rng.choice(["json", "parquet"])
        if job.get("state") != "done":
            self._count("job result", f"({job.get('state')})")
            return
        threads = [threading.Thread(target=self._download, args=(job_id, fmt))
                   for _ in range(self.rng.choice([1, 1, 4]))]          # sometimes several at once
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _download(self, job_id: str, fmt: str) -> None:
        try:
            r = httpx.get(f"{self.url}/api/jobs/{job_id}/result", params={"format": fmt}, timeout=60)
            self._count(f"job result ({fmt})", r.status_code)
        except httpx.TransportError as e:
            self._count(f"job result ({fmt})", f"transport {type(e).__name__}")

    def list_jobs(self, http):
        try:
            self._count("list jobs", http.get("/api/jobs").status_code)
        except httpx.TransportError as e:
            self._count("list jobs", f"transport {type(e).__name__}")

    def healthz(self, http):
        try:
            self._count("healthz", http.get("/healthz").status_code)
        except httpx.TransportError as e:
            self._count("healthz", f"transport {type(e).__name__}")

    def every_path(self, http) -> None:
        """Each operation once per model (twice for the ones that differ between calls): every graph, session and
        arena a path opens on first use is open before the post-warm-up RSS is read."""
        for model in self.models:
            self.local.model = model
            for op, _ in self.mix:
                for _ in range(2):
                    op(http)
        self.local.model = None

    def next(self, http) -> None:
        ops, weights = zip(*self.mix)
        self.rng.choices(ops, weights)[0](http)


class Memory:
    """The server's RSS (and its job workers' together) once a second, in a thread of its own."""

    def __init__(self, pid: int):
        self.proc, self.peak, self.workers_peak = psutil.Process(pid), 0, 0
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def rss(self) -> int:
        return self.proc.memory_info().rss

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(1.0):
            try:
                rss = self.rss()
                workers = sum(c.memory_info().rss for c in self.proc.children(recursive=True))
            except psutil.Error:
                continue
            self.peak, self.workers_peak = max(self.peak, rss), max(self.workers_peak, workers)
            self.samples.append((round(time.monotonic() - t0, 1), rss))


def idle(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = httpx.get(url + "/healthz", timeout=30).json()
        if h["running"] == 0 and h["waiting"] == 0:
            return
        time.sleep(0.1)


def disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30, help="traffic after the warm-up (default 30)")
    ap.add_argument("--warmup", type=float, default=None, help="minutes of the same traffic, after every path has "
                    "been taken once per model, before the post-warm-up RSS is read (default: a tenth of --minutes, "
                    "at least 0.5)")
    ap.add_argument("--warmup-max", type=float, default=20, help="minutes the warm-up may last at most while the "
                    "result cache fills (default 20)")
    ap.add_argument("--clients", type=int, default=4, help="clients sending at once (default 4)")
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"the server's models (default {DEFAULT_MODELS})")
    ap.add_argument("--cache-mb", type=int, default=None, help="the server's result cache (ATTNSCOPE_CACHE_MB; "
                    "default: the server's, 768). The cache fills as distinct requests come: a short soak reads a "
                    "fair post-warm-up RSS only once it is full, so give a short one a small cache")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = ap.parse_args()
    warmup = args.warmup if args.warmup is not None else max(0.5, args.minutes / 10)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    jobs_dir = Path(tempfile.mkdtemp(prefix="attnscope-soak-jobs-"))
    env = {"ATTNSCOPE_MODELS": ",".join(models), "ATTNSCOPE_DEFAULT_MODEL": models[0],
           "ATTNSCOPE_JOBS_DIR": str(jobs_dir), "ATTNSCOPE_MAX_NEW_TOKENS": "64"}
    if args.cache_mb is not None:
        env["ATTNSCOPE_CACHE_MB"] = str(args.cache_mb)
    print(f"soak: {args.minutes:g} min of traffic after {warmup:g} min of warm-up, {args.clients} clients, models "
          f"{','.join(models)}; jobs in {jobs_dir}", flush=True)
    with server(env, timeout=600) as (url, pid):
        mem = Memory(pid)
        start_rss = mem.rss()
        traffic = Traffic(url, models, args.seed)
        go, stop = threading.Event(), threading.Event()
        go.set()

        def client() -> None:
            with httpx.Client(base_url=url, timeout=300) as http:
                while not stop.is_set():
                    go.wait()
                    traffic.next(http)

        def requests() -> tuple[int, int]:
            counts = [(s, n) for c in list(traffic.statuses.values()) for s, n in list(c.items())]
            return sum(n for _, n in counts), sum(n for s, n in counts if isinstance(s, int) and s >= 500)

        def quiet_rss() -> int:
            """The RSS with the traffic paused and the server idle (the least of a few readings)."""
            go.clear()
            idle(url)
            time.sleep(2)
            readings = []
            for _ in range(5):
                readings.append(mem.rss())
                time.sleep(0.2)
            return min(readings)

        t0 = time.monotonic()
        with httpx.Client(base_url=url, timeout=600) as http:
            traffic.every_path(http)
        print(f"soak: every path once per model at {time.monotonic() - t0:.0f} s, RSS {mem.rss() / MB:.0f} MB",
              flush=True)
        threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(warmup * 60)
        # the warm-up goes on until the result cache is full (its steady state): RSS that grows while it fills is the
        # cache doing its job, bounded by ATTNSCOPE_CACHE_MB, not a leak
        while cache_fill(url) < FULL and time.monotonic() - t0 < args.warmup_max * 60:
            time.sleep(5)
        warm_rss, warm_cache = quiet_rss(), cache_fill(url)
        print(f"soak: warm-up done at {time.monotonic() - t0:.0f} s: idle RSS {warm_rss / MB:.0f} MB, result cache "
              f"{warm_cache:.0%} full ({requests()[0]} requests)", flush=True)
        go.set()
        end_at = last_report = time.monotonic()
        end_at += args.minutes * 60
        while time.monotonic() < end_at:
            time.sleep(1)
            if time.monotonic() - last_report >= 60:
                last_report = time.monotonic()
                n, fives = requests()
                print(f"soak: {time.monotonic() - t0:.0f} s: RSS {mem.rss() / MB:.0f} MB (peak {mem.peak / MB:.0f}), "
                      f"result cache {cache_fill(url):.0%} full, {n} requests, {fives} 5xx", flush=True)
        stop.set()
        go.set()
        for t in threads:
            t.join(timeout=300)
        with httpx.Client(base_url=url, timeout=60) as http:        # the jobs still queued or running: cancelled
            for job in http.get("/api/jobs").json():
                if job["state"] in ("queued", "running"):
                    http.post(f"/api/jobs/{job['id']}/cancel", json={})
            deadline = time.monotonic() + 120
            while any(j["state"] in ("running", "cancelling") for j in http.get("/api/jobs").json()) and \
                    time.monotonic() < deadline:
                time.sleep(0.5)
            states = Counter(j["state"] for j in http.get("/api/jobs").json())
            health = http.get("/healthz").json()
        end_rss = quiet_rss()
        mem.stop.set()
        time.sleep(1)
        workers_left = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    statuses = {op: dict(sorted(c.items(), key=str)) for op, c in sorted(traffic.statuses.items())}
    fives = sum(n for c in traffic.statuses.values() for s, n in c.items() if isinstance(s, int) and s >= 500)
    used = disk(jobs_dir)
    result = {"minutes": args.minutes, "warmup_minutes": warmup, "clients": args.clients, "models": models,
              "requests": sum(sum(c.values()) for c in traffic.statuses.values()), "5xx": fives,
              "rss_mb": {"start": round(start_rss / MB), "after_warmup": round(warm_rss / MB),
                         "peak": round(mem.peak / MB), "end": round(end_rss / MB)},
              "end_over_warmup": round(end_rss / warm_rss, 3),
              "cache_full_after_warmup": round(warm_cache, 3), "job_workers_peak_mb": round(mem.workers_peak / MB),
              "jobs": dict(states), "jobs_disk_mb": round(used / MB, 1), "jobs_skipped": health.get("jobs_skipped"),
              "processes_left_at_end": workers_left, "statuses": statuses}
    print(f"\nsoak: {result['requests']} requests in {args.minutes:g} min (+{warmup:g} min warm-up), "
          f"{args.clients} clients, result cache {args.cache_mb or 768} MB")
    print(f"  RSS: start {result['rss_mb']['start']} MB, after warm-up {result['rss_mb']['after_warmup']} MB, "
          f"peak {result['rss_mb']['peak']} MB, end {result['rss_mb']['end']} MB "
          f"(end / after warm-up = {result['end_over_warmup']}; target <= 1.2)")
    print(f"  job workers' peak RSS {result['job_workers_peak_mb']} MB; processes under the server at the end: "
          f"{len(workers_left)} (multiprocessing's resource tracker stays for the server's life)")
    print(f"  5xx: {fives} (target 0)")
    print(f"  jobs: {dict(states)}; disk used by the jobs folder: {result['jobs_disk_mb']} MB")
    for op, counts in statuses.items():
        print(f"  {op:24s} {counts}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    ok = fives == 0 and result["end_over_warmup"] <= 1.2
    print("soak: " + ("PASS" if ok else "FAIL") + " (0 5xx, end RSS within 1.2x of the post-warm-up RSS)")
    import shutil
    shutil.rmtree(jobs_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
