"""The page routes: the app page, the API reference, and plotly.js / Swagger UI from installed packages."""
from __future__ import annotations

import functools
import gzip
import hashlib
from pathlib import Path
from typing import get_args

import fastapi_offline
import plotly
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response
from fastapi.templating import Jinja2Templates

from ..analysis.roles import ROLE_TARGETS, ROLE_TEXT
from ..analysis.statistics import catalogue
from .bundle import bundle
from ..analyses.patching import PatchingRequest
from ..analyses.registry import page as page_analyses
from ..analyses.schemas import EXAMPLE_TEXT, RunOptions

ROOT = Path(__file__).resolve().parents[1]   # the attnscope package: static/ and templates/ are its data
# The page's views, in tab order (id, tab label): the tabs, the view panels and static/js/main.js follow this list.
VIEWS = [("head", "Head"), ("lines", "Lines"), ("model", "Model"), ("summary", "Head summary"),
         ("entropy", "Entropy"), ("compare", "Compare"), ("stages", "Causal mask & steps"), ("circuits", "Circuits"),
         ("effects", "Effects"), ("lens", "Logit lens"), ("cache", "KV cache"), ("corpus", "Corpus"), ("atlas", "Atlas")]
# The tab bar groups the views by the question each answers, in VIEWS' order.
VIEW_GROUPS = [("Where heads look", ("head", "lines", "model", "summary", "entropy", "compare")),
               ("Why", ("stages", "circuits")),
               ("What they do", ("effects", "lens", "cache")),
               ("Over a corpus", ("corpus", "atlas"))]
assert [v for _, ids in VIEW_GROUPS for v in ids] == [v for v, _ in VIEWS]
# What each view needs of a model: features of its capability record (runtime/capabilities.py FEATURES). Each view is a
# feature of the record /api/models serves too, by its id (capability_record): a model that lacks one of the features
# its view needs gets the tab disabled with that feature's short reason (static/js/main.js).
VIEW_NEEDS = {"head": (), "lines": (), "model": ("summary",), "summary": ("summary",), "entropy": ("summary",),
              "compare": ("summary",), "stages": ("stages",), "circuits": ("circuits",),
              "effects": ("summary", "patching", "knockout"), "lens": ("lens",), "cache": ("generate",),
              "corpus": ("summary",), "atlas": ("jobs",)}
assert list(VIEW_NEEDS) == [v for v, _ in VIEWS]
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
_bundles: dict = {}


def page_bundle(entry: str = "main.js") -> tuple[str, str]:
    """static/js/`entry` and every module it imports (~40, six levels deep), as one module (app/bundle.py): the
    page's script (main.js), one request instead of one per module; a notebook output's (embed.js, python/jupyter.py). Built at start, and again when a file under static/js
    changes (their mtimes); returns (text, its ETag)."""
    root = ROOT / "static" / "js"
    stamp = tuple(sorted((str(p), p.stat().st_mtime_ns) for p in root.rglob("*.js")))
    if _bundles.get(entry, {}).get("stamp") != stamp:
        text = bundle(root / entry)
        _bundles[entry] = {"stamp": stamp, "text": text,
                           "etag": '"' + hashlib.sha256(text.encode()).hexdigest()[:16] + '"'}
    return _bundles[entry]["text"], _bundles[entry]["etag"]


router = APIRouter(include_in_schema=False)


@router.get("/")
def index(request: Request):
    svc = request.app.state.service   # as routers.get_service, which this module cannot import: the service imports it
    loading = svc.loading          # the models still loading (the server answers while they load): their states
    wanted = request.query_params.get("model") or svc.settings.default_model   # a link's model, else the default
    if wanted in loading:          # nothing to draw yet: which models load, until the one the page shows is ready
        return templates.TemplateResponse(request, "loading.html", {"loading": loading, "wait": wanted})
    models = svc.models()
    boot = boot_block([m.model_dump() for m in models], default_model=svc.settings.default_model,
                      max_chars=svc.max_chars, max_new_tokens=svc.settings.max_new_tokens,
                      architectures=architectures(svc.runtimes.values()),
                      limits={"patching_tokens": svc.settings.max_patching_tokens,
                              "stacked_mb": svc.settings.layerwise_mb})
    return templates.TemplateResponse(request, "index.html", {"models": models, "boot": boot, "views": VIEWS,
                                                              "view_groups": VIEW_GROUPS, "labels": dict(VIEWS),
                                                              "loading": loading, "wait": None})


def architectures(runtimes) -> dict:
    """What the page says about a family (steps view): from the served models' own configurations."""
    return {rt.spec.architecture: {"norm_first": rt.cfg.norm_first, "norm": rt.cfg.norm, "position": rt.cfg.position,
                                   "qkv_bias": rt.cfg.qkv_bias, "qk_norm": rt.cfg.qk_norm,
                                   "output_norms": rt.cfg.output_norms, "parallel_residual": rt.cfg.parallel_residual,
                                   "rotary_dim": rt.cfg.rotary_dim, "d_head": rt.cfg.d_head} for rt in runtimes}


def capability_record(caps) -> dict:
    """A model's capability record as /api/models serves it and the page reads it: the runtime's record
    (runtime/capabilities.py Capabilities.record), with each view among its features, by its id, refused with the
    short reason of the first feature it needs that the model lacks."""
    record = caps.record()
    features, short = record["features"], record["short"]
    for view, needs in VIEW_NEEDS.items():
        lacking = next((f for f in needs if not features[f]), None)
        features[view] = lacking is None
        if lacking is not None:
            short[view] = short.get(lacking) or record["reasons"][lacking]
    return record


def boot_block(models: list[dict], *, default_model: str | None, max_chars: int | None = None,
               max_new_tokens: int | None = None, architectures: dict | None = None, limits: dict | None = None) -> dict:
    """The page's boot block (static/js/boot.js reads it): the served models (GET /api/models' entries), the views,
    statistics, head roles and the menus' choices. A view drawn outside the page (python/jupyter.py) carries it too."""
    return {"models": models, "default_model": default_model,
            "example_text": EXAMPLE_TEXT, "max_chars": max_chars,
            "max_new_tokens": max_new_tokens,   # the Generate control's limit (ATTNSCOPE_MAX_NEW_TOKENS)
            # the lengths the server's analyses take (static/js/length.js: tabs that would refuse, disabled beforehand):
            # patching_tokens (ATTNSCOPE_MAX_PATCHING_TOKENS), stacked_mb (ATTNSCOPE_LAYERWISE_MB)
            "limits": limits or {},
            "views": [{"id": v, "label": label} for v, label in VIEWS],
            "attentions": [{"id": a, "label": label} for a, label in ATTENTIONS],
            "stats": catalogue(),
            "analyses": page_analyses(),       # static/js/api.js: each analysis' route, fields and form
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


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """If-None-Match by weak comparison (RFC 9110 13.1.2): `*`, or any tag of its list, W/ or not, equal to etag."""
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag.removeprefix("W/") in tags


@router.get("/bundle/main.js")
def main_js(request: Request):
    """The page's script as one module (page_bundle); revalidated by its ETag (a changed file, a new bundle)."""
    text, etag = page_bundle()
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(text, media_type="text/javascript", headers=headers)


@functools.cache
def plotly_gzip() -> bytes:
    """plotly.min.js gzipped once (4.8 MB -> 1.5 MB, 0.25 s): not compressed again by GZipMiddleware for every page
    load (0.12 s of the server's CPU each, while the page's first request is under way)."""
    return gzip.compress(PLOTLY_JS.read_bytes(), compresslevel=9, mtime=0)


@router.get("/vendor/plotly.min.js")
def plotly_js(request: Request):
    headers = {"Cache-Control": "public, max-age=86400", "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(plotly_gzip(), media_type="application/javascript",
                        headers={**headers, "Content-Encoding": "gzip"})
    return FileResponse(PLOTLY_JS, media_type="application/javascript", headers=headers)
