"""Losslessness on real models: every method's greedy output equals plain greedy output.

On F32 targets llama.cpp's logits move with batch shape by a few thousandths (gemma 270M at 16 rows:
0.0015 median, 0.018 at most), so on these prompts equality is exact. On quantized targets some CPU kernels
round a row differently by batch shape (see test_backend.py; gemma Q4_K_M: about 0.1 from 4 rows
up), so a near-tie can flip; there divergences are counted, must be rare, and must sit on a near-tie of
plain decoding's own logits."""

import functools
import json

import numpy as np
import pytest

from specgen.app.config import RunConfig
from specgen.core.engine import TokenEvent
from specgen.app.prompts import Prompt
from specgen.core.kv import evaluate
from specgen.drafting.methods import NAMES
from specgen.app.runner import Runner
from specgen.app.session import load_session
from specgen.core.stats import RunStats

pytestmark = pytest.mark.real

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
    return load_session(RunConfig(target=target, draft=draft or target), NAMES)


def generate(target, draft, method, prompt, n=32):
    cfg = RunConfig(target=target, draft=draft, method=method, max_tokens=n, chat=False)
    runner = Runner(cfg, loaded(target, draft))
    stats = RunStats()
    tokens = [e.token for e in runner.stream(Prompt(0, prompt), stats) if isinstance(e, TokenEvent)]
    return tokens, stats, runner


@pytest.mark.parametrize("target,draft", [("smollm2-135m-instruct-f32", "smollm2-135m-instruct-q4_1"),
                                          ("gemma-3-270m-f32", "gemma-3-270m-q2_k"),
                                          ("gemma-3-270m-f32", "gemma-3-270m-f32-self")])
def test_every_method_equals_plain_on_f32_targets(target, draft):
    for prompt in PROMPTS:
        plain, _, _ = generate(target, draft, "plain", prompt)
        for method in METHODS:
            tokens, stats, _ = generate(target, draft, method, prompt)
            assert tokens == plain, f"{method} on {prompt!r}"
            assert stats.target_calls <= len(plain) + 1


def test_self_draft_accepts_every_drafted_token():
    target = "smollm2-135m-instruct-f32"
    tokens, stats, _ = generate(target, target, "chain", PROMPTS[0], n=40)
    assert stats.drafted > 20 and stats.accepted == stats.drafted


@pytest.mark.parametrize("target,draft", [("smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q4_1"),
                                          ("gemma-3-270m-q4_k_m", "gemma-3-270m-q2_k")])
def test_quantized_targets_diverge_only_rarely_and_on_near_ties(target, draft):
    divergent, compared = [], 0
    for prompt in PROMPTS:
        plain, _, runner = generate(target, draft, "plain", prompt)
        for method in METHODS:
            tokens, _, _ = generate(target, draft, method, prompt)
            if tokens != plain:
                i = next(k for k, (a, b) in enumerate(zip(tokens, plain)) if a != b)
                divergent.append((method, prompt, i, plain_margin(runner, prompt, plain[:i])))
                compared += i + 1  # after the first difference the texts are no longer comparable
            else:
                compared += len(plain)
    print(json.dumps({"target": target, "divergent": len(divergent), "tokens_compared": compared,
                      "cases": divergent}))
    # Rare: measured 6 in 272 tokens on smollm2 Q4_1 (a 135M model with many near-ties and the
    # largest batch-shape rounding, ~9e-2) and 2 in 454 on gemma Q4_K_M; at most 1 in 25 passes.
    assert len(divergent) <= compared / 25, divergent
    for method, prompt, i, margin in divergent:
        assert margin < 0.5, f"{method} diverged at token {i} of {prompt!r} with a logit gap of {margin:.3f}"


def plain_margin(runner, prompt, prefix):
    """Gap between plain decoding's two best logits where the outputs part: small = a near-tie."""
    model, ctx = runner.session.target, runner.session.target_ctx
    tokens = model.tokenize(prompt, add_special=True) + prefix
    ctx.clear()
    logits = evaluate(ctx, tokens)
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])
