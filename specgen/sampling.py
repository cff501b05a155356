"""The target distribution p and seeded draws from it.

Plain and speculative decoding share these functions, so "sampled output distributed exactly as
plain sampling" reduces to "every emitted token is a draw from the same p" (see verify.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int = 0  # 0 = whole vocabulary
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """p: softmax(logits / T) restricted to the top-k, then to the smallest top-p nucleus.

    Returns a float64 vector over the whole vocabulary summing to 1 (zeros outside the support).
    """
    x = logits.astype(np.float64) / max(params.temperature, 1e-8)
    n = x.shape[0]
    if 0 < params.top_k < n:
        keep = np.argpartition(-x, params.top_k - 1)[:params.top_k]
    else:
        keep = np.arange(n)
    z = x[keep]
    z = np.exp(z - z.max())
    z /= z.sum()
    if params.top_p < 1.0:
        order = np.argsort(-z, kind="stable")
        cum = np.cumsum(z[order])
        # Smallest prefix whose mass reaches top_p (always at least one token); the tolerance keeps
        # rounding in the cumulative sum (0.5 + 0.3 -> 0.7999...) from adding a token.
        n_keep = int(np.searchsorted(cum, params.top_p - 1e-9, side="left")) + 1
        sel = order[:n_keep]
        keep, z = keep[sel], z[sel] / z[sel].sum()
    p = np.zeros(n, dtype=np.float64)
    p[keep] = z
    return p


class Sampler:
    """Draws tokens from p with a seeded generator; greedy is argmax (lowest id wins ties)."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(logits))
        return self.draw(distribution(logits, self.params))

    def draw(self, p: np.ndarray) -> int:
        return draw(p, self.rng)


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from p by inverse CDF: one uniform per token keeps seeded runs reproducible."""
    cum = np.cumsum(p)
    idx = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return min(idx, len(p) - 1)
