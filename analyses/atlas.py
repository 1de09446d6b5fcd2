"""Corpus jobs (POST|GET|DELETE /api/jobs, POST /api/jobs/{id}/cancel, app/jobs.py's queue): a head atlas, per-head
statistics and top examples over a corpus (corpus/). A job request is checked here into a JobPlan: its model (served,
and in the zoo: the workers build it by its id), its corpus on disk, counted (a malformed upload, an upload with no
text and a corpus over ATTNSCOPE_MAX_JOB_TEXTS are refused), and its id, a hash of what it computes. Jobs are
resources (created, followed, cancelled, deleted), not a request answered at once: their router and Python methods
are their own."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
from pydantic import ConfigDict, Field

from ..corpus import bundled
from ..corpus.atlas import CorpusError, ExampleOptions, count_texts
from ..corpus.examples import RANKABLE
from ..runtime import Runtime
from ..sources import get as zoo_model
from . import checks
from .answers import Answer, heads_map
from .base import Context, hash_of
from .errors import Refused, TooLarge
from .schemas import Strict, Text, _bounded


class CorpusUpload(Strict):
    """A corpus sent in the request: a file's content as a string, read like the CLI reads that format."""
    format: Literal["text", "jsonl", "csv", "tsv"] = Field("text", description="text: one text per line; jsonl: one "
                                                           "JSON object per line; csv/tsv: a header row, then rows")
    data: Text = Field(min_length=1, description="the file's content (UTF-8); the request body's limit is "
                       "ATTNSCOPE_MAX_UPLOAD_BYTES", examples=["The cat sat on the mat.\nThe dog sat on the rug.\n"])
    column: Text | None = Field(None, description="jsonl/csv/tsv: the field or column holding the text (default "
                                "`text`); a text upload has one text per line and no columns (ignored there)")


class AtlasOptions(Strict):
    texts: _bounded(1, 10_000_000) | None = Field(None, description="a uniform random sample of this many texts "
                                                  "(seeded); all when left out. At most ATTNSCOPE_MAX_JOB_TEXTS",
                                                  examples=[200])
    seed: _bounded(0, 2**31 - 1) = Field(0, description="the sample's seed")
    top: _bounded(1, 50) = Field(10, description="top examples kept per head")
    per_decile: _bounded(0, 10) = Field(2, description="examples kept per head in each tenth of the score's range")
    rank_by: Literal[RANKABLE] = Field("max_weight", description="what ranks a window for a head: max_weight, its "
                                       "largest weight off the attention sink (queries and keys after the first), or "
                                       "a statistic whose row is a weight (the text's mean of it)")
    window: _bounded(8, 512) = Field(64, description="an example keeps at most this many tokens around its query")


class JobRequest(Strict):
    kind: Literal["atlas"] = Field("atlas", description="atlas: per-head statistics and top examples over a corpus")
    model: Text = Field("minilm", description="a served model id from GET /api/models (a zoo model)",
                        examples=["tiny-gpt"])
    corpus: Literal["bundled"] | CorpusUpload = Field(
        "bundled", description="\"bundled\": the default corpus that ships with attnscope (sentences of the Python "
        "standard library's docstrings, PSF-2.0); or an upload")
    options: AtlasOptions = Field(default_factory=AtlasOptions)
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"kind": "atlas", "model": "tiny-gpt", "corpus": "bundled", "options": {"texts": 200}}]})


@dataclass(frozen=True)
class JobPlan:
    """A corpus job, checked: its id (a hash of what it computes), the corpus file it reads (the bundled corpus, or
    the upload stored under its content's hash) with its format and column, its name in the API, how many texts it
    reads, and the store's options. staged: an upload's temporary file, which becomes `path` when the job is queued
    (app/jobs.py Jobs.submit) and is removed otherwise."""
    id: str
    request: JobRequest
    runtime: Runtime
    path: object
    fmt: str
    column: str | None
    corpus: str
    texts: int
    examples: ExampleOptions
    staged: object = None


def plan(ctx: Context, req: JobRequest, stage: Callable[[str, str], tuple]) -> JobPlan:
    """The job's model (served and in the zoo: the workers build it by its id), its corpus on disk, counted
    (a malformed upload, an upload with no text and a corpus over ATTNSCOPE_MAX_JOB_TEXTS are refused here),
    and its id. stage(data, format) writes an upload to a temporary file: (that file, its name once queued);
    a refused upload's file is removed here."""
    st = ctx.settings
    rt = checks.runtime(ctx, req.model, "corpus jobs (/api/jobs)")
    try:
        zoo_model(rt.spec.id)
    except KeyError:
        raise Refused(f"model {req.model!r} is not a zoo model; corpus jobs run zoo models (their workers build "
                      f"the model by its id)") from None
    folder, staged = st.jobs_folder(), None
    if req.corpus == "bundled":
        path, fmt, column = bundled.bundled_path(folder / "corpora"), "text", None
        corpus = bundled.NAME
    else:
        up = req.corpus
        fmt, column = up.format, None if up.format == "text" else up.column   # a text file has no columns
        staged, path = stage(up.data, fmt)
        corpus = f"upload:{path.name[:16]}"
    try:
        return _counted(ctx, req, rt, path, staged, fmt, column, corpus)
    except BaseException:
        if staged is not None:
            staged.unlink(missing_ok=True)
        raise


def _counted(ctx: Context, req: JobRequest, rt: Runtime, path, staged, fmt: str, column: str | None,
             corpus: str) -> JobPlan:
    st = ctx.settings
    read = staged or path
    try:
        texts, problems = count_texts(read, fmt, column)
    except CorpusError as e:
        raise Refused("the corpus cannot be read: " + str(e).replace(str(read), "the upload").replace(
            "--column", "corpus.column")) from None
    if texts == 0:
        raise Refused("the corpus has no text to read" + (f": {'; '.join(problems)}" if problems else ""))
    o = req.options
    if o.texts is not None:
        texts = min(texts, o.texts)
    if texts > st.max_job_texts:
        raise TooLarge(f"the corpus has {texts:,} texts; a job reads at most {st.max_job_texts:,} "
                       f"(ATTNSCOPE_MAX_JOB_TEXTS): set options.texts to sample fewer")
    examples = ExampleOptions(o.top, o.per_decile, o.rank_by, o.window)
    key = {"kind": req.kind, "model": rt.spec.id, "graph": rt.key, "corpus": corpus, "fmt": fmt,
           "column": column, "python": path.name if corpus == bundled.NAME else None,
           "options": o.model_dump()}
    job_id = hash_of(key)[:16]
    return JobPlan(job_id, req, rt, path, fmt, column, corpus, texts, examples, staged)


class AtlasJob:
    """A corpus job (POST /api/jobs): `job` is its last known state (GET /api/jobs/{id})."""

    def __init__(self, api, job: dict):
        self.api, self.job = api, job

    @property
    def id(self) -> str:
        return self.job["id"]

    @property
    def state(self) -> str:
        return self.job["state"]

    def progress(self) -> dict:
        """The job now: its state and progress (texts done of the total, rate, time left)."""
        self.job = self.api._job_get(self.id)
        return self.job["progress"]

    def cancel(self) -> dict:
        """Stop it (POST /api/jobs/{id}/cancel): its finished chunks are kept; posting it again resumes it."""
        self.job = self.api._job_cancel(self.id)
        return self.job

    def delete(self) -> None:
        """Remove it, its results and its upload (DELETE /api/jobs/{id}); a running one stops first."""
        self.api._job_delete(self.id)

    def wait(self, timeout: float = 600) -> dict:
        """Until it is done (or failed, cancelled, interrupted), or timeout seconds: the job then."""
        self.job = self.api._wait(self.id, timeout)
        return self.job

    def result(self, timeout: float = 600) -> "Atlas":
        """The finished atlas (waits for it)."""
        self.wait(timeout)
        return Atlas(self.api._job_result(self.id))

    def __repr__(self) -> str:
        return f"<AtlasJob {self.id} {self.state}>"


class Atlas(Answer):
    """A finished head atlas (docs/atlas.md): each statistic [layer, head] over the corpus."""

    def coords(self):
        return {"layer": list(range(self.data["layers"])), "head": list(range(self.data["heads"]))}

    def arrays(self):
        return {name: (("layer", "head"), np.asarray(v, np.float64)) for name, v in self.data["stats"].items()
                if np.ndim(v) == 2}

    def figure(self, stat: str | None = None):
        stat = stat or next(iter(self.data["stats"]))
        return heads_map(f"{self.data['model']} · {stat} over {self.data.get('texts')} texts",
                          self.data["stats"][stat], stat)

    def summary(self) -> str:
        return f"{self.data['model']}: {self.data.get('texts')} texts, {len(self.data['stats'])} statistics"
