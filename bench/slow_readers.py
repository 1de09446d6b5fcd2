"""Big answers to slow and to many readers: the server's memory during and after, loopback only.

    .venv/bin/python bench/slow_readers.py [--readers 32] [--seconds 20] [--sending-mb 256]

On `attnscope serve` (default settings unless --sending-mb is given):
  slow  - `--readers` clients each ask for all 72 matrices of a different 512-token text in the binary form
          (76 MB), then read 256 kB every 100 ms (2.5 MB/s) for at most `--seconds` and hang up
  many  - wrk -c64 for 10 s on one such answer (the same text, so one cached result), read at full speed
The server's RSS is sampled every 100 ms: printed are the RSS before, the peak during each part, and the
idle RSS after each (once /healthz shows nothing running). Exit status 1 when idle RSS after a part is
above 1.5 GB.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.common import server  # noqa: E402
from bench.overload import idle  # noqa: E402

BINARY = "application/vnd.attnscope.tensors"


def body(k: int) -> bytes:
    return json.dumps({"text": f"reader {k} {time.time_ns()} " + " ".join(f"w{i % 97}" for i in range(600))}).encode()


async def slow_reader(host: str, port: int, k: int, seconds: float) -> int:
    data = body(k)
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 18)
    writer.write(b"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: "
                 + BINARY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    got, stop = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < stop:
            chunk = await asyncio.wait_for(reader.read(1 << 18), timeout=max(0.01, stop - time.monotonic()))
            if not chunk:
                break
            got += len(chunk)
            await asyncio.sleep(0.1)
    except (asyncio.TimeoutError, ConnectionError):
        pass
    writer.close()
    return got


class Sampler:
    """The server's RSS every 100 ms, in a thread."""

    def __init__(self, pid: int):
        self.proc, self.peak, self._stop = psutil.Process(pid), 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run)

    def rss(self) -> float:
        return self.proc.memory_info().rss / 2**20

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.1)

    def __enter__(self):
        self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readers", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20, help="how long each slow reader reads (default 20)")
    ap.add_argument("--sending-mb", type=int, default=0, help="ATTNSCOPE_MAX_SENDING_MB (0: the default)")
    args = ap.parse_args(argv)
    env = {"ATTNSCOPE_MAX_SENDING_MB": str(args.sending_mb)} if args.sending_mb else {}
    ok = True
    with server(env) as (url, pid):
        host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
        r = httpx.post(url + "/api/attention", content=body(-1), headers={"Accept": BINARY,
                                                                         "Content-Type": "application/json"})
        print(f"server pid {pid}; one answer: {len(r.content) / 1e6:.1f} MB; "
              f"sending budget {args.sending_mb or 'default'} MB", flush=True)
        sampler = Sampler(pid)
        before = sampler.rss()
        print(f"RSS idle before: {before:.0f} MB", flush=True)

        async def slow():
            return await asyncio.gather(*(slow_reader(host, port, k, args.seconds) for k in range(args.readers)))
        with sampler:
            t0 = time.monotonic()
            got = asyncio.run(slow())
            took = time.monotonic() - t0
            idle(url)
            time.sleep(1)
        after = sampler.rss()
        print(f"slow: {args.readers} readers at 2.5 MB/s for <= {args.seconds:g} s ({took:.0f} s): "
              f"{sum(got) / 1e6:.0f} MB read, {sum(g > 0 for g in got)} got bytes; RSS peak {sampler.peak:.0f} MB, "
              f"idle after {after:.0f} MB", flush=True)
        ok &= after <= 1536
        if shutil.which("wrk"):
            with tempfile.TemporaryDirectory() as tmp, Sampler(pid) as many:
                script = Path(tmp) / "big.lua"
                script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body(-2).decode())}\n'
                                  f'wrk.headers["Content-Type"] = "application/json"\n'
                                  f'wrk.headers["Accept"] = "{BINARY}"\n')
                out = subprocess.run(["timeout", "60", "wrk", "-t1", "-c64", "-d10s", "--timeout", "30s", "-s",
                                      str(script), url + "/api/attention"], capture_output=True, text=True)
                idle(url)
                time.sleep(1)
            after = many.rss()
            line = next((ln.strip() for ln in out.stdout.splitlines() if "requests in" in ln), out.stdout[-300:])
            print(f"many: wrk -c64 10 s on one 76 MB answer: {line}; RSS peak {many.peak:.0f} MB, "
                  f"idle after {after:.0f} MB", flush=True)
            ok &= after <= 1536
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
