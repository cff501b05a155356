"""Sampling as a race (core/race.py): the winner of argmax(logit + T g(seed, position, id)) is a draw
from softmax(logit / T) over the eligible tokens, the block shortcut finds the same winner as racing
every id, and the same (seed, position, row) always gives the same token.

Power: each goodness-of-fit test below draws N = 12,000 races (one per seed) and compares them with
p at ALPHA = 0.001 (chisquare.py); with 6-10 categories it fails a sampler whose probabilities are
off by 10% of a token's p of 0.1 or more (a shift of 0.01) with probability above 0.9 (non-central
chi-square, noncentrality N * sum (dp^2 / p) ~ 12 per such token pair).
"""

import numpy as np
import pytest

import chisquare
from specgen.core import race
from specgen.core.constraint import masked
from specgen.core.penalties import Penalties, Scoring
from specgen.core.sampling import NoToken, Sampler, SamplingParams, distribution

N = 12_000


def _races(logits, params, position=17, n=N):
    return np.bincount([Sampler(SamplingParams(**{**params.__dict__, "seed": seed})).sample(logits, position)
                        for seed in range(n)], minlength=logits.shape[0])


def _hot_row(n_vocab=5000, seed=5):
    """A large vocabulary with a few likely tokens spread over several noise blocks."""
    rng = np.random.default_rng(seed)
    logits = np.full(n_vocab, -12.0, dtype=np.float32) + rng.standard_normal(n_vocab).astype(np.float32)
    hot = rng.choice(n_vocab, 6, replace=False)
    logits[hot] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5]
    return logits


@pytest.mark.parametrize("params", [
    SamplingParams(0.9), SamplingParams(1.5), SamplingParams(0.9, top_k=4), SamplingParams(0.9, top_p=0.7),
    SamplingParams(0.9, min_p=0.1), SamplingParams(0.8, top_k=40, top_p=0.95, min_p=0.05),
], ids=["T0.9", "T1.5", "top_k", "top_p", "min_p", "llama-server"])
def test_race_winners_follow_p(params):
    logits = _hot_row()
    p = distribution(logits, params)
    ok, why = chisquare.one_sample(_races(logits, params), p)
    assert ok, f"{params}: {why}"


def test_race_under_a_bias_a_penalty_and_a_grammar_mask_follows_the_adjusted_p():
    logits = _hot_row()
    hot = np.argsort(-logits)[:6]
    pen = Penalties(repeat=1.3, presence=0.5, last_n=8, bias=((int(hot[0]), -np.inf), (int(hot[3]), 1.0)))
    row = Scoring(pen, [int(hot[1]), int(hot[2])]).rows(logits[None, :].copy())[0]
    allowed = np.zeros(logits.shape[0], dtype=bool)
    allowed[hot[1:]] = True
    allowed[:100] = True
    row = masked(row, allowed)
    params = SamplingParams(1.0)
    counts = _races(row, params)
    assert counts[hot[0]] == 0 and counts[~allowed].sum() == 0
    ok, why = chisquare.one_sample(counts, distribution(row, params))
    assert ok, why


def test_consecutive_positions_are_independent():
    """Same seed, positions t and t + 1: the pair is distributed as the product of p with itself."""
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    pairs = np.zeros((3, 3))
    for seed in range(N):
        s = Sampler(SamplingParams(1.0, seed=seed))
        pairs[s.sample(logits, 40), s.sample(logits, 41)] += 1
    p = np.exp(logits)
    ok, why = chisquare.one_sample(pairs.ravel(), np.outer(p, p).ravel())
    assert ok, why


@pytest.mark.parametrize("n_vocab", [7, 1024, 3000, 262_144])
@pytest.mark.parametrize("temperature", [1e-30, 0.3, 1.0, 40.0])
def test_the_block_shortcut_finds_the_winner_of_every_id(n_vocab, temperature):
    rng = np.random.default_rng(n_vocab)
    for seed in range(6):
        logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
        logits[rng.integers(0, n_vocab, n_vocab // 10)] = -np.inf
        logits[rng.integers(0, n_vocab, 3)] = logits.max()  # ties at the top
        g = race.noise(seed, 9, np.arange(n_vocab))
        want = int(np.argmax(race.race_scores(logits, temperature, g)))
        assert race.winner(logits, temperature, seed, 9) == want


def test_an_ids_noise_does_not_depend_on_what_is_asked_with_it():
    ids = np.array([3, 1500, 70_000, 262_143])
    whole = race.noise(11, 5, np.arange(262_144))
    assert np.array_equal(race.noise(11, 5, ids), whole[ids])
    assert np.array_equal(race.noise(11, 5, ids[:2]), whole[ids[:2]])
    # standard Gumbel: F(g) = exp(-exp(-g)) is uniform on (0, 1)
    u = np.exp(-np.exp(-whole))
    ok, why = chisquare.one_sample(np.bincount((u * 20).astype(int), minlength=20), np.full(20, 0.05))
    assert ok, why


def test_same_seed_and_position_same_token_other_seeds_and_positions_differ():
    logits = np.zeros(50, dtype=np.float32)
    a, b = Sampler(SamplingParams(1.0, seed=7)), Sampler(SamplingParams(1.0, seed=7))
    first = [a.sample(logits, t) for t in range(40)]
    assert first == [b.sample(logits, t) for t in range(40)]
    assert first != [Sampler(SamplingParams(1.0, seed=8)).sample(logits, t) for t in range(40)]
    assert len(set(first)) > 20


def test_a_tiny_temperature_is_greedy_and_never_overflows():
    logits = _hot_row()
    for t in (3e-39, 1e-300, 5e-324):
        assert Sampler(SamplingParams(t, seed=1)).sample(logits, 3) == int(np.argmax(logits))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_token_banned_is_a_clear_error_greedy_too(temperature):
    """A logit_bias banning every token: one clear error, never token 0 (argmax of an all -inf row)."""
    with pytest.raises(NoToken, match="every logit is -inf"):
        Sampler(SamplingParams(temperature, seed=1)).sample(np.full(2000, -np.inf, dtype=np.float32), 3)


def test_ranking_puts_the_winner_first():
    logits = _hot_row()
    for seed in range(20):
        s = Sampler(SamplingParams(0.8, top_k=40, seed=seed))
        ranks = s.ranking(logits, 12, 3)
        assert ranks[0] == s.sample(logits, 12) and len(set(ranks)) == 3


def test_a_run_without_a_seed_draws_one_and_keeps_it():
    a, b = Sampler(SamplingParams(1.0)), Sampler(SamplingParams(1.0))
    assert 0 <= a.seed < 2**32 and a.seed != b.seed
    logits = _hot_row()
    replay = Sampler(SamplingParams(1.0, seed=a.seed))
    assert [a.sample(logits, t) for t in range(30)] == [replay.sample(logits, t) for t in range(30)]


def test_the_integer_mix_is_the_arrays_mix():
    """stream_key's splitmix64 in Python integers gives numpy's wrapping uint64 bits."""
    xs = np.random.default_rng(5).integers(0, 2**63, size=1000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    assert [race._mix_int(int(x)) for x in xs] == [int(v) for v in race._mix(xs)]
