"""Losslessness on real models: every method's greedy output equals plain greedy output, token for token.

specgen's llama.cpp build computes every decode of up to 128 rows batch-invariantly (a token's
logits are the same bits alone or inside a verification batch; test_kernels.py), so equality is
exact on quantized targets too, near-ties included. A llama.cpp built without specgen's patch
rounds batches differently, so the quantized check cannot pass there: inside `make test` (which
builds the patch) that absence fails it, elsewhere it is skipped (tests/invariance.py). With the
patch, any difference on a quantized target is a bug, not rounding."""

import functools

import pytest

import invariance
from harness import run_of
from invariance import needs_invariance
from specgen.app.config import RunConfig
from specgen.drafting.methods import NAMES
from specgen.app.session import load_session

pytestmark = pytest.mark.real
invariant_build = invariance.invariant_build  # the fixture needs_invariance names

PROMPTS = [
    "The three primary colours are",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "Translate to French: The cat sleeps on the warm windowsill.",
]
METHODS = ["lookup", "chain", "tree", "staged", "auto"]


@functools.lru_cache(maxsize=None)
def loaded(target, draft):
    """Models and contexts loaded once per pair; every method runs on them (plain included)."""
    return load_session(RunConfig(target=target, draft=draft or target).loading, NAMES)


def generate(target, draft, method, prompt, n=32, **sampling):
    run = run_of(method, prompt, target=target, draft=draft, n=n, on=loaded(target, draft), **sampling)
    return run.tokens, run.stats


@pytest.mark.parametrize("target,draft", [("smollm2-135m-instruct-f32", "smollm2-135m-instruct-q4_1"),
                                          ("gemma-3-270m-f32", "gemma-3-270m-q2_k"),
                                          ("gemma-3-270m-f32", "gemma-3-270m-f32-self")])
def test_every_method_equals_plain_on_f32_targets(target, draft):
    for prompt in PROMPTS:
        plain, _ = generate(target, draft, "plain", prompt)
        for method in METHODS:
            tokens, stats = generate(target, draft, method, prompt)
            assert tokens == plain, f"{method} on {prompt!r}"
            assert stats.target_calls <= len(plain) + 1


def test_self_draft_accepts_every_drafted_token():
    target = "smollm2-135m-instruct-f32"
    tokens, stats = generate(target, target, "chain", PROMPTS[0], n=40)
    assert stats.drafted > 20 and stats.accepted == stats.drafted


@needs_invariance
@pytest.mark.parametrize("target,draft", [("smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q4_1"),
                                          ("gemma-3-270m-q4_k_m", "gemma-3-270m-q2_k")])
def test_every_method_equals_plain_on_quantized_targets(target, draft):
    for prompt in PROMPTS:
        plain, _ = generate(target, draft, "plain", prompt)
        for method in METHODS:
            tokens, _ = generate(target, draft, method, prompt)
            assert tokens == plain, f"{method} on {prompt!r}: differs from plain on a batch-invariant build, a bug"


@needs_invariance
@pytest.mark.parametrize("target,draft", [("smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q4_1"),
                                          ("gemma-3-270m-q4_k_m", "gemma-3-270m-q2_k")])
def test_every_method_samples_plains_text_under_the_same_seed(target, draft):
    """The race (core/race.py): each token is decided by (seed, position, row), so every method,
    whatever its trees, writes plain sampling's text; at four temperatures, two seeds each."""
    texts = set()
    for i, (prompt, temperature) in enumerate(zip(PROMPTS, (0.3, 0.7, 1.0, 1.5))):
        for seed in (i, 1000 + i):
            sampling = dict(temperature=temperature, seed=seed)
            plain, _ = generate(target, draft, "plain", prompt, n=16, **sampling)
            texts.add(tuple(plain))
            for method in METHODS:
                tokens, _ = generate(target, draft, method, prompt, n=16, **sampling)
                assert tokens == plain, f"{method} on {prompt!r} at T={temperature}, seed {seed}"
    assert len(texts) >= 6  # the seeds sample different texts (at T = 0.3 two seeds may agree)
