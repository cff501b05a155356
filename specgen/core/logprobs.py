"""Log-probabilities of committed tokens, from the rows the sampler read (penalties.py): the
target's distribution after logit_bias and the penalties, before temperature and truncation (top-k,
top-p, min-p) and before a grammar's mask, so they say how likely the model found each token,
whatever the sampling settings. Computed only when a request asks for them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP = 20  # OpenAI's top_logprobs limit


@dataclass(frozen=True)
class Alternative:
    token: int
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's log-probability and the `top` most likely tokens at its position (most
    likely first; ties: lower id first)."""

    token: int
    logprob: float
    top: tuple[Alternative, ...] = ()


def token_logprob(row: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """log softmax(row) at `token`, and its n_top largest entries (tokens banned with -inf never)."""
    x = row.astype(np.float64)
    finite = np.isfinite(x)
    m = x[finite].max() if finite.any() else 0.0
    log_z = m + np.log(np.exp(x[finite] - m).sum()) if finite.any() else 0.0
    top: tuple[Alternative, ...] = ()
    if n_top > 0:
        k = min(n_top, int(finite.sum()))
        idx = np.argpartition(-x, k - 1)[:k] if 0 < k < x.shape[0] else np.arange(x.shape[0])[:k]
        idx = idx[np.lexsort((idx, -x[idx]))]
        top = tuple(Alternative(int(i), float(x[i] - log_z)) for i in idx)
    return TokenLogprob(int(token), float(x[token] - log_z), top)
