"""Every analysis as a Python method, made from the registry (analyses/registry.py) for both sides of the Python API:

    m = attnscope.load("smollm2")                    # in-process (python/local.py Model): no server
    api = attnscope.Client("http://127.0.0.1:8000")  # remote (python/client.py Client)
    m.patching(clean, corrupt, "␣Mary", "␣John")     # == api.patching(...): the same answer, typed

Each analysis' Method (its module in analyses/) builds the request body the REST API takes from the method's
arguments; the method hands it to its side's `_post(path, body)`, which answers the endpoint's payload decoded from
the binary wire form: the in-process side runs the route's own plan, compute, payload and encoding (python/local.py),
the remote side posts it. Both then read it into the analysis' answer class. A generation goes through `_lines`, atlas
jobs through `_job_*`.
"""
from __future__ import annotations

import inspect
import time
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from ..analyses.atlas import AtlasJob



class Analyses:
    """The analyses; a subclass supplies `_post`, `_lines`, `_job_post`, `_job_get`, `_job_cancel`, `_job_delete`, `_job_result`
    and `model_id` (the model a call without `model=` asks for; None: the server's default)."""
    model_id: str | None = None

    def __new__(cls, *args, **kwargs):
        _attach()
        return super().__new__(cls)

    def _post(self, path: str, body: dict) -> dict:
        raise NotImplementedError

    def _lines(self, path: str, body: dict) -> Iterator[dict]:
        raise NotImplementedError

    def _with_model(self, body: dict, model: str | None) -> dict:
        model = model or self.model_id
        return body if model is None else {"model": model, **body}

    # ---- in Jupyter ------------------------------------------------------------------------------------------------
    def show(self, *answers, view: str = "head", layer: int | None = None, head: int | None = None,
             pin: int | None = None, model: str | None = None, corrupt: str | None = None, target: str | None = None,
             distractor: str | None = None, site: str | None = None, direction: str | None = None,
             generate: int | dict | None = None):
        """The page's own view (head, lines, model, lens or effects) of answers, or of a text's (every layer and
        head; for the lens also its logit lens and the head lens of (layer, head); for the effects maps its direct
        logit attribution of target (- distractor) and, with corrupt, its patching at site), drawn inline and
        interactive in Jupyter, offline (python/jupyter.py): `m.show(m.attention(text), layer=2, head=5)`,
        `m.show(text, view="lens")`, `m.show(clean, view="effects", corrupt=..., target="␣Mary")`; `.save(path)`
        writes it as a page. generate: new tokens (greedy), or generate()'s options: the text's continuation, with
        every head's attention rows, grows the head and line views as the page's Generate control does."""
        from . import jupyter

        text = answers[0] if len(answers) == 1 and isinstance(answers[0], str) else None
        if text is not None:
            a = self.attention(text, model=model)
            answers = (a,)
            if view == "lens":
                if layer is None and head is None:     # the head the view opens on (jupyter.view): its head lens
                    layer, head = jupyter.clearest_head(a.data) or (None, None)
                layer = a.layers[0] if layer is None else layer
                head = a.heads[0] if head is None else head
                info = next(m for m in self.models() if m["id"] == a.model)
                able = info.get("capabilities", {}).get("features", {}).get("head_lens") is not False
                answers += (self.lens(text, model=model, head_lens=(layer, head) if able else None),)
            if view == "effects" and target is not None:
                answers += (self.attribution(text, target, distractor, model=model),)
                if corrupt is not None:
                    answers += (self.patching(text, corrupt, target, distractor, site=site, direction=direction,
                                              model=model),)
        elif view == "effects" or generate is not None:
            raise ValueError("the effects maps and a generation are of a text: show(text, view=..., ...)")
        generation = None
        if generate is not None:
            options = {"max_new_tokens": generate, "greedy": True} if isinstance(generate, int) else dict(generate)
            a = answers[0]
            g = self.generate(text, model=model, **options, include=["attention"], layers=list(a.layers),
                              heads=list(a.heads))
            g.result()
            generation = {"steps": g.tokens, "layers": list(a.layers), "heads": list(a.heads)}
        patched = next((a.data for a in answers if a.data.get("site")), {})
        return jupyter.view(*answers, models=self.models(), boot=self._boot(), view=view, layer=layer, head=head,
                            pin=pin, text=text, corrupt=corrupt, target=target, distractor=distractor,
                            site=patched.get("site"), direction=patched.get("direction"), generation=generation)

    def _boot(self) -> dict:
        """The page's boot block for this side's models (app/pages.py boot_block)."""
        from ..app.pages import boot_block

        return boot_block(self.models(), default_model=self.model_id)

    def models(self) -> list[dict]:
        raise NotImplementedError

    # ---- corpus jobs -----------------------------------------------------------------------------------------------
    def atlas(self, *, corpus: str | dict = "bundled", model: str | None = None, **options) -> "AtlasJob":
        """POST /api/jobs: start (or find, or resume) a head atlas over a corpus ("bundled", or an upload
        {"format": "jsonl" | "txt" | ..., "data": ...} as the API takes it); options as AtlasOptions (texts, ...).
        The answer is the job: .progress(), .cancel(), .wait(), .result(), .delete()."""
        body = {"kind": "atlas", "corpus": corpus, "options": options}
        from ..analyses.atlas import AtlasJob

        return AtlasJob(self, self._job_post(self._with_model(body, model)))

    def job(self, job_id: str) -> "AtlasJob":
        """A job by its id (GET /api/jobs/{id})."""
        from ..analyses.atlas import AtlasJob

        return AtlasJob(self, self._job_get(job_id))

    def jobs(self) -> list[dict]:
        """Every job, newest first (GET /api/jobs)."""
        return self._job_list()

    def _job_list(self) -> list[dict]:
        raise NotImplementedError

    def _job_post(self, body: dict) -> dict:
        raise NotImplementedError

    def _job_get(self, job_id: str) -> dict:
        raise NotImplementedError

    def _job_cancel(self, job_id: str) -> dict:
        raise NotImplementedError

    def _job_delete(self, job_id: str) -> None:
        raise NotImplementedError

    def _job_result(self, job_id: str) -> dict:
        raise NotImplementedError

    def _wait(self, job_id: str, timeout: float, every: float = 0.2) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self._job_get(job_id)
            if job["state"] not in ("queued", "running", "cancelling") or time.monotonic() > deadline:
                return job
            time.sleep(every)


def _method(path: str, m):
    """The Python method of an analysis' Method: its body's signature (plus `model=`), its docstring, its answer."""
    from ..analyses.base import signature_of

    def method(self, *args, model: str | None = None, **kwargs):
        body = self._with_model(m.body(*args, **kwargs), model)
        return m.answer(self._lines(path, body) if m.lines else self._post(path, body))
    sig = signature_of(m.body)
    method.__signature__ = sig.replace(parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
                                                   *sig.parameters.values()])
    method.__name__, method.__qualname__, method.__doc__ = m.name, f"Analyses.{m.name}", m.body.__doc__
    return method


def _attach() -> None:
    """Every analysis' methods on Analyses, from the registry, once: when the first Model or Client is made (so that
    `from attnscope import Client` needs the standard library and NumPy only; a call reads the registry, which
    needs the package's own dependencies)."""
    if "attention" in Analyses.__dict__:
        return
    from ..analyses.registry import methods

    for name, (analysis, m) in methods().items():
        setattr(Analyses, name, _method(analysis.path, m))
