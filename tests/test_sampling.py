import numpy as np
import pytest

import chisquare
from specgen.core.sampling import Sampler, SamplingParams, distribution, draw, inverse_cdf


def test_greedy_is_argmax_lowest_id_on_ties():
    logits = np.array([0.0, 3.0, 3.0, -1.0], dtype=np.float32)
    assert Sampler(SamplingParams()).sample(logits) == 1


def test_temperature_one_is_softmax():
    logits = np.array([1.0, 2.0, 3.0])
    p = distribution(logits, SamplingParams(temperature=1.0))
    want = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(p, want, rtol=1e-12)


def test_top_k_keeps_only_k_most_likely():
    logits = np.array([5.0, 1.0, 4.0, 3.0, 2.0])
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert set(np.nonzero(p)[0]) == {0, 2}
    assert p.sum() == pytest.approx(1.0)


def test_top_p_keeps_smallest_nucleus_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    p = distribution(np.log(probs), SamplingParams(temperature=1.0, top_p=0.8))
    assert set(np.nonzero(p)[0]) == {0, 1}
    np.testing.assert_allclose(p[[0, 1]], [0.5 / 0.8, 0.3 / 0.8])
    # The most likely token alone always survives.
    p1 = distribution(np.log(probs), SamplingParams(temperature=1.0, top_p=0.1))
    assert np.nonzero(p1)[0].tolist() == [0]


def test_same_seed_same_draws_and_different_seed_differs():
    logits = np.zeros(50)
    a = [Sampler(SamplingParams(1.0, seed=7)).sample(logits) for _ in range(1)]
    s1, s2, s3 = (Sampler(SamplingParams(1.0, seed=s)) for s in (7, 7, 8))
    d1 = [s1.sample(logits) for _ in range(40)]
    assert d1 == [s2.sample(logits) for _ in range(40)]
    assert d1 != [s3.sample(logits) for _ in range(40)]
    assert a[0] == d1[0]


def test_draws_follow_p_chi_square():
    p = np.array([0.4, 0.3, 0.2, 0.1, 0.0])
    rng = np.random.default_rng(0)
    n = 20000
    counts = np.bincount([draw(p, rng) for _ in range(n)], minlength=len(p))
    assert counts[4] == 0  # zero-probability tokens are never drawn
    ok, why = chisquare.one_sample(counts, p)
    assert ok, why


def test_blocked_inverse_cdf_equals_a_full_cumulative_sum():
    rng = np.random.default_rng(3)
    for n in (5, 512, 1300, 4096):
        w = rng.random(n) ** 8  # uneven, with near-zero weights
        w[rng.integers(0, n, n // 4)] = 0.0
        cum = np.cumsum(w)
        for u in rng.random(200):
            want = int(np.searchsorted(cum, u * cum[-1], side="right"))
            assert inverse_cdf(w, u) == want
            assert w[inverse_cdf(w, u)] > 0


def test_sampler_paths_follow_p_on_a_large_vocabulary():
    """The plain-softmax fast path (float32 weights) and the truncated path both draw from p."""
    rng = np.random.default_rng(5)
    logits = np.full(3000, -30.0, dtype=np.float32)
    hot = rng.choice(3000, 6, replace=False)
    logits[hot] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5]
    n = 20000
    for params in (SamplingParams(0.9, seed=1), SamplingParams(0.9, top_k=4, seed=1),
                   SamplingParams(0.9, top_p=0.7, seed=1)):
        p = distribution(logits, params)
        sampler = Sampler(params)
        counts = np.bincount([sampler.sample(logits) for _ in range(n)], minlength=3000)
        support = p > 1e-4
        assert counts[~support].sum() <= 2
        ok, why = chisquare.one_sample(counts, p)  # the tokens outside the support merge into one
        assert ok, f"{params}: {why}"


def test_nucleus_of_a_large_vocabulary_matches_a_full_sort_with_ties():
    rng = np.random.default_rng(9)
    logits = np.round(rng.standard_normal(5000) * 2, 1)  # many exact ties
    for top_p in (0.05, 0.3, 0.9):
        params = SamplingParams(1.0, top_p=top_p)
        z = np.exp(logits - logits.max())
        z /= z.sum()
        order = np.argsort(-z, kind="stable")
        n_keep = int(np.searchsorted(np.cumsum(z[order]), top_p - 1e-9, side="left")) + 1
        assert set(np.nonzero(distribution(logits, params))[0]) == set(order[:n_keep].tolist())
