"""A long text's finished answer kept on disk (app/kept.py, issue 48): the same request again, from another server
on the same folder (a restart; a reloaded page asks the same way), is sent from the file without running the model;
the folder stays within its budget. tiny-gpt's text runs layer by layer here because ATTNSCOPE_LAYERWISE_MB is tiny."""
from __future__ import annotations

from attnscope.app.kept import KeptAnswers
from attnscope.app.wire import BINARY, NDJSON, from_binary

from .conftest import CACHE


def serving(**settings):
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings
    return TestClient(create_app(Settings(models=["tiny-gpt"], cache=CACHE, **settings)))

TEXT = " ".join(["the cat sat on the mat and the dog slept"] * 30)
BODY = {"model": "tiny-gpt", "text": TEXT, "include": ["attention", "summary"], "resolution": 16, "dtype": "float16"}


def test_a_long_answer_is_kept_and_sent_again_without_a_run(tmp_path):
    answers = {}
    for server in ("first", "restarted"):
        with serving(kept_dir=tmp_path, kept_mb=64, layerwise_mb=0.01) as c:
            ran = c.get("/healthz").json()["runs_computed"]
            lines = c.post("/api/attention", json=BODY, headers={"Accept": NDJSON, "Prefer": "return=minimal"})
            r = c.post("/api/attention", json=BODY, headers={"Accept": BINARY})
            assert r.status_code == 200
            health = c.get("/healthz").json()
            answers[server] = (lines.text, r.headers["x-cache"], health["runs_computed"] - ran, health["kept_hits"],
                               r.content)
    first, again = answers["first"], answers["restarted"]
    assert '"progress"' in first[0] and first[1] == "hit" and first[2] >= 1 and first[3] == 0
    assert again[0].strip() == '{"done":{"status":200,"tokens":%d,"kept":true}}' % len(from_binary(again[4])["tokens"])
    assert again[1:4] == ("kept", 0, 1)
    assert again[4] == first[4]                      # the same bytes
    assert len(list(tmp_path.glob("*.atsc"))) == 1


def test_the_folder_keeps_within_its_budget(tmp_path):
    kept = KeptAnswers(tmp_path, 250)
    for i in range(5):
        kept.put(f"e{i}", [b"x" * 100])
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 250
    assert kept.get("e4") == b"x" * 100 and kept.get("e0") is None
    kept.put("big", [b"y" * 300])                    # larger than the budget: not kept
    assert kept.get("big") is None
    assert KeptAnswers(tmp_path, 0).get("e4") is None   # 0: nothing kept, nothing read
