"""Every analysis as a Python method, one definition for both sides of the Python API:

    m = attnscope.load("smollm2")                    # in-process (app/local.py Model): no server
    api = attnscope.Client("http://127.0.0.1:8000")  # remote (app/client.py Client)
    m.patching(clean, corrupt, "␣Mary", "␣John")     # == api.patching(...): the same answer, typed (app/answers.py)

A method builds the request body the REST API takes (app/schemas.py names every field) and hands it to its side's
`_post(path, body)`, which answers the endpoint's payload decoded from the binary wire form: the in-process side runs
the route's own plan, compute, payload and encoding (app/local.py), the remote side posts it. Both then read it into
the same answer class. Generation and atlas jobs likewise go through `_lines` and `_job_*`.
"""
from __future__ import annotations

import time
from typing import Iterator

from . import answers


def _body(**fields) -> dict:
    """The fields given (None: the API's default)."""
    return {k: v for k, v in fields.items() if v is not None}


class Analyses:
    """The analyses; a subclass supplies `_post`, `_lines`, `_job_post`, `_job_get`, `_job_cancel`, `_job_result`
    and `model_id` (the model a call without `model=` asks for; None: the server's default)."""
    model_id: str | None = None

    def _post(self, path: str, body: dict) -> dict:
        raise NotImplementedError

    def _with_model(self, body: dict, model: str | None) -> dict:
        model = model or self.model_id
        return body if model is None else {"model": model, **body}

    # ---- one text --------------------------------------------------------------------------------------------------
    def attention(self, text: str, *, model: str | None = None, **options) -> answers.Attention:
        """POST /api/attention: per-head attention probabilities [layer, head, query, key] of the asked layers and
        heads, entropy, summaries; options as the API takes them (layers, heads, causal, mask_tokens, ablate,
        include, ...)."""
        return answers.Attention(self._post("/api/attention", self._with_model({"text": text, **options}, model)))

    def stages(self, text: str, layer: int, head: int, *, model: str | None = None, **options) -> answers.Stages:
        """POST /api/stages: every step of one head (x, q, k, v, scores, scaled, mask, masked, probs, ctx, ...)."""
        body = {"text": text, "layer": layer, "head": head, **options}
        return answers.Stages(self._post("/api/stages", self._with_model(body, model)))

    def attribution(self, text: str, target: str, distractor: str | None = None, *, position: int | None = None,
                    model: str | None = None) -> answers.Attribution:
        """Direct logit attribution (POST /api/attention with include ["attribution"]): each head's, MLP's and the
        embeddings' direct share of logit(target) (- logit(distractor)) at `position` (default: the last)."""
        body = _body(text=text, include=["attribution"], target=target, distractor=distractor, position=position)
        return answers.Attribution(self._post("/api/attention", self._with_model(body, model)))

    def knockout(self, text: str, queries: list[int], keys: list[int], *, layers: tuple[int, int] | None = None,
                 model: str | None = None) -> answers.Knockout:
        """POST /api/knockout: `queries` stop reading `keys` in layers [first, last]; the prediction before/after."""
        body = _body(text=text, queries=list(queries), keys=list(keys), layers=None if layers is None else list(layers))
        return answers.Knockout(self._post("/api/knockout", self._with_model(body, model)))

    def qk(self, text: str, layer: int, head: int, query: int, key: int, *, top: int | None = None,
           table: bool | None = None, model: str | None = None) -> answers.QK:
        """POST /api/qk: one head's score at (query, key) split into query-side x key-side stream components."""
        body = _body(text=text, layer=layer, head=head, query=query, key=key, top=top, table=table)
        return answers.QK(self._post("/api/qk", self._with_model(body, model)))

    def lens(self, text: str, *, top: int | None = None, head_lens: tuple[int, int] | None = None,
             model: str | None = None) -> answers.Lens:
        """POST /api/lens: the logit lens (the stream after each block as next-token predictions) and, with
        head_lens (layer, head), that head's promoted and suppressed tokens."""
        body = _body(text=text, top=top, head_lens=None if head_lens is None else list(head_lens))
        return answers.Lens(self._post("/api/lens", self._with_model(body, model)))

    # ---- two texts -------------------------------------------------------------------------------------------------
    def patching(self, clean: str, corrupt: str, target: str, distractor: str | None = None, *,
                 site: str | None = None, per_position: bool | None = None, direction: str | None = None,
                 model: str | None = None) -> answers.Patching:
        """POST /api/patching: each (layer, head) of `site` patched between the texts; the metric and recovery."""
        body = _body(clean=clean, corrupt=corrupt, target=target, distractor=distractor, site=site,
                     per_position=per_position, direction=direction)
        return answers.Patching(self._post("/api/patching", self._with_model(body, model)))

    def path_patching(self, clean: str, corrupt: str, target: str, distractor: str | None = None, *,
                      senders: list[tuple[int, int]] | None = None, receivers: list[tuple[int, int]] | None = None,
                      receiver_input: str | None = None, model: str | None = None) -> answers.PathPatching:
        """POST /api/path_patching (Wang et al. 2023): senders' corrupt outputs along direct paths into receivers'
        query, key or value (or the logits), every other head frozen; senders None: each head alone, a map."""
        body = _body(clean=clean, corrupt=corrupt, target=target, distractor=distractor,
                     senders=None if senders is None else [list(p) for p in senders],
                     receivers=None if receivers is None else [list(p) for p in receivers],
                     receiver_input=receiver_input)
        return answers.PathPatching(self._post("/api/path_patching", self._with_model(body, model)))

    # ---- no text ---------------------------------------------------------------------------------------------------
    def circuits(self, *, model: str | None = None) -> answers.Circuits:
        """POST /api/circuits: each head's OV copying score and Q/K/V-composition between every pair of heads."""
        return answers.Circuits(self._post("/api/circuits", self._with_model({}, model)))

    # ---- in Jupyter ------------------------------------------------------------------------------------------------
    def show(self, *answers, view: str = "head", layer: int | None = None, head: int | None = None,
             pin: int | None = None, model: str | None = None, corrupt: str | None = None, target: str | None = None,
             distractor: str | None = None, site: str | None = None, direction: str | None = None,
             generate: int | dict | None = None):
        """The page's own view (head, lines, model, lens or effects) of answers, or of a text's (every layer and
        head; for the lens also its logit lens and the head lens of (layer, head); for the effects maps its direct
        logit attribution of target (- distractor) and, with corrupt, its patching at site), drawn inline and
        interactive in Jupyter, offline (app/jupyter.py): `m.show(m.attention(text), layer=2, head=5)`,
        `m.show(text, view="lens")`, `m.show(clean, view="effects", corrupt=..., target="␣Mary")`; `.save(path)`
        writes it as a page. generate: new tokens (greedy), or generate()'s options: the text's continuation, with
        every head's attention rows, grows the head and line views as the page's Generate control does."""
        from . import jupyter

        text = answers[0] if len(answers) == 1 and isinstance(answers[0], str) else None
        if text is not None:
            a = self.attention(text, model=model)
            answers = (a,)
            if view == "lens":
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
        from .pages import boot_block

        return boot_block(self.models(), default_model=self.model_id)

    def models(self) -> list[dict]:
        raise NotImplementedError

    # ---- generation ------------------------------------------------------------------------------------------------
    def generate(self, text: str, *, model: str | None = None, **options) -> answers.Generation:
        """POST /api/generate: an iterator of the new tokens (each the stream's token line), as they are made;
        `.done` holds the last line once it has ended. Options as the API takes them (max_new_tokens, greedy,
        temperature, top_k, top_p, seed, stop, chat, interventions, attention)."""
        return answers.Generation(self._lines("/api/generate", self._with_model({"text": text, **options}, model)))

    def _lines(self, path: str, body: dict) -> Iterator[dict]:
        raise NotImplementedError

    # ---- corpus jobs -----------------------------------------------------------------------------------------------
    def atlas(self, *, corpus: str | dict = "bundled", model: str | None = None, **options) -> answers.AtlasJob:
        """POST /api/jobs: start (or find, or resume) a head atlas over a corpus ("bundled", or an upload
        {"format": "jsonl" | "txt" | ..., "data": ...} as the API takes it); options as AtlasOptions (texts, ...).
        The answer is the job: .progress(), .cancel(), .wait(), .result()."""
        body = {"kind": "atlas", "corpus": corpus, "options": options}
        return answers.AtlasJob(self, self._job_post(self._with_model(body, model)))

    def job(self, job_id: str) -> answers.AtlasJob:
        """A job by its id (GET /api/jobs/{id})."""
        return answers.AtlasJob(self, self._job_get(job_id))

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

    def _job_result(self, job_id: str) -> dict:
        raise NotImplementedError

    def _wait(self, job_id: str, timeout: float, every: float = 0.2) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self._job_get(job_id)
            if job["state"] not in ("queued", "running", "cancelling") or time.monotonic() > deadline:
                return job
            time.sleep(every)
