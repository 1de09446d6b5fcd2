"""Helpers for the browser suite: API calls to compare against, waiting for a view to draw,
dialog and CSP-violation recorders, screenshots into test-artifacts/."""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
EXAMPLE = "The animal didn't cross the street because it was too tired."

# The visible view has drawn the state now in the URL, and nothing is loading.
DRAWN_JS = """(view) => {
  const v = document.querySelector('.view:not([hidden])');
  return !!v && (!view || v.dataset.view === view) && v.dataset.state === location.search
    && document.getElementById('view-area').getAttribute('aria-busy') === 'false';
}"""


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1366, "height": 900}}


def wait_drawn(page, view: str | None = None, timeout: float = 30_000) -> None:
    page.wait_for_function(DRAWN_JS, arg=view, timeout=timeout)


def open_app(page, view: str | None = None, **params) -> None:
    """Open the page with the given state in the URL and wait until its view has drawn."""
    if view:
        params["view"] = view
    page.goto("/" + ("?" + urlencode(params) if params else ""))
    wait_drawn(page, view)


def screenshot(page, name: str, full_page: bool = True) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def update_docs_screenshot() -> bool:
    """docs/screenshot.png is rewritten only when asked (ATTNSCOPE_UPDATE_SCREENSHOT=1), so test runs leave git clean."""
    return os.environ.get("ATTNSCOPE_UPDATE_SCREENSHOT") == "1"


@pytest.fixture(scope="session")
def live_server_gemma3():
    """A real uvicorn serving Gemma 3 270M alone (its 18 layers with local ones, 4 heads): the control-text test
    (test_honest_page.py) covers every zoo model. Loading it takes seconds once its graphs are in the suite's cache."""
    import tempfile

    from bench.common import server

    with tempfile.TemporaryDirectory() as jobs, server({"ATTNSCOPE_MODELS": "gemma3", "ATTNSCOPE_DEFAULT_MODEL": "gemma3",
                                                        "ATTNSCOPE_JOBS_DIR": jobs}, timeout=600) as (url, _pid):
        yield url


def tiny_llama(folder: Path, heads: int = 1, positions: int = 32768, peaked: bool = False) -> Path:
    """A random Llama-shaped checkpoint folder (2 layers, `heads` heads of 16 dimensions sharing one key/value head,
    d_model 32, an LM head tied to the embeddings, the mistral-style byte-level tokenizer of tests/test_checkpoints.py,
    max_position_embeddings `positions`): a model whose runs take seconds at any length the page asks. peaked: q and
    k drawn N(0, 1), so each row's weight goes mostly to one key."""
    import torch
    import transformers

    from ..test_checkpoints import save_tokenizer, widen

    folder.mkdir()
    vocab = save_tokenizer("mistral", folder)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=1,
        head_dim=16, intermediate_size=64, max_position_embeddings=positions, tie_word_embeddings=True,
        rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    widen(model, seed=48)
    if peaked:
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    proj.weight.mul_(1.0 / 0.3)          # q and k N(0, 1): peaked rows
    model.save_pretrained(folder)
    return folder


@pytest.fixture
def api(live_server):
    """POST /api/attention (JSON) with the page's defaults; returns the decoded answer."""
    def call(path: str = "/api/attention", **body):
        body.setdefault("model", "minilm")
        body.setdefault("text", EXAMPLE)
        r = httpx.post(live_server + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()
    return call


@pytest.fixture
def dialogs(page):
    """Every alert/confirm/prompt the page opens (there must be none)."""
    seen = []

    def on_dialog(d):
        seen.append(d.message)
        d.dismiss()
    page.on("dialog", on_dialog)
    return seen


@pytest.fixture
def csp_violations(page):
    """securitypolicyviolation events, collected from before the page's own scripts run."""
    page.add_init_script("""
      window.__cspViolations = [];
      document.addEventListener('securitypolicyviolation', (e) => {
        window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
      });
    """)
    return lambda: page.evaluate("window.__cspViolations")


def plot_point(page, plot_selector: str, x: float, y: float) -> tuple[float, float]:
    """Page coordinates of data point (x, y) in a Plotly plot (for real mouse hovers and clicks)."""
    return tuple(page.evaluate("""([sel, x, y]) => {
      const gd = document.querySelector(sel), fl = gd._fullLayout, r = gd.getBoundingClientRect();
      return [r.left + fl.xaxis._offset + fl.xaxis.l2p(x), r.top + fl.yaxis._offset + fl.yaxis.l2p(y)];
    }""", [plot_selector, x, y]))


# The active view's picture as laid out: the first Plotly chart, line-view SVG or model-view grid the visible view
# holds, its box in the viewport, the viewport's height and how far the page is scrolled.
PLOT_BOX_JS = """() => {
  const v = document.querySelector('.view:not([hidden])');
  const el = v && [...v.querySelectorAll('.js-plotly-plot, .lines-svg, .thumb-grid')].find((e) => e.getClientRects().length);
  if (!el) return null;
  const r = el.getBoundingClientRect();
  return {view: v.dataset.view, top: r.top, bottom: r.bottom, viewport: innerHeight, scrolled: scrollY};
}"""
SMALL_SCREEN = {"width": 1280, "height": 720}


def assert_plot_seen(page, visible: float = 200, box: dict | None = None) -> dict:
    """At least `visible` px of the active view's picture on screen, however far the page is scrolled (clicking
    Generate scrolls the page to it: the side panel scrolls with the page, issue 51); box: PLOT_BOX_JS's answer
    measured earlier in the page (default: measured now)."""
    box = page.evaluate(PLOT_BOX_JS) if box is None else box
    assert box is not None and min(box["bottom"], box["viewport"]) - max(box["top"], 0) >= visible, box
    return box


def assert_plot_on_screen(page, visible: float = 200) -> dict:
    """The active view's picture starts inside the viewport, unscrolled, with at least `visible` px of it on screen."""
    box = page.evaluate(PLOT_BOX_JS)
    assert box is not None, "the view drew no picture"
    assert box["scrolled"] == 0 and 0 <= box["top"] <= box["viewport"] - visible, box
    return box
