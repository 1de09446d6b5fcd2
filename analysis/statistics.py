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
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..model.masks import MASKED
from .keysets import induction_targets, is_punctuation, same_token_keys, sentences  # noqa: F401 (the registry's)


def _float(p) -> np.ndarray:
    """Float arrays keep their dtype (float32 attention stays float32: 512 tokens x 72 heads is 75 MB)."""
    p = np.asarray(p)
    return p if np.issubdtype(p.dtype, np.floating) else p.astype(np.float64)


# ---- what a text marks: the key sets some rows need (analysis/keysets.py) -----------------------------------
@dataclass(frozen=True)
class TextKeys:
    """What one text marks among its tokens, for the rows that need it (runtime.Encoding has the first three):
    punctuation [T] bool (None: not known, the row is NaN), the sentence pair's segments (None: one text) and the
    token ids (None: not known); and what the run gives besides the probabilities (the "run" statistics): the
    local window in keys (local_window; 0: not known) and each key's value norm ||v_j W_O^h|| [..., T] for the heads
    p holds (the run's value_norms; None: not computed). A row whose input is not known is NaN."""
    punctuation: np.ndarray | None = None
    segments: list[int] | None = None
    token_ids: list[int] | None = None
    window: int = 0
    value_norms: np.ndarray | None = None

    @classmethod
    def of(cls, encoding, cfg=None, value_norms: np.ndarray | None = None) -> "TextKeys":
        """A runtime.Encoding's (or a LayerwiseResult's) key sets; given the model's config, its local_window; the
        keys' value norms where the run has them."""
        return cls(np.asarray(encoding.punctuation, bool), list(encoding.segments), list(encoding.ids),
                   local_window(cfg) if cfg is not None else 0, value_norms)

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

    def given(self, keys: TextKeys) -> bool:
        """Whether `keys` holds what this row reads besides p (else it is NaN)."""
        return True


@dataclass(frozen=True)
class Entropy(Row):
    def numpy(self, p, keys=NO_KEYS):
        return entropy(p)

    def reduce(self, r):
        return r.entropy()


@dataclass(frozen=True)
class MaxWeight(Row):
    def numpy(self, p, keys=NO_KEYS):      # the largest weight read where argmax (SIMD) finds it: p.max(-1) over rows
        return np.take_along_axis(p, p.argmax(axis=-1)[..., None], -1)[..., 0]   # of 128 took 3x as long; a NaN too

    def reduce(self, r):
        return r.max_weight()


@functools.lru_cache(maxsize=16)
def _distances(T: int, dtype: np.dtype, window: int = 0) -> np.ndarray:
    """[T, T] |i - j| (window > 0: whether |i - j| < window, 1 or 0) in dtype, as a read-only view of a 2T-1 band
    (row i is band[T-1-i : 2T-1-i], as Runtime.build_mask's mask): no [T, T] array is made for it, at any length;
    the last few lengths' kept (a few kB each)."""
    band = np.abs(np.arange(1 - T, T))
    return sliding_window_view((band < window if window else band).astype(dtype), T)[::-1]


@dataclass(frozen=True)
class Distance(Row):
    """sum_j p_ij |i - j|, in tokens."""
    def numpy(self, p, keys=NO_KEYS):
        return np.einsum("...qk,qk->...q", p, _distances(p.shape[-1], p.dtype))

    def reduce(self, r):
        return r.distance()


@dataclass(frozen=True)
class DistanceVariance(Row):
    """sum_j p_ij (|i - j| - d_i)^2 with d_i the row's mean distance: how spread the distances are, in tokens^2."""
    def numpy(self, p, keys=NO_KEYS):
        d = _distances(p.shape[-1], p.dtype)
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
class ValueWeighted(Column):
    """Value-weighted attention's weight on one key (Kobayashi et al. 2020, 'Attention is not only a weight'): the
    share of the row's sum_j p_ij ||v_j W_O^h|| that key writes, p_i,key n_key / sum_j p_ij n_j, with n the keys'
    value norms (TextKeys.value_norms). runtime/blocks.VIEWS' value_weighted rows, at one key."""
    def numpy(self, p, keys=NO_KEYS):
        n = keys.value_norms
        if n is None:
            return np.full(p.shape[:-1], np.nan, p.dtype)
        n = np.asarray(n, p.dtype)
        return p[..., :, self.key] * n[..., None, self.key] / np.einsum("...qk,...k->...q", p, n)

    def given(self, keys: TextKeys) -> bool:
        return keys.value_norms is not None

    def reduce(self, r):
        return r.value_weighted(self.key)


@dataclass(frozen=True)
class Local(Row):
    """sum_j p_ij over the keys fewer than w tokens away, |i - j| < w (w: TextKeys.window): under a causal mask the
    query's last w keys, its own included, the keys a local layer of window w sees (model/masks.sliding_window_mask)."""
    def numpy(self, p, keys=NO_KEYS):
        if not keys.window:
            return np.full(p.shape[:-1], np.nan, p.dtype)
        return np.einsum("...qk,qk->...q", p, _distances(p.shape[-1], p.dtype, keys.window))

    def given(self, keys: TextKeys) -> bool:
        return keys.window > 0

    def reduce(self, r):
        return r.local()


@dataclass(frozen=True)
class Diagonal(Row):
    """The weight on key i + offset, for the queries that have one: itself (0), the one before (-1), after (+1)."""
    offset: int = 0

    def queries(self, T: int) -> np.ndarray:
        i = np.arange(T)
        return i[(i + self.offset >= 0) & (i + self.offset < T)]

    def numpy(self, p, keys=NO_KEYS):     # a strided view of p: the queries() in order (fancy indexing took 13x as long)
        return np.diagonal(p, self.offset, axis1=-2, axis2=-1)

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
LOCAL_WINDOW = 64         # keys: local_mass's window in a model without local layers (a few sentences back: what
#                           previous-token, n-gram and syntax heads read; a text under 64 tokens is all within it)


def local_window(cfg) -> int:
    """local_mass's window for a model: its local layers' sliding window (Gemma 3: 512), else LOCAL_WINDOW."""
    return int(getattr(cfg, "sliding_window", 0) or LOCAL_WINDOW)

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
    "local": Local("sum_j p_ij over |i - j| < w: the weight within the local window of w keys"),
    "value_weighted_first": ValueWeighted("p_i0 n_0 / sum_j p_ij n_j, n_j = ||v_j W_O^h||: the value-weighted "
                                          "weight on the first key (Kobayashi et al. 2020)", key=0),
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
    and the token ids; "run": the API's summary, from the probabilities and what that run gives besides them (the
    model's local window, the keys' value norms: TextKeys), reported where the run has them."""
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
    # of one run: from the probabilities and what the run gives besides them (TextKeys.window, .value_norms)
    Statistic("local_mass", "local", "local-window mass", "Average weight on the keys within the local window, the "
              "query's own included: the model's sliding window where it has local layers (Gemma 3: 512 keys), "
              f"else the last {LOCAL_WINDOW} keys. 1 on a local layer itself; on a global layer, how much of its "
              "attention a local window would have kept (1: it reads nothing further back).", needs="run"),
    Statistic("value_weighted_first_token_mass", "value_weighted_first", "value-weighted first-token mass",
              "Average share of the first token in each row of value-weighted attention, alpha_i0 ||v_0 W_O|| / "
              "sum_j alpha_ij ||v_j W_O|| (Kobayashi et al. 2020): how much of what the head writes comes from the "
              "first token, not how much it looks there. Beside first-token mass it tells an idle sink from a "
              "working one: a head that parks 0.9 of its weight on a first token whose value is near zero scores "
              "near 0 here, and costs the residual stream little.", needs="run"),
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
RUN_STATS = tuple(n for n, s in STATISTICS.items() if s.needs == "run")              # the API's summary, where known
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
    log_p = np.maximum(p, np.finfo(p.dtype).tiny)      # 0 log 0 = 0 exactly: 0 * log(tiny) is 0, and a weight under
    np.log(log_p, out=log_p)                            # tiny (1e-38) adds under 1e-36 (a masked log, where=p > 0,
    return -np.einsum("...k,...k->...", p, log_p)       # took 1.6x as long); one pass, no p*log_p temporary


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


def summary_rows(keys: TextKeys) -> set[str]:
    """The rows the API's summary of a text reads: HEAD_STATS', a pair's PAIR_STATS', and RUN_STATS' whose inputs
    the run gives (Row.given)."""
    return {s.row for s in STATISTICS.values() if s.needs == "probabilities" or (s.needs == "pair" and keys.pair)
            or (s.needs == "run" and ROWS[s.row].given(keys))}


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
