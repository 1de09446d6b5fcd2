"""The corpus view opens a result file of `attnscope corpus` and draws its per-head map and head distances; the file
is kept in the browser, so a reload opens it again (issue 39), until it is closed."""
from __future__ import annotations

from playwright.sync_api import Page, expect

from attnscope.corpus import run_corpus

from ..conftest import CACHE
from .conftest import open_app, screenshot, wait_drawn


def test_corpus_view_draws_a_result_file(page: Page, tmp_path, console_errors):
    src = tmp_path / "texts.txt"
    src.write_text("The cat sat on the mat.\nA dog barked at the cat, twice.\nHello, world!\n")
    out = tmp_path / "texts.minilm.corpus.json"
    job = run_corpus(src, "minilm", workers=0, out=out, progress=False, log=lambda m: None, cache_dir=CACHE)
    open_app(page, "corpus")
    expect(page.locator("#view-corpus .note")).to_contain_text("No corpus opened yet")
    page.set_input_files("#corpus-file", str(out))
    expect(page.locator("#view-corpus")).to_have_attribute("data-texts", "3")
    expect(page.locator("#view-corpus [data-part=stat] .main-svg").first).to_be_visible()
    expect(page.locator("#view-corpus [data-part=js] .main-svg").first).to_be_visible()
    n = page.evaluate("document.querySelector('#view-corpus [data-part=stat]').data[0].z.length")
    assert n == job["layers"] == 6
    page.select_option("#corpus-stat", "previous_token_mass")
    z = page.evaluate("document.querySelector('#view-corpus [data-part=stat]').data[0].z")
    assert z == job["stats"]["previous_token_mass"]
    screenshot(page, "corpus-view")
    # the opened file and its statistic are page memory: kept while another view shows
    page.locator('#tabs a[data-view="head"]').click()
    wait_drawn(page, "head")
    page.locator('#tabs a[data-view="corpus"]').click()
    wait_drawn(page, "corpus")
    expect(page.locator("#view-corpus")).to_have_attribute("data-texts", "3")
    expect(page.locator("#corpus-stat")).to_have_value("previous_token_mass")
    assert page.evaluate("document.querySelector('#view-corpus [data-part=stat]').data[0].z") == z
    # kept in this browser: a reload opens the same file again; Close forgets it
    page.reload()
    wait_drawn(page, "corpus")
    expect(page.locator("#view-corpus")).to_have_attribute("data-texts", "3")
    expect(page.locator("#view-corpus .note")).to_contain_text("Kept in this browser: a reload opens it again.")
    page.locator("#corpus-close").click()
    expect(page.locator("#view-corpus .note")).to_contain_text("No corpus opened yet")
    page.reload()
    wait_drawn(page, "corpus")
    expect(page.locator("#view-corpus .note")).to_contain_text("No corpus opened yet")
    assert console_errors == []
