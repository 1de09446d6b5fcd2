"""Sending answers: the one place for the sending budget, the encoding (in worker threads, a light plan's on the event
loop) and streaming.

    return await sending.respond(request, plan, runner, if_none_match, started)    # JSON or binary, buffers
    return sending.stream(plan, runner, started, minimal)                          # NDJSON progress, then the answer

A big answer first reserves its bytes of the server's sending budget (plan.size, known at planning) before its run:
requests beyond the budget wait holding nothing (not a 76 MB result each) and give up when their client does. The
reservation is returned when the last byte is handed over or the client has gone.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import numpy as np
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from ..runtime.sessions import to_float16
from ..analyses.payloads import rounded, timed
from . import wire
from .errors import refusal
from .kept import KeptAnswers
from ..analyses.base import Computed, Plan
from ..analyses.runs import Runner

SLICE = 1 << 20     # bytes per write: the server then buffers at most about this much per connection
CLIENT_GONE = 499   # nginx's code for "client closed the request"; nobody receives it


class ByteBudget:
    """Bytes of big answers being built or written, for the whole server: an answer waits until its size
    fits (one larger than the whole budget goes alone), so slow readers cannot make the server hold more
    than this many bytes of answers at once, however many of them there are."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.used = max_bytes, 0
        self._changed: asyncio.Condition | None = None

    async def acquire(self, n: int) -> int:
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            await self._changed.wait_for(lambda: self.used == 0 or self.used + n <= self.max_bytes)
            self.used += n
        return n

    async def release(self, n: int) -> None:
        async with self._changed:
            self.used -= n
            self._changed.notify_all()


class BuffersResponse(Response):
    """Sends a list of buffers under one Content-Length, a slice of at most SLICE bytes per write (no joining
    copy; uvicorn waits for a slow reader to drain before each write). `release` runs when it is sent or the
    client has gone: it gives back the answer's share of the server's sending budget."""

    def __init__(self, buffers: list, media_type: str, headers: dict[str, str], release=None):
        self.buffers, self.release = buffers, release
        super().__init__(None, media_type=media_type, headers=headers)
        self.headers["content-length"] = str(sum(len(b) for b in buffers))

    async def __call__(self, scope, receive, send):
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            slices = _joined([memoryview(b)[i:i + SLICE] for b in self.buffers for i in range(0, len(b), SLICE)])
            self.buffers = None
            for i, piece in enumerate(slices):
                await send({"type": "http.response.body", "body": piece, "more_body": i < len(slices) - 1})
            if not slices:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if self.release is not None:
                await self.release()


def _joined(slices: list, small: int = 1 << 16) -> list:
    """Runs of small slices (a header, a few [l, h, T] rows) joined into one: each write passes every middleware and
    a send call (MiniLM's last-layer answer went out in six writes, now three); big ones stay views, uncopied."""
    out, run = [], []
    for piece in slices:
        if len(piece) < small:
            run.append(piece)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(piece)
    return out + ([b"".join(run)] if run else [])


def _cast(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return to_float16(a) if dtype == np.float16 else np.ascontiguousarray(a, dtype)


def encode(plan: Plan, computed: Computed, started: float) -> list:
    """Payload (pure functions) -> wire form, as a list of buffers. Runs in a worker thread, in pieces that each
    hold the GIL briefly: statistics and serialisation of a long text take up to a second, and the event loop
    must stay free (a light plan's, a millisecond or two, on the event loop: Sending._encode). timing_ms is written
    last, so its total covers the serialisation."""
    body = rounded(plan.payload(computed), plan.precision)

    def timing() -> dict:
        return timed({}, computed.result, started)
    if plan.binary:
        return wire.binary_chunks(body, plan.dtype, cast=_cast, late=timing)
    return wire.json_chunks(body, late=timing)


async def _until_gone(request: Request) -> None:
    """Returns when the client has gone (the body is read by then, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _while_connected(request: Request, work):
    """Await `work` unless the client goes first: then it is cancelled (a queued run nobody waits for is
    dropped) and None is returned."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_until_gone(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return task.result() if not task.cancelled() else None


class Sending:
    """The sending budget and the worker threads that encode answers, for the whole server."""

    def __init__(self, max_bytes: int, max_renders: int, kept: KeptAnswers | None = None):
        self.budget = ByteBudget(max_bytes)
        self.kept = kept or KeptAnswers(Path(), 0)        # long runs' answers on disk (app/kept.py)
        self.max_renders = max_renders
        self._render: anyio.CapacityLimiter | None = None

    def render_slots(self) -> anyio.CapacityLimiter:
        """Answers built at once: a 512-token answer briefly holds a few hundred MB of copies."""
        if self._render is None:
            self._render = anyio.CapacityLimiter(self.max_renders)
        return self._render

    async def _encode(self, plan: Plan, computed: Computed, started: float) -> list:
        """In a worker thread, unless the plan is light (Plan.light): built on the event loop, MiniLM's last-layer
        answer took 1 ms less of its ~33 (the hand-offs to the thread and back, bench/answer.py)."""
        if plan.light:
            return encode(plan, computed, started)
        return await anyio.to_thread.run_sync(encode, plan, computed, started, limiter=self.render_slots())

    async def respond(self, request: Request, plan: Plan, runner: Runner, if_none_match: str | None,
                      started: float) -> Response:
        """Run, build and send one answer (JSON or binary, as planned)."""
        if if_none_match == plan.etag:
            return Response(status_code=304, headers={"ETag": plan.etag})
        keeps = plan.binary and plan.kept
        if keeps and (data := await anyio.to_thread.run_sync(self.kept.get, plan.etag)) is not None:
            return Response(data, media_type=wire.BINARY, headers={
                "ETag": plan.etag, "X-Cache": "kept", "Cache-Control": "private, max-age=3600", "Vary": "Accept"})
        reserved = plan.size if plan.size >= SLICE else 0          # small answers need no reservation
        if reserved and await _while_connected(request, self.budget.acquire(reserved)) is None:
            return Response(status_code=CLIENT_GONE)

        async def release():
            if reserved:
                await self.budget.release(reserved)
        try:
            computed = await _while_connected(request, plan.compute(runner))
            if computed is None:
                await release()
                return Response(status_code=CLIENT_GONE)
            body = await self._encode(plan, computed, started)
            if keeps:
                await anyio.to_thread.run_sync(self.kept.put, plan.etag, body)
        except BaseException:
            await release()
            raise
        headers = {"ETag": plan.etag, "X-Cache": "hit" if computed.hit else "miss",
                   "Cache-Control": "private, max-age=3600", "Vary": "Accept"}
        return BuffersResponse(body, wire.BINARY if plan.binary else "application/json", headers, release)

    def stream(self, plan: Plan, runner: Runner, started: float, minimal: bool) -> StreamingResponse:
        """The NDJSON form (app/routers.py documents it)."""
        return StreamingResponse(self._lines(plan, runner, started, minimal), media_type=wire.NDJSON,
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                          "Vary": "Accept, Prefer"})

    def generation(self, plan, runner: Runner, started: float) -> StreamingResponse:
        """A generation's NDJSON lines (app/routers.py documents them), each sent as soon as its step is done."""
        return StreamingResponse(self._generated(plan, runner, started), media_type=wire.NDJSON,
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @staticmethod
    async def _generated(plan, runner: Runner, started: float):
        lines = plan.lines(runner, started)
        try:
            async for line in lines:
                yield wire.to_json(line) + b"\n"
        except Exception as e:  # noqa: BLE001 - a refusal becomes the stream's last line; anything else a bug
            answer = refusal(e)
            if answer is None:
                raise
            yield wire.to_json({"error": {"status": answer[0], "detail": answer[1]}}) + b"\n"
        finally:
            await lines.aclose()

    async def _lines(self, plan: Plan, runner: Runner, started: float, minimal: bool, every: float = 0.1):
        """A progress line whenever another layer is done (the last one always), then the answer (`{"done": ...}`
        alone when `minimal`) or the refusal. A client that goes away stops the lines; its run is shared and cached
        like any other (one already under way finishes, one still queued is dropped)."""
        if minimal and plan.binary and plan.kept:          # kept on disk: the answer's fetch reads it there
            data = await anyio.to_thread.run_sync(self.kept.get, plan.etag, False)   # counted when it is sent
            if data is not None:
                tokens = len(wire.from_binary(data)["tokens"])
                yield wire.to_json({"done": {"status": 200, "tokens": tokens, "kept": True}}) + b"\n"
                return
        progress = plan.progress(runner)
        run = asyncio.ensure_future(plan.compute(runner))
        shown, reserved = None, 0
        try:
            while True:
                done, _ = await asyncio.wait({run}, timeout=every)
                if progress is not None and progress.total and (progress.done, progress.total) != shown:
                    shown = (progress.done, progress.total)
                    yield wire.to_json({"progress": plan.progress_line(progress)}) + b"\n"
                if done:
                    break
            try:
                computed = run.result()
                if minimal:
                    yield wire.to_json({"done": {"status": 200, "tokens": len(computed.tokens)}}) + b"\n"
                    return
                reserved = await self.budget.acquire(plan.size)
                body = await self._encode(plan, computed, started)
            except Exception as e:  # noqa: BLE001 - a refusal becomes the stream's last line; anything else a bug
                answer = refusal(e)
                if answer is None:
                    raise
                yield wire.to_json({"error": {"status": answer[0], "detail": answer[1]}}) + b"\n"
                return
            yield b'{"result":'
            for chunk in body:
                yield chunk
            yield b"}\n"
        finally:
            if not run.done():
                run.cancel()
            if reserved:
                await self.budget.release(reserved)
