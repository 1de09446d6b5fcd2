"""The Atlas tab (issue 27) on a job finished beforehand on a server of its own: the Head Finder draws every head, the
dashboard lists the head's top examples as the API stores them, and a click opens that window in the head view."""
from __future__ import annotations

import time
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from playwright.sync_api import expect

from bench.common import server

from .conftest import screenshot, wait_drawn

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def atlas_server(tmp_path_factory):
    """tiny-gpt, with a finished atlas job over 200 texts of the bundled corpus."""
    folder = tmp_path_factory.mktemp("atlas-jobs")
    with server({"ATTNSCOPE_MODELS": "tiny-gpt", "ATTNSCOPE_DEFAULT_MODEL": "tiny-gpt",
                 "ATTNSCOPE_JOBS_DIR": str(folder)}) as (url, _pid):
        r = httpx.post(url + "/api/jobs", json={"model": "tiny-gpt", "corpus": "bundled", "options": {"texts": 200}})
        assert r.status_code == 202, r.text
        job_id, deadline = r.json()["id"], time.monotonic() + 120
        while (job := httpx.get(f"{url}/api/jobs/{job_id}").json())["state"] != "done":
            assert job["state"] in ("queued", "running") and time.monotonic() < deadline, job
            time.sleep(0.2)
        yield url, job, httpx.get(url + job["result"]["json"]).json()


def test_atlas_tab_draws_the_finder_and_a_heads_dashboard_and_opens_an_example(page, console_errors, atlas_server):
    url, job, atlas = atlas_server
    layer, head = 2, 1
    page.goto(f"{url}/?view=atlas&model=tiny-gpt&text=the+cat&job={job['id']}&layer={layer}&head={head}"
              "&x_stat=previous_token_mass&y_stat=induction_mass")
    wait_drawn(page, "atlas")
    view = page.locator("#view-atlas")
    expect(view.locator(".atlas-finder .main-svg").first).to_be_visible()
    points = view.locator(".atlas-finder .scatterlayer .point")
    assert points.count() == atlas["layers"] * atlas["heads"] + 1          # every head, and the selected one marked
    assert view.get_attribute("data-heads") == "16"
    expect(view.locator(".atlas-profile .main-svg").first).to_be_visible()
    top = atlas["examples"][layer][head]["top"]
    strips = view.locator(".atlas-examples:not(.atlas-deciles) > .atlas-example")
    assert strips.count() == len(top) == 10
    first = strips.first.locator(".atlas-token")
    assert first.all_text_contents() == top[0]["tokens"]
    assert first.nth(top[0]["query"]).get_attribute("class") == "atlas-token query"
    screenshot(page, "atlas")
    strips.first.click()
    wait_drawn(page, "head")
    q = parse_qs(urlparse(page.url).query)
    assert q["view"] == ["head"] and q["text"] == [top[0]["text"]] and q["pin"] == [str(top[0]["query"])]
    assert (q["layer"], q["head"]) == ([str(layer)], [str(head)])
    page.go_back()                                                          # the atlas state is a link: back to it
    wait_drawn(page, "atlas")
    assert console_errors == []


def test_atlas_jobs_started_from_the_page_advance_cancel_complete_and_reopen_after_a_reload(page, console_errors,
                                                                                             atlas_server):
    """The jobs panel: a job on the bundled corpus started from the page shows its progress advance (texts done of
    the total, the rate, the time left); one is cancelled, another completes; after a reload the list (the server's
    /api/jobs) shows both, and the finished one opens."""
    url, fixture_job, _ = atlas_server
    page.goto(f"{url}/?view=atlas&model=tiny-gpt&text=the+cat")
    wait_drawn(page, "atlas")
    view = page.locator("#view-atlas")
    expect(view.locator(f".atlas-job[data-job='{fixture_job['id']}']")).to_have_attribute("data-state", "done")

    def start(texts: int) -> str:
        before = set(view.locator(".atlas-job").evaluate_all("rows => rows.map((r) => r.dataset.job)"))
        page.fill("#atlas-texts", str(texts))
        page.click("#atlas-start")
        expect(view.locator("#atlas-form-note")).to_contain_text("Job ")
        page.wait_for_function("(n) => document.querySelectorAll('#view-atlas .atlas-job').length > n", arg=len(before))
        [new] = set(view.locator(".atlas-job").evaluate_all("rows => rows.map((r) => r.dataset.job)")) - before
        return new

    long_id = start(3000)                                   # ~47 chunks of 64 texts: long enough to watch
    row = view.locator(f".atlas-job[data-job='{long_id}']")
    page.wait_for_function("(id) => Number(document.querySelector(`[data-job='${id}']`).dataset.done) > 0",
                           arg=long_id, timeout=60_000)
    first = int(row.get_attribute("data-done"))
    page.wait_for_function("([id, n]) => Number(document.querySelector(`[data-job='${id}']`).dataset.done) > n",
                           arg=[long_id, first], timeout=60_000)  # it advances, polled with no reload
    expect(row).to_have_attribute("data-state", "running")
    expect(row.locator(".atlas-job-progress")).to_contain_text(" of 3,000 texts")
    expect(row.locator(".atlas-job-progress")).to_contain_text("left")
    assert 0 < int(row.locator("progress").get_attribute("value")) < 3000
    row.locator(".atlas-cancel").click()
    expect(row).to_have_attribute("data-state", "cancelled", timeout=60_000)

    short_id = start(100)
    expect(view.locator(f".atlas-job[data-job='{short_id}']")).to_have_attribute("data-state", "done", timeout=120_000)
    expect(page.locator("#atlas-job")).to_contain_text(short_id)  # the menu of finished atlases gained it

    page.reload()
    wait_drawn(page, "atlas")
    expect(view.locator(f".atlas-job[data-job='{long_id}']")).to_have_attribute("data-state", "cancelled")
    expect(view.locator(f".atlas-job[data-job='{long_id}'] .atlas-resume")).to_be_visible()
    done = view.locator(f".atlas-job[data-job='{short_id}']")
    expect(done).to_have_attribute("data-state", "done")
    done.locator(".atlas-open").click()
    wait_drawn(page, "atlas")
    assert parse_qs(urlparse(page.url).query)["job"] == [short_id]
    atlas = httpx.get(f"{url}/api/jobs/{short_id}/result").json()
    assert atlas["texts"] == 100
    points = view.locator(".atlas-finder .scatterlayer .point")
    expect(points).to_have_count(atlas["layers"] * atlas["heads"] + 1)
    expect(view.locator(".note").first).to_contain_text("100 texts")
    screenshot(page, "atlas-jobs")
    assert console_errors == []
