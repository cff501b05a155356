import numpy as np
import pytest

from specgen.sampling import Sampler, SamplingParams, distribution


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
    sampler = Sampler(SamplingParams(1.0, seed=0))
    n = 20000
    counts = np.bincount([sampler.draw(p) for _ in range(n)], minlength=len(p))
    assert counts[4] == 0  # zero-probability tokens are never drawn
    expected = p[:4] * n
    chi2 = (((counts[:4] - expected) ** 2) / expected).sum()
    assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001
