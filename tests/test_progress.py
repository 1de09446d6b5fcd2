"""Long waits say what is happening and can be stopped (issue 39): a run of many runs (head importance, activation
patching) streams its runs done of all with the time left, and stops before its next batch once nobody waits for it
(a client gone or cancelled), caching nothing; one that another request still waits for goes on."""
from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.analyses.importance import ImportanceRequest
from attnscope.app.settings import Settings
from attnscope.runtime.errors import Stopped

from .conftest import CACHE, run_in_fresh_loop

TEXT = "The cat sat on the mat because it was warm, and the dog lay by the door all afternoon long."


@pytest.fixture(scope="module")
def app():
    with TestClient(create_app(Settings(models=["minilm"], cache=CACHE))) as client:
        yield client


def test_importance_streams_its_runs_done_of_all_then_the_answer(app):
    r = app.post("/api/importance", json={"model": "minilm", "text": "The cat sat on the mat.", "batch": 8},
                 headers={"Accept": "application/x-ndjson"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    progress = [line["progress"] for line in lines[:-1]]
    assert progress and all(p["runs_total"] == 6 * 12 for p in progress)          # one run per head
    assert [p["runs"] for p in progress] == sorted({p["runs"] for p in progress})  # it only goes forward
    assert progress[-1]["runs"] == 72 and progress[-1]["eta_s"] == 0.0
    plain = app.post("/api/importance", json={"model": "minilm", "text": "The cat sat on the mat.", "batch": 8})
    assert plain.headers["x-cache"] == "hit" and lines[-1]["result"]["importance"] == plain.json()["importance"]


def test_a_run_of_many_stops_when_nobody_waits_for_it(app):
    svc = app.app.state.service
    plan = svc.plans.importance(ImportanceRequest(model="minilm", text=TEXT + " Again, once more.", batch=1), False)
    seen = {}

    async def main():
        task = asyncio.create_task(plan.compute(svc.runner))
        progress = plan.progress(svc.runner)
        while progress.done < 2:                       # two of its 72 runs done: it is under way
            await asyncio.sleep(0.002)
        task.cancel()                                  # its only client goes away
        with pytest.raises(asyncio.CancelledError):
            await task
        while svc.runner.counts()["running"]:
            await asyncio.sleep(0.005)
        seen["done"] = progress.done
    run_in_fresh_loop(main())
    assert 2 <= seen["done"] < 72 - 8                  # it stopped long before its end
    # nothing kept: no result, no run under way that a later identical request would join (it starts afresh)
    assert svc.runner.cache.get(plan.run.key) is None and not svc.runner._stops and not svc.runner._pending


def test_a_shared_run_of_many_goes_on_while_one_client_waits(app):
    svc = app.app.state.service
    req = ImportanceRequest(model="minilm", text="A shorter text, shared.", batch=2)
    plan = svc.plans.importance(req, False)

    async def main():
        first = asyncio.create_task(plan.compute(svc.runner))
        second = asyncio.create_task(svc.plans.importance(req, False).compute(svc.runner))
        while plan.progress(svc.runner).done < 2:
            await asyncio.sleep(0.002)
        first.cancel()
        done = await second
        assert done.result.values.shape == (6, 12)
    run_in_fresh_loop(main())
    assert svc.runner.cache.get(plan.run.key) is not None


def test_stopped_is_raised_by_the_runtime_between_batches(runtimes):
    from attnscope.runtime.interventions import head_importance
    calls = []
    with pytest.raises(Stopped, match="stopped after 4 of 16 runs"):
        head_importance(runtimes["tiny-gpt"], "the cat sat", batch=4, progress=lambda d, n: calls.append((d, n)),
                        stop=lambda: len(calls) == 2)
    assert calls == [(0, 16), (4, 16)]
