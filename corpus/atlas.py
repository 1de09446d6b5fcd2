"""The atlas job: the corpus job (corpus/job.py) with each head's top examples kept (corpus/examples.py) and no
head-to-head JS matrix, as the server's job queue runs it (no HTTP here: app/jobs.py owns the queue).

    atlas = run_atlas(path, "smollm2", out, ExampleOptions(), on_progress=lambda done: ...)

Progress comes through on_progress(texts done); `stop()` True stops the job between chunks (Cancelled), which keeps
the finished chunks in OUT.partial.json: running the same job again resumes from there. A job whose last chunk is
done finishes whatever `stop` says. The export as Parquet is
one row per head (write_parquet; the schema is in docs/atlas.md).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from .errors import Cancelled, CorpusError
from .examples import ExampleOptions
from .job import replace_atomically, run_corpus, write_json
from .readers import Problem, read_corpus

ATLAS_VERSION = 1


def count_texts(path, fmt: str | None = None, column: str | None = None, max_chars: int | None = None,
                problems: int = 5) -> tuple[int, list[str]]:
    """The texts a corpus file holds (good records) and its first `problems` skipped records, read once.
    Raises CorpusError when the file cannot be used at all (a missing column, malformed CSV)."""
    good, bad = 0, []
    kwargs = {} if max_chars is None else {"max_chars": max_chars}
    for record in read_corpus(path, column, fmt, **kwargs):
        if isinstance(record, Problem):
            if len(bad) < problems:
                bad.append(str(record))
        else:
            good += 1
    return good, bad


def run_atlas(path, model_id: str, out, examples: ExampleOptions, *, fmt: str | None = None,
              column: str | None = None, sample: int | None = None, seed: int = 0, engine="local",
              workers: int | None = None, nice: int = 0, cache_dir=None, ray_address: str | None = None, runtime=None,
              on_progress: Callable[[int], None] | None = None, log: Callable[[str], None] | None = None,
              stop: Callable[[], bool] | None = None, pid_folder=None) -> dict:
    """Run the atlas of `model_id` over the corpus at `path` and write it to `out` (JSON). Returns it. runtime: an open
    Runtime of this model (the server's), to read its graph's path from rather than building the model again."""
    job = run_corpus(path, model_id, engine=engine, out=out, sample=sample, seed=seed, column=column, fmt=fmt,
                     workers=workers, js_rows=0, progress=False, log=log or (lambda msg: None),
                     cache_dir=cache_dir, ray_address=ray_address, examples=examples, on_progress=on_progress,
                     nice=nice, runtime=runtime, stop=stop, pid_folder=pid_folder)
    for name in ("js_divergence", "js_distance", "js_map", "js_rows"):
        job.pop(name, None)
    job["atlas_version"] = ATLAS_VERSION
    job["input"].pop("path", None)                    # a server path is nobody's business
    write_json(Path(out), job)
    return job


def write_parquet(atlas: dict, path) -> None:
    """One row per head: layer, head, one float64 column per statistic, and its examples as list<struct> columns
    `top` and `deciles` (each example: decile, score, number, start, whole, text, tokens, query, keys, weights; a
    decile's examples carry their decile). The job's other fields are JSON in the schema metadata "attnscope"."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    L, H = atlas["layers"], atlas["heads"]
    example = pa.struct([("decile", pa.int8()), ("score", pa.float64()), ("number", pa.int64()),
                         ("start", pa.int32()), ("whole", pa.bool_()), ("text", pa.string()),
                         ("tokens", pa.list_(pa.string())), ("query", pa.int32()), ("keys", pa.list_(pa.int32())),
                         ("weights", pa.list_(pa.float64()))])
    fields = [pa.field("layer", pa.int32()), pa.field("head", pa.int32())]
    fields += [pa.field(name, pa.float64()) for name in atlas["stats"]]
    fields += [pa.field("top", pa.list_(example)), pa.field("deciles", pa.list_(example))]
    names = [f.name for f in example]
    cols: dict[str, list] = {f.name: [] for f in fields}
    for layer in range(L):
        for head in range(H):
            cols["layer"].append(layer)
            cols["head"].append(head)
            for name, v in atlas["stats"].items():
                cols[name].append(float(v[layer][head]))
            ex = atlas["examples"][layer][head]
            cols["top"].append([{k: e[k] for k in names} for e in ex["top"]])
            cols["deciles"].append([{k: e[k] for k in names} for d in ex["deciles"] for e in d])
    meta = {k: v for k, v in atlas.items() if k not in ("stats", "examples")}
    table = pa.Table.from_pydict(cols, schema=pa.schema(fields, metadata={"attnscope": json.dumps(meta)}))
    replace_atomically(path, lambda tmp: pq.write_table(table, tmp))


__all__ = ["ATLAS_VERSION", "Cancelled", "CorpusError", "ExampleOptions", "count_texts", "run_atlas",
           "write_parquet"]
