"""Chi-square tests for the sampling tests: the critical value comes from the degrees of freedom the
counts actually have, at a stated significance level (ALPHA).

two_sample compares two count vectors over the same tokens (plain sampling's and a speculative
method's): could they come from one distribution (Pearson's test of homogeneity)? one_sample
compares draws with a known p (goodness of fit). Tokens whose expected count is too small for the
chi-square approximation (below MIN_EXPECTED, in the smaller sample) are merged into one category
first; the degrees of freedom are the categories left, less one."""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy.stats import chi2

# The chance that a correct sampler fails one comparison. The tests are seeded, so a false alarm
# would show on every run; 0.001 keeps that unlikely across the few dozen comparisons in tests/.
ALPHA = 0.001
MIN_EXPECTED = 5.0


def critical_value(df: int, alpha: float = ALPHA) -> float:
    """The chi-square statistic that a correct sampler exceeds with probability `alpha`."""
    return float(chi2.ppf(1.0 - alpha, df))


def merged(columns: list[np.ndarray], expected: np.ndarray, min_expected: float = MIN_EXPECTED) -> list[np.ndarray]:
    """`columns` (count vectors over the same categories) with the categories whose `expected`
    count is below `min_expected` merged into one (itself merged with the next smallest while it
    is too small). Categories expected never to occur are dropped: they carry no freedom."""
    keep = expected > 0
    order = np.argsort(expected[keep], kind="stable")  # smallest expected count first
    expected = expected[keep][order]
    columns = [np.asarray(c, dtype=np.float64)[keep][order] for c in columns]
    small = 0
    while small < len(expected) and expected[small] < min_expected:  # each too small on its own
        small += 1
    while 0 < small < len(expected) and expected[:small].sum() < min_expected:  # and so together
        small += 1
    if small <= 1:
        return columns
    return [np.concatenate([[c[:small].sum()], c[small:]]) for c in columns]


def two_sample(a: np.ndarray, b: np.ndarray, alpha: float = ALPHA) -> tuple[bool, str]:
    """(passes, why) for count vectors `a` and `b` over the same categories (any sample sizes):
    Pearson's test that both come from one distribution, df = categories - 1."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n_a, n_b = a.sum(), b.sum()
    if n_a == 0 or n_b == 0:
        return False, f"an empty sample: {n_a:g} vs {n_b:g} draws"
    a, b = merged([a, b], (a + b) * min(n_a, n_b) / (n_a + n_b))  # the smaller sample's expected count
    df = len(a) - 1
    if df < 1:  # every draw in one category, in both samples: nothing tells them apart
        return True, "one category"
    stat = float((((a * np.sqrt(n_b / n_a) - b * np.sqrt(n_a / n_b)) ** 2) / (a + b)).sum())
    limit = critical_value(df, alpha)
    return stat < limit, f"chi2 {stat:.1f} with {df} df (critical {limit:.1f} at alpha {alpha:g}): {a} vs {b}"


def one_sample(counts: np.ndarray, p: np.ndarray, alpha: float = ALPHA) -> tuple[bool, str]:
    """(passes, why) for draws `counts` against the distribution `p` (goodness of fit, df =
    categories - 1). A draw of a category that p rules out fails outright."""
    counts, p = np.asarray(counts, dtype=np.float64), np.asarray(p, dtype=np.float64)
    if counts[p <= 0].sum() > 0:
        return False, f"{counts[p <= 0].sum():g} draws of categories p rules out"
    observed, expected = merged([counts, counts.sum() * p], counts.sum() * p)
    df = len(observed) - 1
    if df < 1:
        return True, "one category"
    stat = float(((observed - expected) ** 2 / expected).sum())
    limit = critical_value(df, alpha)
    return stat < limit, f"chi2 {stat:.1f} with {df} df (critical {limit:.1f} at alpha {alpha:g})"


def goodness_of_fit(counts: Counter, expected: Counter) -> None:
    """Counts of sampled sequences (tuples of one or two tokens) against their exact distribution
    `expected`, by the first token and by the first two (one_sample each); a sequence `expected`
    rules out fails outright."""
    keys = sorted(set(expected) | set(counts))
    p = np.array([expected[k] for k in keys])
    n = np.array([counts[k] for k in keys], dtype=np.float64)
    firsts = sorted({k[:1] for k in keys})
    by_first = np.array([[k[:1] == x for k in keys] for x in firsts], dtype=np.float64)
    ok, why = one_sample(by_first @ n, by_first @ p)
    assert ok, f"first token: {why}"
    ok, why = one_sample(n, p)
    assert ok, f"first two tokens: {why}"
