import numpy as np
import pytest

from specgen.core.sampling import Sampler, SamplingParams, distribution


def test_greedy_is_argmax_lowest_id_on_ties():
    logits = np.array([0.0, 3.0, 3.0, -1.0], dtype=np.float32)
    assert Sampler(SamplingParams()).sample(logits, 5) == 1


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
