"""Corpus statistics: per-head summaries averaged over thousands of texts, on a process pool or on Ray.

readers.py reads the texts (and reports the records it skips), engines.py runs them in chunks, sums.py adds up each
text's per-head sums (the statistics registry's corpus form), job.py is the whole job with its partial files."""
from .errors import CorpusError
from .job import run_corpus

__all__ = ["CorpusError", "run_corpus"]
