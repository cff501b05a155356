"""The target distribution p and seeded draws from it.

Plain and speculative decoding share these functions, so "sampled output distributed exactly as
plain sampling" reduces to "every emitted token is a draw from the same p" (see verify.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specgen.core.penalties import Penalties


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int = 0  # 0 = whole vocabulary
    top_p: float = 1.0
    seed: int | None = None
    # llama.cpp's min-p: keeps the tokens whose probability (before temperature) is at least
    # min_p times the most likely one's, applied after top-p as llama.cpp's chain applies it.
    min_p: float = 0.0
    # logit_bias and the repetition penalties, applied to each row first (penalties.py).
    penalties: Penalties = field(default_factory=Penalties)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def truncated(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """(ids, probabilities) of p's support: softmax(logits / T) restricted to the top-k, then to
    the smallest top-p nucleus, then to the tokens min-p keeps. ids None: the whole vocabulary, in
    id order."""
    row, keep = logits, None
    if 0 < params.top_k < logits.shape[0]:
        keep = np.argpartition(-logits, params.top_k - 1)[:params.top_k]  # T > 0 keeps the order
        logits = logits[keep]
    x = logits.astype(np.float64) / max(params.temperature, 1e-8)
    z = np.exp(x - x.max())
    z /= z.sum()
    if params.top_p < 1.0:
        order = _nucleus_order(z, params.top_p)
        cum = np.cumsum(z[order])
        # Smallest prefix whose mass reaches top_p (always at least one token); the tolerance keeps
        # rounding in the cumulative sum (0.5 + 0.3 -> 0.7999...) from adding a token.
        n_keep = int(np.searchsorted(cum, params.top_p - 1e-9, side="left")) + 1
        sel = order[:n_keep]
        keep, z = (sel if keep is None else keep[sel]), z[sel] / z[sel].sum()
    if params.min_p > 0.0:
        keep, z = _min_p(row, keep, z, params.min_p)
    return keep, z


def _min_p(row: np.ndarray, keep: np.ndarray | None, z: np.ndarray,
           min_p: float) -> tuple[np.ndarray | None, np.ndarray]:
    """(keep, z) restricted to the tokens with logit >= max logit + ln(min_p), i.e. untempered
    probability >= min_p * the largest (llama.cpp's test); the most likely token always stays."""
    floor = np.float64(row.max()) + np.log(min_p)
    values = row if keep is None else row[keep]
    ok = values.astype(np.float64) >= floor
    if ok.all():
        return keep, z
    sel = np.flatnonzero(ok)
    return (sel if keep is None else keep[sel]), z[sel] / z[sel].sum()


def _nucleus_order(z: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the most likely tokens, most likely first (ties: lower index first), enough of
    them to hold top_p of the mass: sorting a 262k vocabulary costs 25 ms, its top few hundred
    microseconds, so grow a partitioned candidate set until it holds the nucleus."""
    m = 64
    while m < z.shape[0]:
        idx = np.argpartition(-z, m - 1)[:m]
        if z[idx].sum() >= top_p:  # the nucleus lies inside, unless rounding says otherwise below
            order = idx[np.lexsort((idx, -z[idx]))]
            if np.cumsum(z[order])[-2] >= top_p - 1e-9:
                return order
        m *= 8
    return np.argsort(-z, kind="stable")


def softmax(logits: np.ndarray) -> np.ndarray:
    """exp(logits) normalised along the last axis, in float32 with float64 sums (a greedy draft's
    q, token counts: a 262k-token row in float64 would double the work)."""
    x = np.exp(logits - logits.max(axis=-1, keepdims=True), dtype=np.float32)
    x /= x.sum(axis=-1, keepdims=True, dtype=np.float64)
    return x


def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """p as a float64 vector over the whole vocabulary summing to 1 (zeros outside the support)."""
    keep, z = truncated(logits, params)
    if keep is None:
        return z
    p = np.zeros(logits.shape[0], dtype=np.float64)
    p[keep] = z
    return p


class Sampler:
    """Draws tokens from p with a seeded generator; greedy is argmax (lowest id wins ties)."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self._plain_softmax = 0 == params.top_k and params.top_p >= 1.0 and params.min_p <= 0.0

    def sample(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(logits))
        if self._plain_softmax:
            # The common case, without a normalised float64 vector over the vocabulary: the
            # weights exp((l - max) / T) and one blocked inverse-CDF draw (0.2 ms instead of 6 ms
            # for 262k tokens, a quarter of a gemma-270m decode). Same p, same one uniform per token.
            weights = np.exp((logits - logits.max()) * np.float32(1.0 / self.params.temperature))
            return inverse_cdf(weights, self.rng.random())
        keep, z = truncated(logits, self.params)
        i = inverse_cdf(z, self.rng.random())
        return i if keep is None else int(keep[i])


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from p (weights need not sum to 1): one uniform per token keeps seeded runs reproducible."""
    return inverse_cdf(p, rng.random())


BLOCK = 512


def inverse_cdf(weights: np.ndarray, u: float) -> int:
    """The token where the cumulative weight (in id order) first exceeds u * total.

    Two levels: float64 sums of 512-token blocks find the block, a cumulative sum inside it finds
    the token, so the work is one pass over the weights instead of a cumulative sum of them all.
    """
    n = weights.shape[0]
    full = n - n % BLOCK
    sums = weights[:full].reshape(-1, BLOCK).sum(axis=1, dtype=np.float64)
    if full < n:
        sums = np.append(sums, weights[full:].sum(dtype=np.float64))
    cum = np.cumsum(sums)
    target = u * cum[-1]
    b = min(int(np.searchsorted(cum, target, side="right")), len(cum) - 1)
    block = weights[b * BLOCK:(b + 1) * BLOCK]
    inner = np.cumsum(block, dtype=np.float64)
    i = int(np.searchsorted(inner, target - (cum[b - 1] if b else 0.0), side="right"))
    if i >= len(block):  # rounding between the two levels: the block's last possible token
        i = int(np.flatnonzero(block)[-1])
    return b * BLOCK + i
