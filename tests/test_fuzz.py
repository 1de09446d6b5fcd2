"""Schemathesis against the OpenAPI schema, in-process (ASGI) and against a real uvicorn, with every check.

Deterministic (fixed seed, derandomized Hypothesis, no example database) and bounded: about 1,100 generated
cases in all. Every built-in check runs (the `--checks all` set, including max_response_time); the one
adjustment is that a schema-valid request may get 413/422 when it breaks a rule JSON Schema cannot state (a token
index past the text's end, two texts of different token counts) — and then `refusal_is_semantic` insists the message
is one of those rules, listed once in tests/unstatable.py, so nothing else hides there.
"""
from __future__ import annotations

import tempfile
from collections import Counter

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS, load_all_checks, max_response_time
from schemathesis.config import SchemathesisConfig

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from tests.unstatable import unstatable

SEED = 20_261_121
POSITIVE_OK = ["2xx", "3xx", "401", "403", "404", "409", "413", "422", "429", "5xx"]  # 5xx: caught by ST101
CONFIG = {
    "seed": SEED,
    "generation": {"mode": "all", "deterministic": True, "database": "none"},
    "checks": {"positive_data_acceptance": {"expected-statuses": POSITIVE_OK}, "max_response_time": 20},
    "output": {"sanitization": {"enabled": False}},   # `mask_tokens` looks like a secret to the sanitiser
}
CASES: Counter[str] = Counter()
STATUSES: Counter[tuple[str, str, int]] = Counter()


def _all_checks() -> list:
    """Every check schemathesis ships (not just the defaults), plus the semantic-refusal guard."""
    load_all_checks()
    checks = [c for c in CHECKS.get_all() if not isinstance(c, type)]
    return [*checks, max_response_time, refusal_is_semantic]


def refusal_is_semantic(ctx, response, case):
    """A schema-valid request refused with 413/422 must be one of the rules JSON Schema cannot state
    (tests/unstatable.py)."""
    if case.meta is None or not case.meta.generation.mode.is_positive or response.status_code not in (413, 422):
        return None
    detail = response.json()["detail"]
    assert unstatable(detail), f"schema-valid request refused for a reason not in tests/unstatable.py: {detail!r}"
    return None


def _settings(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def _run(case, target: str) -> None:
    CASES[target] += 1
    response = case.call_and_validate(checks=CHECKS_ALL)
    STATUSES[target, f"{case.method} {case.path}", response.status_code] += 1


CHECKS_ALL = _all_checks()
# jobs posted while fuzzing are checked and queued, never run (ATTNSCOPE_MAX_JOBS_RUNNING=0), in a folder of their own;
# generations are bounded at 16 new tokens (ATTNSCOPE_MAX_NEW_TOKENS, which the schema's maximum follows): hypothesis
# tries the maximum often, and 256 SmolLM2 steps a case made /api/generate a quarter of the in-process fuzzing's time
APP = create_app(Settings(max_jobs_running=0, max_new_tokens=16, jobs_dir=tempfile.mkdtemp()))
RUNNING = TestClient(APP)      # the app's lifespan, run once for the module (ended by _lifespan): its models loaded,
RUNNING.__enter__()            # as the per-model request schemas fetched below need


async def loaded_once(scope, receive, send):
    """The app, its lifespan left to this module: schemathesis' ASGI client starts an app's lifespan at a test's first
    request and ends it at the test's end, and the app's lifespan loads every model: each of the 21 in-process tests
    loaded the four models again."""
    if scope["type"] != "lifespan":
        return await APP(scope, receive, send)
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


ASGI = schemathesis.openapi.from_asgi("/openapi.json", loaded_once, config=SchemathesisConfig.from_dict(CONFIG))


# ---- in-process ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _lifespan():
    yield
    RUNNING.__exit__(None, None, None)


@ASGI.include(path="/api/attention").parametrize()
@_settings(260)
def test_asgi_attention(case):
    _run(case, "asgi")


@ASGI.include(path="/api/stages").parametrize()
@_settings(200)
def test_asgi_stages(case):
    _run(case, "asgi")


@ASGI.exclude(path=["/api/attention", "/api/stages"]).parametrize()
@_settings(60)
def test_asgi_other(case):
    _run(case, "asgi")


# ---- a real uvicorn -------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def live_schema(live_server):
    return schemathesis.openapi.from_url(f"{live_server}/openapi.json", config=SchemathesisConfig.from_dict(CONFIG))


LIVE = schemathesis.pytest.from_fixture("live_schema")


@LIVE.parametrize()
@_settings(110)
def test_live(case):
    _run(case, "live")


def test_case_count():
    """At least 1,000 generated cases in all (runs last in this file; skipped when the fuzz tests were not run)."""
    if not CASES["asgi"] or not CASES["live"]:
        pytest.skip("run together with the fuzz tests")
    print(f"schemathesis cases: {dict(CASES)}, total {sum(CASES.values())}")
    for key, n in sorted(STATUSES.items()):
        print(*key, n)
    assert sum(CASES.values()) >= 1000, CASES
