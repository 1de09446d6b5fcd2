"""The page routes: the app page, the API reference, and plotly.js / Swagger UI from installed packages."""
from __future__ import annotations

from pathlib import Path
from typing import get_args

import fastapi_offline
import plotly
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from fastapi.templating import Jinja2Templates

from ..analysis.roles import ROLE_TARGETS, ROLE_TEXT
from ..analysis.statistics import catalogue
from . import bundle
from .deps import get_service
from .schemas import EXAMPLE_TEXT, PatchingRequest, RunOptions

ROOT = Path(__file__).resolve().parents[1]   # the attnscope package: static/ and templates/ are its data
# The page's views, in tab order (id, tab label): the tabs, the view panels and static/js/main.js follow this list.
VIEWS = [("head", "Head"), ("lines", "Lines"), ("model", "Model"), ("summary", "Head summary"),
         ("entropy", "Entropy"), ("compare", "Compare"), ("stages", "Causal mask & steps"), ("circuits", "Circuits"),
         ("effects", "Effects"), ("lens", "Logit lens"), ("corpus", "Corpus"), ("atlas", "Atlas")]
# The tab bar groups the views by the question each answers, in VIEWS' order.
VIEW_GROUPS = [("Where heads look", ("head", "lines", "model", "summary", "entropy", "compare")),
               ("Why", ("stages", "circuits")),
               ("What they do", ("effects", "lens")),
               ("Over a corpus", ("corpus", "atlas"))]
assert [v for _, ids in VIEW_GROUPS for v in ids] == [v for v, _ in VIEWS]
# Which of these a model can do is its capability record's (runtime/capabilities.py: one feature per view id).
# The attentions an encoder-decoder's answer holds (the page's "Attention" control: static/js/encdec.js).
ATTENTIONS = [("encoder", "Encoder self-attention"), ("decoder", "Decoder self-attention"),
              ("cross", "Cross-attention (decoder → encoder)")]
# What replaces a knocked-out head's output (RunOptions.ablation), in the page's words.
ABLATION_LABELS = {"zero": "zeros", "mean": "their mean over the text"}
# What activation patching patches (PatchingRequest.site) and which way (direction), in the page's words.
SITE_LABELS = {"head_output": "head output (hook_z)", "query": "queries (hook_q)", "key": "keys (hook_k)",
               "value": "values (hook_v)", "pattern": "attention pattern (hook_pattern)",
               "residual": "residual stream, per position (hook_resid_pre)"}
DIRECTION_LABELS = {"denoise": "denoise: clean values into the corrupt run",
                    "noise": "noise: corrupt values into the clean run"}
# Example texts the page offers (its Examples menu), by the kinds of model they suit: (id, label, text, second
# sentence or None, kinds). Chosen because their heads show something: names copied from context, a repeat that an
# induction head completes, a sentence that misleads on first reading, a pronoun to resolve.
EXAMPLES = [
    ("ioi", "Indirect object: who gets the drink?", "When Mary and John went to the store, John gave a drink to", None,
     ("decoder",)),
    ("induction", "Induction: a text that repeats",
     "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.", None,
     ("decoder", "encoder")),
    ("garden", "Garden path: the old man the boat", "The old man the boat, and the young sail.", None,
     ("decoder", "encoder")),
    ("coreference", "Coreference: what was too tired?", EXAMPLE_TEXT, None, ("decoder", "encoder")),
    ("pair", "Sentence pair: a question and its answer", "Where did the cat sleep?", "The cat slept on the warm mat.",
     ("encoder",)),
    ("translation", "Translation: a short sentence", "The house is wonderful.", None, ("encoder-decoder",)),
]
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
SWAGGER_DIR = Path(fastapi_offline.__file__).parent / "static"   # swagger-ui-bundle.js, swagger-ui.css
templates = Jinja2Templates(directory=ROOT / "templates")
_modules: dict = {}


def page_modules(entry: str = "main.js") -> list[str]:
    """Every ES module the page's script imports, at any depth (static/js), as URLs: the page lists them as
    modulepreload links, so the browser fetches them all at once instead of one import level after another (~40
    modules, six levels deep). Read from the files when they change (their mtimes)."""
    root = ROOT / "static" / "js"
    stamp = tuple(sorted((str(p), p.stat().st_mtime_ns) for p in root.rglob("*.js")))
    if _modules.get("stamp") != stamp:
        _modules.update(stamp=stamp, urls=[f"/static/js/{m}" for m in bundle.imported(entry, root)])
    return _modules["urls"]


router = APIRouter(include_in_schema=False)


@router.get("/")
def index(request: Request):
    svc = get_service(request)
    loading = svc.loading          # the models still loading (the server answers while they load): their states
    wanted = request.query_params.get("model") or svc.settings.default_model   # a link's model, else the default
    if wanted in loading:          # nothing to draw yet: which models load, until the one the page shows is ready
        return templates.TemplateResponse(request, "loading.html", {"loading": loading, "wait": wanted})
    models = svc.models()
    boot = boot_block([m.model_dump() for m in models], default_model=svc.settings.default_model,
                      max_chars=svc.max_chars, max_new_tokens=svc.settings.max_new_tokens,
                      architectures=architectures(svc.runtimes.values()))
    return templates.TemplateResponse(request, "index.html", {"models": models, "boot": boot, "views": VIEWS,
                                                              "view_groups": VIEW_GROUPS, "labels": dict(VIEWS),
                                                              "modules": page_modules(), "loading": loading,
                                                              "wait": None})


def architectures(runtimes) -> dict:
    """What the page says about a family (steps view): from the served models' own configurations."""
    return {rt.spec.architecture: {"norm_first": rt.cfg.norm_first, "norm": rt.cfg.norm, "position": rt.cfg.position,
                                   "qkv_bias": rt.cfg.qkv_bias, "qk_norm": rt.cfg.qk_norm,
                                   "output_norms": rt.cfg.output_norms, "parallel_residual": rt.cfg.parallel_residual,
                                   "rotary_dim": rt.cfg.rotary_dim, "d_head": rt.cfg.d_head} for rt in runtimes}


def boot_block(models: list[dict], *, default_model: str | None, max_chars: int | None = None,
               max_new_tokens: int | None = None, architectures: dict | None = None) -> dict:
    """The page's boot block (static/js/boot.js reads it): the served models (GET /api/models' entries), the views,
    statistics, head roles and the menus' choices. A view drawn outside the page (app/jupyter.py) carries it too."""
    return {"models": models, "default_model": default_model,
            "example_text": EXAMPLE_TEXT, "max_chars": max_chars,
            "max_new_tokens": max_new_tokens,   # the Generate control's limit (ATTNSCOPE_MAX_NEW_TOKENS)
            "views": [{"id": v, "label": label} for v, label in VIEWS],
            "attentions": [{"id": a, "label": label} for a, label in ATTENTIONS],
            "stats": catalogue(),
            "examples": [{"id": i, "label": label, "text": text, "text_pair": pair, "kinds": list(kinds)}
                         for i, label, text, pair, kinds in EXAMPLES],
            "architectures": architectures or {},
            "roles": [{"id": k, "target": target, "text": ROLE_TEXT[k]} for k, target in ROLE_TARGETS.items()],
            "ablations": [{"id": k, "label": ABLATION_LABELS.get(k, k)}
                          for k in get_args(RunOptions.model_fields["ablation"].annotation)],
            # the effects view's menus: what POST /api/patching takes
            "sites": [{"id": k, "label": SITE_LABELS.get(k, k)}
                      for k in get_args(PatchingRequest.model_fields["site"].annotation)],
            "directions": [{"id": k, "label": DIRECTION_LABELS.get(k, k)}
                           for k in get_args(PatchingRequest.model_fields["direction"].annotation)]}


@router.get("/docs")
def docs(request: Request):
    """Swagger UI on /openapi.json, served from the app (FastAPI's own page loads it from a CDN)."""
    return templates.TemplateResponse(request, "docs.html", {})


@router.get("/vendor/plotly.min.js")
def plotly_js():
    return FileResponse(PLOTLY_JS, media_type="application/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})
