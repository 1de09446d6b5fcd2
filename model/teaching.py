"""Teaching models wired by hand: every wired head does exactly what its role says, on any text.

A head's role is one of ROLES; analysis/roles.py says which keys that means for each query and checks it. The
claim, for every model here: each wired head puts >= 0.99 of its weight on its target for every
query that has one (0.99 of the keys' total for same-token; for uniform, every weight within 1 %
of 1/(i+1)), on any text up to the model's max_tokens. It holds by construction; why, in short:

LayerNorm first. It divides each token's vector by that vector's spread, so a head whose matching
score is beaten by one token's bigger norm fails (the old tiny-gpt did: key norms 3.2 to 6.1). Here
every embedding is made of blocks that each sum to zero and have the same length for every token
and position, so the normalisation divides every token by the same number, and q . k is an exact
function of what the head reads. What the heads then read:
  positions   tiny-gpt: 8 sinusoid pairs (and their negatives, to sum to zero) whose frequencies
              were picked so that any two positions up to 513 apart differ: sum_f (1 - cos w_f d)
              >= KAPPA for 1 <= |d| <= 513. A query rotated back by s steps then scores key i - s
              highest by gain * KAPPA, set to 20 (softmax: <= 511 e^-20 ~ 1e-6 left elsewhere).
              induction: one-hot positions (minus their mean), so "this exact key" is a clean signal.
  tokens      a code per token id: 32 numbers +-1/sqrt(32), half of each sign, a different word of the
              Reed-Muller code RM(2,5) for each id. Any two words of it differ in >= 8 of 32 places, so
              two different ids' codes have dot <= 1 - 2 * 8/32 = 1/2 (MU); the same id's codes dot 1.
Layer 1's LayerNorm also sees what layer 0 wrote. tiny-gpt's layer-0 heads write quietly into
their own slots, which bounds how much a token's norm can change there (ratio <= 1.01), and the
gains are set for the worst case; the induction model's layer 0 writes a code of fixed length.
`_check` recomputes each worst-case gap from these bounds whenever a model is built.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np

from .transformer import Transformer, TransformerConfig

# ---- roles ---------------------------------------------------------------------------------
ROLES = ("previous-token", "first-token", "self", "two-back", "same-token", "induction", "uniform")
PREVIOUS_TOKEN, FIRST_TOKEN, SELF, TWO_BACK, SAME_TOKEN, INDUCTION, UNIFORM = ROLES
THRESHOLD = 0.99    # every wired head puts at least this much of its weight on its target (analysis/roles.py)
GAP = 20.0  # every wired head's target out-scores each other key by >= this (softmax: e^-20 ~ 2e-9 each)


# ---- shared pieces -------------------------------------------------------------------------
VOCAB = 1280        # the teaching models' own WordPiece vocabulary (sources/teaching.py builds it, this size)
CLS_ID = 2          # [CLS], which the tokenizer puts first: the beginning of every sequence
CODE = 32           # numbers per token code
MU = 0.5            # the dot of two different tokens' codes is at most this


def reed_muller() -> np.ndarray:
    """[65536, 32] bits: every word of RM(2,5), the polynomials of degree <= 2 in 5 bits, evaluated at all 32 points.

    A linear code whose nonzero words have weight >= 8, so any two words differ in >= 8 places.
    """
    x = (np.arange(CODE)[:, None] >> np.arange(5)) & 1                                   # [32, 5] the points
    monomials = [np.ones(CODE, np.int64)] + list(x.T) + [x[:, a] & x[:, b] for a, b in combinations(range(5), 2)]
    messages = (np.arange(2 ** len(monomials))[:, None] >> np.arange(len(monomials))) & 1  # [65536, 16]
    return messages @ np.array(monomials) % 2


def token_codes(seed: int) -> np.ndarray:
    """[VOCAB, 32] unit vectors summing to zero, one per token id, two different ones with dot <= MU.

    Each is a different weight-16 word of RM(2,5) (36518 exist), written as +-1/sqrt(32).
    """
    words = reed_muller()
    words = words[words.sum(axis=1) == CODE // 2]
    words = words[np.random.default_rng(seed).permutation(len(words))[:VOCAB]]
    return (1.0 - 2.0 * words) / np.sqrt(CODE)


def _zero_mlp(block) -> None:
    for lin in (block.mlp.fc, block.mlp.proj):
        lin.weight[:], lin.bias[:] = 0.0, 0.0


def _ln_scale(sq_norm: float, cfg: TransformerConfig) -> float:
    """LayerNorm's factor for a zero-mean vector of squared length sq_norm: LN(x) = x * this."""
    return 1.0 / np.sqrt(sq_norm / cfg.d_model + cfg.layer_norm_eps)


def _check(name: str, gap: float, at_least: float = GAP) -> None:
    if not gap >= at_least - 1e-6:
        raise AssertionError(f"{name}: worst-case score gap {gap:.3f} < {at_least}")


# ---- tiny-gpt: six textbook heads ------------------------------------------------------------
TINY_GPT = TransformerConfig(vocab_size=VOCAB, max_positions=512, d_model=128, n_heads=4, n_layers=4, d_ff=256,
                             norm_first=True, causal=True, final_norm=True)
TINY_GPT_ROLES = tuple({"layer": layer, "head": head, "role": role} for layer, head, role in [
    (0, 0, PREVIOUS_TOKEN), (0, 1, FIRST_TOKEN), (0, 2, SELF), (0, 3, UNIFORM), (1, 0, SAME_TOKEN), (1, 1, TWO_BACK)])
FREQS = np.array([0.12, 0.29, 0.61, 0.67, 0.81, 1.09, 1.55, 2.46])  # rad/token
KAPPA = 3.82        # min over 1 <= |d| <= 513 of sum_f (1 - cos(FREQS_f d)) (3.8249...)
# residual stream [128]: sinusoids [0, 16) and their negatives [16, 32); token code [32, 64);
# layer-0 outputs [64, 128), 16 numbers per head
POS, TOK, OUT = slice(0, 2 * len(FREQS)), slice(32, 64), slice(64, 128)
WRITE = 0.1         # layer-0 heads add 0.1 x what they read: layer 1's LayerNorm scale moves by <= 1 %


def _sinusoids(positions: np.ndarray) -> np.ndarray:
    """[T, 16]: cos, sin of each frequency, interleaved."""
    angles = positions[:, None] * FREQS[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1).reshape(len(positions), -1)


def _rotation(steps: int) -> np.ndarray:
    """[16, 16] block rotation taking position i's sinusoids to position i - steps'."""
    R = np.zeros((2 * len(FREQS),) * 2)
    for f, w in enumerate(FREQS):
        c, s = np.cos(w * steps), np.sin(w * steps)
        R[2 * f:2 * f + 2, 2 * f:2 * f + 2] = [[c, s], [-s, c]]  # [cos a, sin a] -> [cos(a - w), sin(a - w)]
    return R


def tiny_gpt(seed: int = 1234) -> Transformer:
    """Layer 0: previous-token, first-token, self and uniform heads; layer 1: same-token and two-back heads.

    Heads 1.2, 1.3 and layers 2-3 keep their seeded random weights: what untrained attention looks like.
    """
    cfg = TINY_GPT
    model = Transformer(cfg, seed=seed)
    D, dh, n = cfg.d_model, cfg.d_head, 2 * len(FREQS)
    a_pos, a_tok = 2.0, 8.0            # block lengths^2: 2 * 16 * 2^2 = 64 and 8^2 = 64, so every x has variance 1
    model.wpe[:] = 0.0
    model.wpe[:, POS] = a_pos * _sinusoids(np.arange(cfg.max_positions))
    model.wpe[:, n:2 * n] = -model.wpe[:, POS]
    model.wte[:] = 0.0
    model.wte[:, TOK] = a_tok * token_codes(seed)

    # worst-case LayerNorm scales: layer 0 sees |x|^2 = D exactly; layer 1 up to D + (what layer 0 wrote)^2
    s0 = _ln_scale(D, cfg)
    written = cfg.n_heads * (WRITE * s0 * a_tok) ** 2   # each head: <= 0.1 x 16 numbers of a unit code
    s_lo = _ln_scale(D + written, cfg)
    r = s0 / s_lo
    scale = 1.0 / np.sqrt(dh)
    # gains that give every target a GAP lead in the worst case (the same expressions are checked below)
    two_back_margin = KAPPA - (r - 1) * (len(FREQS) - KAPPA)   # keys' scales differ by <= r
    g_position = GAP / (scale * s0 ** 2 * a_pos ** 2 * KAPPA)
    g_first = GAP / (scale * s0 * a_pos * KAPPA)
    g_two_back = GAP / (scale * s_lo ** 2 * a_pos ** 2 * two_back_margin)
    g_same = GAP / (scale * s_lo ** 2 * a_tok ** 2 * (1 - r * MU))

    def wire(layer: int, head: int, Wq: np.ndarray, Wk: np.ndarray, bq: np.ndarray | None = None):
        p = model.blocks[layer].attn.params
        rows = slice(head * dh, (head + 1) * dh)
        p["in_proj_weight"][rows], p["in_proj_weight"][D:2 * D][rows] = Wq, Wk
        p["in_proj_bias"][rows] = 0.0 if bq is None else bq
        p["in_proj_bias"][D:2 * D][rows] = 0.0

    def positional(gain: float = 0.0, steps: int = 0):
        """q = gain * R_steps (position part), k = position part, in the head's first 16 dims."""
        Wq, Wk = np.zeros((dh, D)), np.zeros((dh, D))
        Wq[:n, POS], Wk[:n, POS] = gain * _rotation(steps), np.eye(n)
        return Wq, Wk

    wire(0, 0, *positional(g_position, 1))
    Wq, Wk = positional()
    wire(0, 1, Wq, Wk, bq=np.r_[g_first * _sinusoids(np.zeros(1))[0], np.zeros(dh - n)])  # a constant query: position 0
    wire(0, 2, *positional(g_position, 0))
    wire(0, 3, *positional(0.0))                                                           # a zero query: all scores 0
    Wq, Wk = np.zeros((dh, D)), np.zeros((dh, D))
    Wq[:, TOK], Wk[:, TOK] = g_same * np.eye(dh), np.eye(dh)                              # code . code
    wire(1, 0, Wq, Wk)
    wire(1, 1, *positional(g_two_back, 2))

    # layer 0 is attention only; each head adds 0.1 x the first 16 numbers of the code it attends to into its
    # own 16 slots of [64, 128), minus their mean (so x keeps summing to zero)
    block0 = model.blocks[0]
    _zero_mlp(block0)
    p = block0.attn.params
    p["in_proj_weight"][2 * D:], p["in_proj_bias"][2 * D:] = 0.0, 0.0
    p["out_proj.weight"][:], p["out_proj.bias"][:] = 0.0, 0.0
    centre = np.eye(16) - 1.0 / 16
    for head in range(cfg.n_heads):
        p["in_proj_weight"][2 * D + head * dh:2 * D + head * dh + 16, TOK.start:TOK.start + 16] = np.eye(16)
        p["out_proj.weight"][OUT.start + 16 * head:OUT.start + 16 * (head + 1), head * dh:head * dh + 16] = WRITE * centre

    _check("layer-1 LayerNorm ratio <= 1.01", 1.01 - r, 0.0)
    _check("previous-token / self", g_position * scale * s0 ** 2 * a_pos ** 2 * KAPPA)
    _check("first-token", g_first * scale * s0 * a_pos * KAPPA)
    _check("two-back", g_two_back * scale * s_lo ** 2 * a_pos ** 2 * two_back_margin)
    _check("same-token", g_same * scale * s_lo ** 2 * a_tok ** 2 * (1 - r * MU))
    return model


# ---- induction: previous-token head + induction head, by K-composition -----------------------
INDUCTION_CONFIG = TransformerConfig(vocab_size=VOCAB, max_positions=256, d_model=324, n_heads=1, n_layers=2, d_ff=4,
                                     norm_first=True, causal=True, final_norm=True, lm_head=True)  # tied: logits = ln_f(x) @ wte.T
INDUCTION_ROLES = ({"layer": 0, "head": 0, "role": PREVIOUS_TOKEN}, {"layer": 1, "head": 0, "role": INDUCTION})
INDUCTION_EXPLANATION = (
    "Two heads, one after the other. Layer 0's head is a previous-token head: each position looks one step "
    "back and copies that token's code into a free part of its own vector, so every position now says "
    "\"the token before me was X\". Layer 1's head is the induction head: its query asks \"which position "
    "says the token before it was the token I am now?\", and its keys answer with that copied part. So when "
    "the current token appeared before, the head looks at the position right after the earlier copy (the "
    "latest one, if there are several; at [CLS] when there is none). It copies that position's token into "
    "the output, which predicts it as the next token: after \"A B ... A\" the model says B. Neither head can "
    "do this alone: layer 1's keys read what layer 0 wrote (K-composition, Olsson et al. 2022).")
# residual stream [324]: this token's code [0, 34), the previous token's code [34, 68) (written by layer 0),
# one-hot position minus its mean [68, 324). A code is the RM(2,5) word in its first 32 numbers, except
# [CLS]'s, which is (1, -1)/sqrt 2 in the last two: orthogonal to every other token's.
ITOK, IPREV, IPOS = slice(0, 34), slice(34, 68), slice(68, 324)
RECENCY = 6.0        # score per position of lead for the later of two matching keys: sum_n e^-6n = 0.0025
COPY_GAIN = 16.0     # layer 1 writes 16 x the attended code into the token part, outvoting the current token


def induction_circuit(seed: int = 2022) -> Transformer:
    """Two layers, one head each, no MLPs: a previous-token head feeding an induction head; tied unembedding.

    Induction head score for query i, key k (after the 1/sqrt(d_head) scaling, up to a constant per row):
        MATCH * code(token i) . code(token k-1)     the key's previous token is my token
      + RECENCY * k                                 the latest such key wins
      - SELF * [k == i]                             never myself (my previous token may equal me)
      + SINK * [k == 0 and token i != [CLS]]        with no match, rest on [CLS]
    MATCH (1 - MU) exceeds RECENCY * 256 + margins, so a match beats every non-match at any distance.
    Assumes the sequence starts with [CLS], as the tokenizer makes it (key 0's "previous token" is itself).
    """
    cfg = INDUCTION_CONFIG
    model = Transformer(cfg, seed=seed)
    D, P, C = cfg.d_model, cfg.max_positions, ITOK.stop - ITOK.start
    a = np.sqrt(D / 2)                                  # code block and position block: |.|^2 = D/2 each
    a_pos = a / np.sqrt(1 - 1 / P)                      # |e_k - 1/P|^2 = 1 - 1/P
    codes = np.zeros((cfg.vocab_size, C))
    codes[:, :CODE] = token_codes(seed)
    codes[CLS_ID] = 0.0
    codes[CLS_ID, CODE:] = np.array([1.0, -1.0]) / np.sqrt(2)
    model.wte[:] = 0.0
    model.wte[:, ITOK] = a * codes
    model.wpe[:] = 0.0
    model.wpe[:, IPOS] = a_pos * (np.eye(P) - 1.0 / P)
    scale = 1.0 / np.sqrt(D)                            # d_head = d_model: one head
    s0 = _ln_scale(D, cfg)                              # layer 0 sees |x|^2 = D
    s1 = _ln_scale(1.5 * D, cfg)                        # layer 1: plus the copied code, |.|^2 = D/2

    # layer 0, previous-token head: q = g0 * (my one-hot position shifted back by one), k = g0 * one-hot position
    p = model.blocks[0].attn.params
    p["in_proj_weight"][:], p["in_proj_bias"][:] = 0.0, 0.0
    gap0 = 2 * GAP                                      # exact: e^-40 leaves the copied code unchanged in fp32
    shift = np.roll(np.eye(P), 1, axis=1)               # (shift @ x)[r] = x[r + 1 mod P]: e_i -> e_{i-1}
    g0 = np.sqrt(gap0 / (scale * s0 ** 2 * a_pos ** 2))  # split evenly between query and key
    p["in_proj_weight"][:D][IPOS, IPOS] = g0 * shift
    p["in_proj_weight"][D:2 * D][IPOS, IPOS] = g0 * np.eye(P)
    p["in_proj_weight"][2 * D:][IPREV, ITOK] = np.eye(C)  # value: the attended token's code, moved to IPREV
    p["out_proj.weight"][:] = np.eye(D) / s0               # undo LayerNorm's factor: the code is copied as it was
    p["out_proj.bias"][:] = 0.0

    # layer 1, induction head (the docstring's four terms); score constants after the 1/sqrt(d_head) scaling
    margin = GAP
    match = (RECENCY * (P - 2) + 3 * margin) / (1 - MU)
    sink = match + RECENCY - 1.5 * margin
    self_penalty = match + RECENCY * P
    p = model.blocks[1].attn.params
    p["in_proj_weight"][:], p["in_proj_bias"][:] = 0.0, 0.0
    Wq, Wk, bq = p["in_proj_weight"][:D], p["in_proj_weight"][D:2 * D], p["in_proj_bias"][:D]
    g = np.sqrt(match / (scale * s1 ** 2 * a ** 2))     # gains split evenly between query and key
    Wq[IPREV, ITOK], Wk[IPREV, IPREV] = g * np.eye(C), g * np.eye(C)
    g = np.sqrt(self_penalty / (scale * s1 ** 2 * a_pos ** 2))
    Wq[IPOS, IPOS], Wk[IPOS, IPOS] = -g * np.eye(P), g * np.eye(P)
    key_pos = scale * g * s1 * a_pos                    # a query bias b scores key k by key_pos * (b_k - mean b)
    bq[IPOS] = RECENCY / key_pos * np.arange(P)
    bq[IPOS.start] += sink / key_pos
    Wq[IPOS.start, ITOK] = -sink / key_pos / (s1 * a) * codes[CLS_ID]  # a [CLS] query: no sink bonus
    p["in_proj_weight"][2 * D:][ITOK, ITOK] = np.eye(C)    # value: the attended token's own code
    p["out_proj.weight"][:] = 0.0
    p["out_proj.weight"][ITOK, ITOK] = COPY_GAIN / s1 * np.eye(C)
    p["out_proj.bias"][:] = 0.0
    for block in model.blocks:
        _zero_mlp(block)

    # the worst cases, for a query i whose target is k* (1 <= k* <= i-1 <= P-2):
    leak = 1 / np.expm1(RECENCY) + P * np.exp(-GAP)     # earlier matching keys (geometric), everything else
    _check("weight on the target", (1 - leak) - THRESHOLD, 0.0)
    _check("myself, matching", self_penalty - RECENCY * (P - 2))
    _check("a non-matching key, up to P-2 later", match * (1 - MU) - RECENCY * (P - 2))
    _check("[CLS] sink vs a match", match + RECENCY - sink)
    _check("(no match) sink vs a non-match", sink - match * MU - RECENCY * (P - 1))
    _check("(no match) sink vs myself", sink - (match + RECENCY * (P - 1) - self_penalty))
    # readout: logit(t) ~ code(t) . (code(token i) + COPY_GAIN * attended code) >= by COPY_GAIN (0.98 - MU - 0.01) - 2
    _check("readout", COPY_GAIN * (0.98 - MU - 0.01) - 2, 2.0)
    return model


def next_token_logits(model: Transformer, hidden: np.ndarray) -> np.ndarray:
    """Logits [..., T, vocab] from final hidden states [..., T, D]: the tied unembedding, hidden @ wte^T.

    This is GPT-2's LM head with tie_embeddings: position i's logits predict token i+1.
    """
    return hidden @ model.wte.T
