"""The page's own views in a notebook: an answer drawn inline and interactive, offline.

    a = m.attention("The cat sat on the mat.")        # every layer and head
    m.show(a, view="head", layer=2, head=5)            # a View: Jupyter draws its _repr_html_; .save("view.html")

A View's HTML output carries everything it draws with: the answer (the binary wire form, base64, decoded by the
page's own api.js), the model's description and the page's boot block, the page's ES modules (static/js, combined at
run time by app/bundle.py into one module whose entry is static/js/embed.js, as the page's script is main.js's: the
same files the page runs, none copied), the page's stylesheet scoped to the output, and plotly.js from the plotly
package. embed.js answers each view's requests() from the carried answer and draws it with its own controls (view,
layer, head, query): nothing is fetched, from a server or a CDN. plotly.js (4.8 MB) goes into the first View a kernel shows (as plotly's
own offline notebook mode does); later ones use that one, so a notebook whose first View's output was cleared shows
the others once a View is shown again (or pass plotly=True to html()). save() writes a whole page with its own copy.

Views: head, lines and model, from an /api/attention answer that holds the attention matrices of the layers and
heads to draw (include "attention", the default); the logit lens from that and a lens answer (whose head lens is of
the head it was asked for); the effects maps from that, the text's direct logit attribution and its activation (and
path) patching, with the texts, target and site they were asked with (Analyses.show asks for them all). With a
generation (its token lines and the layers and heads whose attention rows they carry), the head and line views draw
the prompt grown by its continuation, as the page does while it generates.
"""
from __future__ import annotations

import base64
import html
import itertools
import json
import zlib
from pathlib import Path

import numpy as np

from ..app import wire
from ..analyses.answers import Answer
from ..app.pages import page_bundle

ENTRY = "embed.js"
# static/js/embed.js VIEWS: each view's name and the answers it draws from (the attention answer: every view's tokens)
VIEWS = {"head": ("Head view", ("attention",)), "lines": ("Lines", ("attention",)),
         "model": ("Model view", ("attention",)), "lens": ("Logit lens", ("attention", "lens")),
         "effects": ("Effects", ("attention",))}
CSS = Path(__file__).resolve().parents[1] / "static" / "css" / "app.css"
UNPACK_JS = Path(__file__).resolve().parents[1] / "static" / "js" / "unpack.js"
_ids = itertools.count()
_plotly_sent = False               # this kernel has shown plotly.js in an output already


def plotly_js() -> str:
    """plotly.js from the plotly package (the file the server serves at /vendor/plotly.min.js)."""
    import plotly

    text = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    if "</script" in text.lower() or "<!--" in text:
        raise ValueError("this plotly.js cannot be inlined in a <script> element")
    return text


# base 85 over printable ASCII without what a JSON string or a <script> element would escape (" \\ < > & ' `): 5
# characters per 4 bytes, 25 % over the bytes where base64 is 33 %
ALPHABET = "".join(c for c in map(chr, range(33, 127)) if c not in "\"\\<>&'`")[:85]


def pack(data: bytes, stride: int = 1) -> str:
    """Bytes as an output carries them: byte-shuffled by `stride` (the first byte of every element, then the second,
    ...: a float16's exponent bytes then its mantissa bytes, which deflate far better apart), raw deflate, then base
    85 (ALPHABET; the last group zero-padded to 4 bytes, the padding's count first). static/js/embed.js unpack() undoes
    it with the browser's own DecompressionStream."""
    if stride > 1:
        data = np.frombuffer(data, np.uint8).reshape(-1, stride).T.tobytes()
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = z.compress(data) + z.flush()
    pad = -len(data) % 4
    words = np.frombuffer(data + b"\0" * pad, ">u4").astype(np.int64)
    digits = np.stack([words // 85 ** k % 85 for k in range(4, -1, -1)], axis=1)
    return str(pad) + np.frombuffer(ALPHABET.encode("ascii"), np.uint8)[digits].tobytes().decode("ascii")


def unpack(packed: str, stride: int = 1) -> bytes:
    """pack's inverse (tests read what an output carries with it)."""
    pad, digits = int(packed[0]), np.frombuffer(packed[1:].encode("ascii"), np.uint8)
    index = np.zeros(128, np.int64)
    index[np.frombuffer(ALPHABET.encode("ascii"), np.uint8)] = np.arange(85)
    words = (index[digits].reshape(-1, 5) * 85 ** np.arange(4, -1, -1)).sum(axis=1)
    data = zlib.decompress(words.astype(">u4").tobytes()[:len(words) * 4 - pad], -15)
    return np.frombuffer(data, np.uint8).reshape(stride, -1).T.tobytes() if stride > 1 else data


def plotly_script() -> str:
    """plotly.js as the first View carries it: packed (4.8 MB -> ~2 MB), then inflated and run at the page's top level
    by the browser, which defines window.Plotly (static/js/plot.js plotlyReady waits for it)."""
    text, UNPACK = plotly_js(), UNPACK_JS.read_text(encoding="utf-8").replace("export ", "")
    version = text[:200].split("plotly.js v", 1)[1].split()[0] if "plotly.js v" in text[:200] else "?"
    return (f"<script>/* plotly.js v{version}, packed */ (async (packed) => {{ {UNPACK} "
            f"(0, eval)(new TextDecoder().decode(await unpack(packed))); }})({json.dumps(pack(text.encode('utf-8')))});"
            f"</script>\n")


def scoped_css() -> str:
    """The page's stylesheet, applied only inside an output (@scope): its :root variables on the output's root."""
    return "@scope (.attnscope-embed) {\n" + CSS.read_text(encoding="utf-8").replace(":root", ":scope") + "\n}\n" + \
        ".attnscope-embed { background: var(--panel); padding: 0.4rem; }\n" \
        ".attnscope-embed .embed-controls { margin-bottom: 0.4rem; }\n"


def _script_json(value) -> str:
    """JSON safe inside a <script> element (no "</script" or "<!--" in it)."""
    return json.dumps(value, separators=(",", ":"), default=wire._plain).replace("<", "\\u003c")


# the output's module: its data handed to boot.js (which reads the page's boot block, or this) and to embed.js' mount;
# the bundle runs synchronously from the first line to the last, so two outputs' scripts never see each other's data
SCRIPT = """globalThis.attnscopeOutput = JSON.parse(document.getElementById(%(data)s).textContent);
%(bundle)s
{ const data = globalThis.attnscopeOutput; delete globalThis.attnscopeOutput; mount(document.getElementById(%(id)s), data); }
"""


class View:
    """One of the page's views of an answer, drawn inline in Jupyter (_repr_html_) or saved as a page (save)."""

    def __init__(self, answers: dict[str, Answer], *, info: dict, boot: dict, state: dict,
                 generation: dict | None = None):
        self.answers, self.info, self.boot, self.state, self.generation = answers, info, boot, state, generation

    def data(self) -> dict:
        """What the output carries for static/js/embed.js mount(): the answers, the model, the boot block and the
        state."""
        return {"info": self.info, "boot": self.boot, "state": self.state,
                "answers": {**{endpoint: _carried(a) for endpoint, a in self.answers.items()},
                            **({"generation": {"json": self.generation}} if self.generation else {})}}

    def html(self, plotly: bool = True) -> str:
        """The output's HTML: its element, the data, the page's modules as one; plotly.js first when `plotly`."""
        uid = f"attnscope-view-{next(_ids)}-{id(self):x}"
        label = html.escape(VIEWS[self.state["view"]][0])
        modules = page_bundle(ENTRY)[0]
        if "</script" in modules.lower() or "<!--" in modules:
            raise ValueError("the page's modules cannot be inlined in a <script> element")
        script = SCRIPT % {"id": json.dumps(uid), "data": json.dumps(uid + "-data"), "bundle": modules}
        return ((plotly_script() if plotly else "")
                + f"<style>{scoped_css()}</style>\n"
                + f'<div class="attnscope-embed" id="{uid}" aria-label="{label}"></div>\n'
                + f'<script type="application/json" id="{uid}-data">{_script_json(self.data())}</script>\n'
                + f'<script type="module">{script}</script>\n')

    def _repr_html_(self) -> str:
        global _plotly_sent
        out = self.html(plotly=not _plotly_sent)
        _plotly_sent = True
        return out

    def save(self, path: str | Path) -> Path:
        """A page of its own (plotly.js in it): open it in a browser, offline."""
        path = Path(path)
        path.write_text(page([self.html(plotly=True)]), encoding="utf-8")
        return path

    def __repr__(self) -> str:
        s = self.state
        return f"<attnscope View {s['view']} of {self.info['id']}: layer {s['layer']}, head {s['head']}>"


def page(fragments: list[str], title: str = "attnscope") -> str:
    """A whole HTML page of output fragments (what a notebook's HTML export holds)."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>\n'
            f"<body>\n{''.join(fragments)}</body></html>\n")


def _carried(answer: Answer) -> dict:
    """An answer in the form the page fetches its endpoint in: the binary wire form with its floats in float16 (as the
    page asks for big answers: every weight to float16's 11 significant bits, a relative error <= 2^-11), packed
    (pack, stride 2: a 256-token MiniLM answer, 18.9 MB of float32, is ~10 MB of text); or the JSON form."""
    _, form = type(answer).VIEW
    if form == "binary":
        blob = b"".join(bytes(c) for c in wire.binary_chunks(answer.data, dtype="float16"))
        return {"packed": pack(blob, 2)}
    return {"json": json.loads(wire.to_json(answer.data))}


def carried(packed: str) -> dict:
    """What an output carries for an answer, decoded as the page decodes it (tests compare the drawing with it)."""
    return wire.from_binary(unpack(packed, 2))


def clearest_head(data: dict) -> tuple[int, int] | None:
    """static/js/first.js clearestHead, of the layers and heads an attention answer holds (its `summary`): the head a
    fresh visit to the page opens, (1 - mean entropy / ln T) x (1 - its largest first-token, last-token or diagonal
    mass), the first of equals; None without a summary."""
    summary = data.get("summary") or {}
    if "mean_entropy" not in summary:
        return None
    entropy = np.asarray(summary["mean_entropy"], np.float64)
    sink = np.max([np.asarray(summary.get(name, np.zeros_like(entropy)), np.float64)
                   for name in ("first_token_mass", "last_token_mass", "diagonal_mass")], axis=0)
    score = (1 - entropy / np.log(max(len(data["tokens"]), 2))) * (1 - sink)
    li, hi = np.unravel_index(int(np.argmax(score)), score.shape)
    return int(data["layers"][li]), int(data["heads"][hi])


def view(*answers: Answer, models: list[dict], boot: dict, view: str = "head", layer: int | None = None,
         head: int | None = None, pin: int | None = None, text: str | None = None, generation: dict | None = None,
         **effects) -> View:
    """A View of `answers`: an Attention answer with its attention matrices, and what else the view draws (a Lens
    answer); `models`: GET /api/models' entries (the answers' model among them); layer and head default to the
    clearest head the answer holds, as on the page's fresh visit (clearest_head; else its first). A view the model
    cannot do (its capability record, as the page's tabs) is refused with the record's reason."""
    carried: dict[str, Answer] = {}
    for a in answers:
        if type(a).VIEW is None:
            raise TypeError(f"show() draws attention, lens, attribution and patching answers (m.attention(text), "
                            f"m.lens(text), ...), not {type(a).__name__}")
        carried[type(a).VIEW[0]] = a          # what embed.js finds it by (analyses' Answer.VIEW)
    if view not in VIEWS:
        raise ValueError(f"view {view!r}: one of {', '.join(VIEWS)}")
    missing = [e for e in VIEWS[view][1] if e not in carried]
    if missing:
        raise ValueError(f"the {VIEWS[view][0].lower()} draws from a{'n' if missing[0][0] in 'aeiou' else ''} "
                         f"{' and '.join(missing)} answer too: show(m.attention(text), m.{missing[-1]}(text), ...)")
    data = carried["attention"].data
    if getattr(data.get("attention"), "ndim", 0) != 4:
        raise ValueError("this answer has no attention matrices: ask for include=['attention'] (the default)")
    if data.get("blocks") is not None or data.get("top_keys") is not None:
        raise ValueError("this answer holds thumbnails or top keys, not whole matrices: ask without resolution/top_k")
    if len({a.data.get("model") for a in answers}) > 1:
        raise ValueError("these answers are of different models")
    info = next((m for m in models if m["id"] == data["model"]), None)
    if info is None:
        raise ValueError(f"model {data['model']!r} is not among the source's models")
    caps = info.get("capabilities") or {}
    if (caps.get("features") or {}).get(view) is False:
        raise ValueError(f"the {VIEWS[view][0].lower()} is not available for {info['title']}: "
                         f"{(caps.get('short') or {}).get(view) or (caps.get('reasons') or {}).get(view, '')}")
    layers, heads = list(data["layers"]), list(data["heads"])
    if layer is None and head is None:
        layer, head = clearest_head(data) or (layers[0], heads[0])
    layer = layers[0] if layer is None else layer
    head = heads[0] if head is None else head
    if layer not in layers or head not in heads:
        raise ValueError(f"layer {layer}, head {head}: this answer holds layers {layers} and heads {heads}")
    if pin is not None and not 0 <= pin < len(data["tokens"]):
        raise ValueError(f"pin {pin}: the text has {len(data['tokens'])} tokens")
    state = {"view": view, "layer": layer, "head": head, "pin": pin, "model": info["id"], "text": text or "",
             **{k: v for k, v in effects.items() if v is not None}}   # the effects view's: corrupt, target, ...
    if generation is not None and text is None:
        raise ValueError("a generation is drawn with its prompt's text")
    return View(carried, info=info, boot=boot, state=state, generation=generation)
