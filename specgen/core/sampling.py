"""The target distribution p, and the one rule that chooses a token from it.

Plain and speculative decoding share the Sampler, so "the same text under the same seed for every
method" reduces to "every emitted token is the Sampler's choice from the same row at the same
position" (see verify.py and race.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from specgen.core import race
from specgen.errors import ConfigError
from specgen.core.penalties import Penalties


@dataclass(frozen=True)
class SamplingParams:
    """One generation's sampling, by the names every edge reads (app/ask.BOUNDS, the flags, the
    config keys, the server's fields), in that table's order; `penalties` is derived from them."""

    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int = 0  # 0 = whole vocabulary
    top_p: float = 1.0
    seed: int | None = None
    # llama.cpp's min-p: keeps the tokens whose probability (before temperature) is at least
    # min_p times the most likely one's, applied after top-p as llama.cpp's chain applies it.
    min_p: float = 0.0
    # llama.cpp's penalties over the last repeat_last_n tokens (-1: the whole context, 0: off),
    # and logit_bias as (token, added logit) pairs, -inf banning: applied to each row first (penalties.py).
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    # llama.cpp's chain order, where a request gives one (llama-server's `samplers`,
    # app/samplers.py): "top_k", "top_p", "min_p", "temperature" applied in this order, each
    # truncation over what the steps before it kept, at the temperature applied so far (1 before
    # "temperature"). None: specgen's own chain (truncated's docstring).
    order: tuple[str, ...] | None = None

    @property
    def penalties(self) -> Penalties:
        return Penalties(self.repeat_penalty, self.repeat_last_n, self.frequency_penalty, self.presence_penalty,
                         self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def truncated(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """(ids, probabilities) of p's support: softmax(logits / T) restricted to the top-k, then to
    the smallest top-p nucleus, then to the tokens min-p keeps. ids None: the whole vocabulary, in
    id order. With an order (params.order): its steps in turn (_chain), then softmax(logits / T)."""
    if params.order is not None:
        keep = _chain(logits, params)
        return keep, _tempered(logits if keep is None else logits[keep], params.temperature)
    row, keep = logits, None
    if 0 < params.top_k < logits.shape[0]:
        keep = top_k_ids(logits, params.top_k)  # T > 0 keeps the order
        logits = logits[keep]
    z = _tempered(logits, params.temperature)
    if params.top_p < 1.0:
        sel = _nucleus(z, params.top_p)
        keep, z = (sel if keep is None else keep[sel]), z[sel] / z[sel].sum()
    if params.min_p > 0.0:
        keep, z = _min_p(row, keep, z, params.min_p)
    return keep, z


def _tempered(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / T) in float64 (T floored at 1e-8: near-greedy rows stay finite)."""
    x = logits.astype(np.float64) / max(temperature, 1e-8)
    z = np.exp(x - x.max())
    return z / z.sum()


def _nucleus(z: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest set of most likely indices whose mass reaches top_p (always at least one); the
    tolerance keeps rounding in the cumulative sum (0.5 + 0.3 -> 0.7999...) from adding a token."""
    order = _nucleus_order(z, top_p)
    cum = np.cumsum(z[order])
    return order[:int(np.searchsorted(cum, top_p - 1e-9, side="left")) + 1]


def _chain(logits: np.ndarray, params: SamplingParams) -> np.ndarray | None:
    """The ids llama.cpp's chain in params.order keeps (None: every id): top_k the k largest,
    top_p the nucleus of the softmax, min_p those within ln(min_p) of the largest, each over what
    the steps before it kept and on the logits divided by the temperature where "temperature" came
    before it. The same rule for plain decoding and verification (eligible, truncated)."""
    keep, values, temperature = None, logits, 1.0
    for step in params.order or ():
        if step == "temperature":
            temperature = params.temperature
            continue
        if step == "top_k" and 0 < params.top_k < values.shape[0]:
            sel = top_k_ids(values, params.top_k)
        elif step == "top_p" and params.top_p < 1.0:
            sel = _nucleus(_tempered(values, temperature), params.top_p)
        elif step == "min_p" and params.min_p > 0.0:
            x = values.astype(np.float64) / max(temperature, 1e-8)
            sel = np.flatnonzero(x >= x.max() + np.log(params.min_p))
        else:
            continue
        keep, values = (sel if keep is None else keep[sel]), values[sel]
    return keep


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest logits (ties at the k-th: by argpartition's rule). The k-th largest
    block maximum bounds the k-th largest logit from below, so the partition runs over the few ids
    at or above it instead of a 262k vocabulary (1.5 ms down to about 0.1)."""
    n_blocks = logits.shape[0] // 1024
    if n_blocks >= 4 * k:
        maxima = logits[:n_blocks * 1024].reshape(n_blocks, 1024).max(axis=1)
        floor = np.partition(maxima, n_blocks - k)[n_blocks - k]
        ids = np.flatnonzero(logits >= floor)
        return ids[np.argpartition(-logits[ids], k - 1)[:k]]
    return np.argpartition(-logits, k - 1)[:k]


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


def eligible(logits: np.ndarray, params: SamplingParams) -> np.ndarray | None:
    """The ids a sampled token is raced over: the top-k, then the top-p nucleus, then min-p's
    (truncated's support); None: every id (no truncation, the race skips -inf itself)."""
    if params.order is not None:
        return _chain(logits, params)
    if params.top_k <= 0 and params.top_p >= 1.0:
        if params.min_p <= 0.0:
            return None
        floor = np.float64(logits.max()) + np.log(params.min_p)  # _min_p's test, without a softmax
        return np.flatnonzero(logits.astype(np.float64) >= floor)
    keep, _ = truncated(logits, params)
    return keep


def fresh_seed() -> int:
    """A seed for a run that named none, reported so that its text can be replayed."""
    return int.from_bytes(os.urandom(4), "little")


class Sampler:
    """Chooses tokens the one way every method shares: greedy is argmax (lowest id wins ties);
    sampling is the race of core/race.py at the token's absolute position, keyed by the seed."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.seed = fresh_seed() if params.seed is None else int(params.seed)

    def sample(self, logits: np.ndarray, position: int) -> int:
        """The token at `position` (its index in the text) chosen from the row before it."""
        if self.params.greedy:
            y = int(np.argmax(logits))
            if logits[y] != -np.inf:
                return y
        else:
            y = race.winner(logits, self.params.temperature, self.seed, position, eligible(logits, self.params))
        if y < 0 or logits[y] == -np.inf:
            raise NoToken(f"no token can be chosen at position {position}: every logit is -inf "
                          "(a logit_bias that bans every token?)")
        return y

    def ranking(self, logits: np.ndarray, position: int, k: int) -> list[int]:
        """The first k tokens of the choice at `position`: greedy's k most likely, or the race's
        first k finishers (a draft proposing what the target will sample, and its siblings)."""
        return self.finishers(logits, position, k)[0]

    def finishers(self, logits: np.ndarray, position: int, k: int) -> tuple[list[int], list[float]]:
        """ranking() with each token's score: its logit when greedy, logit + T g when sampling."""
        if self.params.greedy:
            ids = top_ids(logits, k)
            return ids, [float(logits[i]) for i in ids]
        return race.finishers(logits, self.params.temperature, self.seed, position, k, eligible(logits, self.params))


class NoToken(ConfigError):
    """Nothing is left to sample: every token is banned (by the request's logit_bias)."""


def top_ids(values: np.ndarray, k: int) -> list[int]:
    """Indices of the k largest values, largest first (a full sort of 262k costs ms)."""
    k = min(k, values.shape[0])
    if k <= 4:  # a few argmax passes beat argpartition over a large vocabulary
        picks: list[int] = []
        masked = values
        for _ in range(k):
            i = int(np.argmax(masked))
            picks.append(i)
            if len(picks) < k:
                masked = masked.copy() if masked is values else masked
                masked[i] = -np.inf
        return picks
    idx = np.argpartition(-values, k - 1)[:k]
    return [int(i) for i in idx[np.argsort(-values[idx], kind="stable")]]
