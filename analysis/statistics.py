"""The statistics registry: every per-head number attnscope reports about where a head looks, each defined once.

A head's attention probabilities p [T, T] (query i, key j; each row sums to 1) give one number per query, a ROW:
the weight on one key (the first, the last, itself, the one before, the one after), on a set of keys the text
marks (punctuation, the other sentence of a pair, earlier copies of the query's token), the row's entropy, its
largest weight, its mean distance to the keys. A per-head STATISTIC (and a head-finding SCORE) is the mean of one
row over the queries that count for it. Each row is written here once, in the two forms the code runs:

    NumPy      row.numpy(p, keys) -> [..., T']         the stacked path, the corpus job, the teaching checks, tests
    in-graph   row.reduce(r)      -> an ONNX output    the layer-by-layer run (graphs/reductions.py implements `r`)

and its corpus form is its sum over the queries that count and how many they are (corpus/sums.py). The API's
summary and scores, the layer-by-layer run's kept rows, the corpus job, the teaching roles (analysis/roles.py) and
the page's list of statistics all read the tables below; tests hold the two forms equal.
"""
from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

import numpy as np

from ..model.masks import MASKED


def _float(p) -> np.ndarray:
    """Float arrays keep their dtype (float32 attention stays float32: 512 tokens x 72 heads is 75 MB)."""
    p = np.asarray(p)
    return p if np.issubdtype(p.dtype, np.floating) else p.astype(np.float64)


# ---- what a text marks: the key sets some rows need ---------------------------------------------------------
@functools.lru_cache(maxsize=1 << 16)    # a vocabulary's pieces: every request asks about its tokens again
def is_punctuation(piece: str) -> bool:
    """A token whose characters (spaces aside) are all Unicode punctuation (categories P*)."""
    piece = piece.strip()
    return bool(piece) and all(unicodedata.category(c).startswith("P") for c in piece)


def sentences(segments) -> np.ndarray:
    """Sentence (0 = A, 1 = B) of each token from the tokenizer's segments (0, 1, -1 for an added special token):
    a special token belongs to the sentence before it, [CLS] to A. [T]"""
    out, current = [], 0
    for s in segments:
        current = s if s >= 0 else current
        out.append(current)
    return np.asarray(out, np.int64)


def same_token_keys(token_ids) -> np.ndarray:
    """[Tq, Tk] True where key j < i holds query i's own token."""
    ids = np.asarray(token_ids)
    return (ids[:, None] == ids[None, :]) & np.tri(len(ids), k=-1, dtype=bool)


def induction_targets(token_ids) -> np.ndarray:
    """[Tq, Tk] True at key j + 1 where an earlier key j < i - 1 holds query i's own token: the token that followed
    the earlier occurrence, the key an induction head reads ([A][B] ... [A] -> [B]). The occurrence just before i
    (j = i - 1) is left out: its follower is the query itself."""
    same = same_token_keys(token_ids)
    out = np.zeros_like(same)
    out[:, 1:] = same[:, :-1]
    return out & np.tri(len(same), k=-1, dtype=bool)


@dataclass(frozen=True)
class TextKeys:
    """What one text marks among its tokens, for the rows that need it (runtime.Encoding has all three):
    punctuation [T] bool (None: not known, the row is NaN), the sentence pair's segments (None: one text) and the
    token ids (None: not known)."""
    punctuation: np.ndarray | None = None
    segments: list[int] | None = None
    token_ids: list[int] | None = None

    @classmethod
    def of(cls, encoding) -> "TextKeys":
        """A runtime.Encoding's (or a LayerwiseResult's) key sets."""
        return cls(np.asarray(encoding.punctuation, bool), list(encoding.segments), list(encoding.ids))

    @property
    def pair(self) -> bool:
        return self.segments is not None and 1 in self.segments

    def mask(self, name: str, T: int) -> np.ndarray | None:
        """[T, T] bool: the keys of each query that the set `name` marks; None when the text does not say."""
        if name == "punctuation":
            return None if self.punctuation is None else np.broadcast_to(self.punctuation[None, :T], (T, T))
        if name == "other_sentence":
            if not self.pair:
                return None
            s = sentences(self.segments)
            return s[:, None] != s[None, :]
        if name == "same_token_before":
            return None if self.token_ids is None else same_token_keys(self.token_ids)
        if name == "induction_target":
            return None if self.token_ids is None else induction_targets(self.token_ids)
        raise KeyError(f"unknown key set {name!r}")


NO_KEYS = TextKeys()


# ---- rows: one number per query ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """A per-query number of a head's probabilities. numpy(p, keys) -> [..., n] for a float array p [..., T, T]
    (n = T but for Diagonal, whose first or last queries have no such key); counted(n, keys) -> [n] bool, which of
    those queries a mean counts; reduce(r) -> the same row inside an ONNX graph (r: graphs.reductions.Reductions).
    A row only a corpus reports may have no graph form (reduce None): GRAPH_ROWS are those that have one."""
    meaning: str
    reduce = None

    def counted(self, n: int, keys: TextKeys = NO_KEYS) -> np.ndarray:
        return np.ones(n, bool)


@dataclass(frozen=True)
class Entropy(Row):
    def numpy(self, p, keys=NO_KEYS):
        return entropy(p)

    def reduce(self, r):
        return r.entropy()


@dataclass(frozen=True)
class MaxWeight(Row):
    def numpy(self, p, keys=NO_KEYS):
        return p.max(axis=-1)

    def reduce(self, r):
        return r.max_weight()


@dataclass(frozen=True)
class Distance(Row):
    """sum_j p_ij |i - j|, in tokens."""
    def numpy(self, p, keys=NO_KEYS):
        idx = np.arange(p.shape[-1])
        return np.einsum("...qk,qk->...q", p, np.abs(idx[:, None] - idx[None, :]).astype(p.dtype))

    def reduce(self, r):
        return r.distance()


@dataclass(frozen=True)
class DistanceVariance(Row):
    """sum_j p_ij (|i - j| - d_i)^2 with d_i the row's mean distance: how spread the distances are, in tokens^2."""
    def numpy(self, p, keys=NO_KEYS):
        idx = np.arange(p.shape[-1])
        d = np.abs(idx[:, None] - idx[None, :]).astype(p.dtype)
        mean = np.einsum("...qk,qk->...q", p, d)
        return np.einsum("...qk,...qk->...q", p, (d - mean[..., None]) ** 2)      # two passes: no cancellation


@dataclass(frozen=True)
class Column(Row):
    """The weight on one key for every query: the first (0) or the last (-1)."""
    key: int = 0

    def numpy(self, p, keys=NO_KEYS):
        return p[..., :, self.key]

    def reduce(self, r):
        return r.column(self.key)

    def targets(self, T: int) -> np.ndarray:
        out = np.zeros((T, T), bool)
        out[:, self.key] = True
        return out


@dataclass(frozen=True)
class Sink(Column):
    """The weight on the first key from every query but the first (which, under a causal mask, sees only itself)."""
    def counted(self, n: int, keys: TextKeys = NO_KEYS) -> np.ndarray:
        return np.arange(n) >= 1


@dataclass(frozen=True)
class Diagonal(Row):
    """The weight on key i + offset, for the queries that have one: itself (0), the one before (-1), after (+1)."""
    offset: int = 0

    def queries(self, T: int) -> np.ndarray:
        i = np.arange(T)
        return i[(i + self.offset >= 0) & (i + self.offset < T)]

    def numpy(self, p, keys=NO_KEYS):
        q = self.queries(p.shape[-1])
        return p[..., q, q + self.offset]

    def reduce(self, r):
        return r.diagonal(self.offset)

    def targets(self, T: int) -> np.ndarray:
        return np.eye(T, k=self.offset, dtype=bool)


@dataclass(frozen=True)
class Marked(Row):
    """The weight on the keys a text marks (TextKeys.mask(keyset)), together, for every query; `only_marked`: a mean
    counts only the queries that have at least one such key."""
    keyset: str = ""
    only_marked: bool = False

    def numpy(self, p, keys=NO_KEYS):
        T = p.shape[-1]
        marked = keys.mask(self.keyset, T)
        if marked is None:
            return np.full(p.shape[:-1], np.nan, p.dtype)
        return np.einsum("...qk,qk->...q", p, marked.astype(p.dtype))

    def counted(self, n: int, keys: TextKeys = NO_KEYS) -> np.ndarray:
        marked = keys.mask(self.keyset, n)
        return marked.any(axis=-1) if self.only_marked and marked is not None else np.ones(n, bool)

    def reduce(self, r):
        return r.marked(self.keyset)


@dataclass(frozen=True)
class Induction(Marked):
    """The weight on the query's induction targets (TextKeys.mask("induction_target")), a target counting only where
    its own weight is at least `floor`, for the queries that have a target (only_marked)."""
    floor: float = 0.0
    reduce = None           # the floor has no graph form: a corpus's row only (computed in NumPy)

    def numpy(self, p, keys=NO_KEYS):
        marked = keys.mask(self.keyset, p.shape[-1])
        if marked is None:
            return np.full(p.shape[:-1], np.nan, p.dtype)
        return np.where(marked & (p >= self.floor), p, 0).sum(-1)


INDUCTION_FLOOR = 0.01    # a target's weight below this counts as 0 (natural-text induction; docs/atlas.md)

ROWS: dict[str, Row] = {
    "entropy": Entropy("-sum_j p_ij log p_ij, in nats"),
    "max_weight": MaxWeight("the largest weight of the row"),
    "first": Column("p_i0: the weight on the first key", key=0),
    "last": Column("p_i,T-1: the weight on the last key", key=-1),
    "diagonal": Diagonal("p_ii: the weight on itself", offset=0),
    "previous": Diagonal("p_i,i-1: the weight on the key before, queries i >= 1", offset=-1),
    "next": Diagonal("p_i,i+1: the weight on the key after, queries i < T-1", offset=1),
    "distance": Distance("sum_j p_ij |i - j|: the mean distance to the keys, in tokens"),
    "distance_variance": DistanceVariance("sum_j p_ij (|i - j| - d_i)^2: the variance of the distance to the keys"),
    "sink": Sink("p_i0 for queries i >= 1: the weight on the first key", key=0),
    "induction": Induction("the weight on key j+1 for each earlier j < i-1 holding query i's token (each such "
                           f"weight counted where >= {INDUCTION_FLOOR}), queries that have one",
                           keyset="induction_target", only_marked=True, floor=INDUCTION_FLOOR),
    "punctuation": Marked("the weight on punctuation keys", keyset="punctuation"),
    "cross_sentence": Marked("the weight on the other sentence's keys (a sentence pair)", keyset="other_sentence"),
    "duplicate": Marked("the weight on earlier keys holding the query's own token, queries that have one",
                        keyset="same_token_before", only_marked=True),
}

GRAPH_ROWS = {name: row for name, row in ROWS.items() if row.reduce is not None}   # what an attend graph computes


# ---- per-head statistics and scores: means of rows --------------------------------------------------------
@dataclass(frozen=True)
class Statistic:
    """A per-head summary: the mean of ROWS[row] over the queries that count (corpus: over every text's). `needs`:
    what besides the probabilities it is computed from, so where it is reported: "probabilities" alone (everywhere),
    a sentence "pair" (the API's summary of a pair), or the "text" (which tokens are punctuation: the corpus job,
    which reads each text's tokens; the API's summary is a function of the probabilities and a pair's segments);
    "corpus": reported over a corpus only (the corpus job and the atlas), computed in NumPy from the probabilities
    and the token ids."""
    name: str
    row: str
    label: str
    meaning: str
    needs: str = "probabilities"

    @property
    def pair_only(self) -> bool:
        return self.needs == "pair"


STATISTICS: dict[str, Statistic] = {s.name: s for s in [
    Statistic("mean_entropy", "entropy", "mean entropy (nats)", "How spread out each row is, averaged over the "
              "queries: near 0 = every token looks at one key; high = attention spread over many keys."),
    Statistic("first_token_mass", "first", "first-token mass", "Average weight on the first token ([CLS] for BERT). "
              "Many heads park their attention there when they have nothing to do."),
    Statistic("last_token_mass", "last", "last-token mass", "Average weight on the last token ([SEP] for BERT): "
              "another common ‘no-op’ place to put attention."),
    Statistic("diagonal_mass", "diagonal", "diagonal mass", "Average weight a token puts on itself."),
    Statistic("previous_token_mass", "previous", "previous-token mass", "Average weight a token puts on the token "
              "just before it: high for ‘previous-token’ heads."),
    Statistic("next_token_mass", "next", "next-token mass", "Average weight a token puts on the token just after "
              "it: high for ‘next-token’ heads (an encoder sees both ways; 0 under a causal mask)."),
    Statistic("mean_distance", "distance", "mean distance (tokens)", "How far away the attended keys are, on "
              "average, in tokens: small = local heads, large = long-range heads."),
    Statistic("punctuation_mass", "punctuation", "punctuation mass", "Average weight a token puts on punctuation "
              "(tokens whose characters are all punctuation): high for heads that track clause boundaries. Over a "
              "corpus.", needs="text"),
    Statistic("cross_sentence_mass", "cross_sentence", "cross-sentence mass", "Sentence pairs only: average weight "
              "a token puts on the other sentence ([CLS] and the first [SEP] count as sentence A, the last [SEP] as "
              "B).", needs="pair"),
    # over a corpus (the corpus job and the atlas): HeadVis' distribution metrics besides those above
    Statistic("distance_variance", "distance_variance", "distance variance (tokens²)", "How spread the distances "
              "to the attended keys are, averaged over the queries: 0 = every key at the same distance. Over a "
              "corpus.", needs="corpus"),
    Statistic("sink_mass", "sink", "attention-sink mass", "Average weight on the first token from every query but "
              "the first: how much the head parks on the attention sink. Over a corpus.", needs="corpus"),
    Statistic("induction_mass", "induction", "natural-text induction", "For each query whose token occurred "
              "earlier (before the token just before it), the weight on the token that followed that occurrence "
              f"([A][B] ... [A] -> [B]), each target counted where its weight is at least {INDUCTION_FLOOR}; averaged "
              "over those queries. Over a corpus.", needs="corpus"),
]}
HEAD_STATS = tuple(n for n, s in STATISTICS.items() if s.needs == "probabilities")   # every summary
PAIR_STATS = tuple(n for n, s in STATISTICS.items() if s.needs == "pair")            # a sentence pair's too
TEXT_STATS = tuple(n for n, s in STATISTICS.items() if s.needs == "text")            # a corpus's too
CORPUS_STATS = tuple(n for n, s in STATISTICS.items() if s.needs == "corpus")        # a corpus's only
STAT_INFO = {n: (s.label, s.meaning) for n, s in STATISTICS.items()}


@dataclass(frozen=True)
class Score:
    """A head-finding score in [0, 1] (Elhage et al. 2021; Olsson et al. 2022; TransformerLens' head detectors):
    the mean of ROWS[row] over the queries that count from `from_query` on; row None: measured on a probe."""
    name: str
    row: str | None
    meaning: str
    from_query: int = 0


SCORES: dict[str, Score] = {s.name: s for s in [
    Score("previous_token", "previous", "weight on key i-1 from query i, mean over queries i >= 1"),
    Score("next_token", "next", "weight on key i+1 from query i, mean over queries i < T-1 (0 under a causal mask)"),
    Score("duplicate_token", "duplicate", "weight on earlier keys holding the same token as query i, mean over the "
          "queries whose token occurred earlier (on this text)"),
    Score("induction", None, "on a probe of N random tokens repeated twice (the API runs it): weight from query i "
          "in the second copy on key i-N+1, the token after the same token's first occurrence, mean over the second "
          "copy (TransformerLens' induction score)"),
    Score("first_token_sink", "first", "weight on key 0 from every query i >= 1 (query 0 has only itself under a "
          "causal mask)", from_query=1),
    Score("last_token", "last", "weight on the last key ([SEP] for BERT), mean over all queries"),
]}
SCORE_INFO = {n: s.meaning for n, s in SCORES.items()}


def catalogue() -> list[dict]:
    """The page's list of statistics and scores ("find: ... heads"), in the registry's order."""
    return ([{"id": n, "label": s.label, "help": s.meaning, "pair_only": s.pair_only, "score": False,
              "corpus_only": s.needs in ("text", "corpus")} for n, s in STATISTICS.items()]
            + [{"id": n, "label": f"find: {n.replace('_', '-')} heads", "help": f"Head-finding score: {s.meaning}.",
                "pair_only": False, "score": True, "corpus_only": False} for n, s in SCORES.items()])


# ---- NumPy: rows, then means ----------------------------------------------------------------------------------
def entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy of each row in nats, -sum p log p (0 log 0 = 0). [..., Tq]"""
    p = _float(p)
    log_p = np.zeros_like(p)
    np.log(p, out=log_p, where=p > 0)
    return -np.einsum("...k,...k->...", p, log_p)                         # one pass, no p*log_p temporary


def rows(p: np.ndarray, keys: TextKeys = NO_KEYS, names=None) -> dict[str, np.ndarray]:
    """ROWS (or those named) of probabilities p [..., T, T]; Marked rows whose key set the text does not give
    (punctuation without TextKeys) are NaN, the pair's rows only for a pair."""
    names = [n for n in ROWS if n != "cross_sentence" or keys.pair] if names is None else names
    p = _float(p)
    return {name: ROWS[name].numpy(p, keys) for name in names}


def head_rows(p: np.ndarray) -> dict[str, np.ndarray]:
    """The rows that p alone defines, besides entropy and max weight: first, last, diagonal, previous, next,
    distance (the layer-by-layer graphs compute exactly these, graphs/reductions.py)."""
    return rows(p, names=[s.row for s in STATISTICS.values() if s.needs == "probabilities" and s.row != "entropy"])


def mean(values: np.ndarray, counted: np.ndarray | None = None) -> np.ndarray:
    """Mean over the last axis of the queries that count; 0 where none does (previous/next of one token)."""
    if counted is not None and not counted.all():
        values = values[..., counted]
    return values.mean(axis=-1) if values.shape[-1] else np.zeros(values.shape[:-1], values.dtype)


def summarize(row_values: dict[str, np.ndarray], keys: TextKeys = NO_KEYS) -> dict[str, np.ndarray]:
    """The per-head STATISTICS whose rows are given."""
    out = {}
    for name, stat in STATISTICS.items():
        if stat.row in row_values:
            values = row_values[stat.row]
            out[name] = mean(values, ROWS[stat.row].counted(values.shape[-1], keys))
    return out


def head_stats(p: np.ndarray, row_entropy: np.ndarray | None = None, segments=None, punctuation=None,
               token_ids=None) -> dict[str, np.ndarray]:
    """Per head [...]: STATISTICS of probabilities p [..., T, T]: HEAD_STATS, and PAIR_STATS given a pair's
    `segments`, TEXT_STATS given `punctuation` ([T] bool: which keys are punctuation). Pass row_entropy if it is
    already computed."""
    keys = TextKeys(None if punctuation is None else np.asarray(punctuation, bool), segments, token_ids)
    needed = {s.row for s in STATISTICS.values() if s.needs == "probabilities" or (s.needs == "pair" and keys.pair)
              or (s.needs == "text" and keys.punctuation is not None)}
    values = rows(p, keys, [n for n in ROWS if n in needed and (n != "entropy" or row_entropy is None)])
    if row_entropy is not None:
        values["entropy"] = row_entropy
    return summarize(values, keys)


# ---- per-query rows the API shows as they are -----------------------------------------------------------------
def visible_keys(mask: np.ndarray) -> np.ndarray:
    """How many keys each query may see, from an additive mask [..., Tq, Tk]. [..., Tq]"""
    return (np.asarray(mask) > MASKED / 2).sum(axis=-1)


def normalize_entropy(h: np.ndarray, n_visible: np.ndarray) -> np.ndarray:
    """Row entropy / log(visible keys): 0 = all weight on one key, 1 = spread evenly; 0 when one key is visible.
    Clipped to [0, 1]: float32 rounding puts a uniform row's entropy a hair above log(n) (1.00000095)."""
    n = np.asarray(n_visible, np.float64)
    return np.clip(np.where(n > 1, h / np.log(np.maximum(n, 2)), 0.0), 0.0, 1.0).astype(h.dtype)


def normalized_entropy(p: np.ndarray, n_visible: np.ndarray) -> np.ndarray:
    """Entropy / log(visible keys): 0 = all weight on one key, 1 = spread evenly. 0 when one key is visible."""
    return normalize_entropy(entropy(p), n_visible)


def row_stats(p: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Per query row: entropy (nats), normalised entropy, max weight. Each [..., Tq]."""
    h = entropy(p)
    return {"entropy": h, "normalized_entropy": normalize_entropy(h, visible_keys(mask)),
            "max_weight": ROWS["max_weight"].numpy(_float(p))}
