"""Penalties and logit_bias on real models: every method's greedy output equals plain greedy output
with the same penalties (the draft is not penalised, so its drafts often miss and each node is
verified on its own path), a penalty visibly changes a repetitive output, `auto` sampling with
penalties is distributed as plain sampling's (chi-square against the exact distribution), and logprobs
are the log-softmax of the target's own rows."""

import math
from collections import Counter

import numpy as np
import pytest

from chisquare import goodness_of_fit
from harness import SMOLLM2, SMOLLM2_F32, generated, penalized, run_of, session
from specgen.app.config import RunConfig

pytestmark = pytest.mark.real

TARGET, DRAFT = SMOLLM2_F32, SMOLLM2
REPETITIVE = "Repeat after me: the cat sat, the cat sat, the cat sat, the cat sat,"
RUNS = 160
# test_sampled_real.py's prompt (its first token spread over four choices) and top-k
COLOURS, TOP_K = "The three primary colors are", 4
PENALTIES = [dict(repeat_penalty=1.3), dict(frequency_penalty=0.8, presence_penalty=0.4, repeat_last_n=-1),
             dict(repeat_penalty=1.2, repeat_last_n=16, logit_bias="2644-inf,28+2")]


def generate(method, settings, prompt=REPETITIVE, n=32, logprobs=None, target=TARGET, draft=DRAFT):
    # harness.session: not screened, as a screened copy's rows are exact at their argmax only, and penalties move it
    return run_of(method, prompt, target=target, draft=draft, n=n, logprobs=logprobs, **settings).token_events


def text(events):
    return "".join(e.text for e in events)


@pytest.mark.parametrize("settings,methods", [(PENALTIES[0], ["lookup", "chain", "tree", "staged", "auto"]),
                                              (PENALTIES[1], ["tree", "auto"]), (PENALTIES[2], ["tree", "auto"])],
                         ids=["repeat", "frequency-presence", "bias"])
def test_every_method_equals_plain_with_penalties(settings, methods):
    plain = [e.token for e in generate("plain", settings)]
    assert plain != [e.token for e in generate("plain", {})]  # the settings act here
    for method in methods:
        assert [e.token for e in generate(method, settings)] == plain, method


def test_auto_equals_plain_with_penalties_on_gemma():
    """A 262k vocabulary, a base model, its own draft."""
    pair = dict(target="gemma-3-270m-f32", draft="gemma-3-270m-q2_k")
    settings = dict(repeat_penalty=1.3, frequency_penalty=0.3, logit_bias="236764+1.5")
    plain = [e.token for e in generate("plain", settings, **pair)]
    assert plain != [e.token for e in generate("plain", {}, **pair)]
    assert [e.token for e in generate("auto", settings, **pair)] == plain


def test_a_penalty_visibly_changes_a_repetitive_output():
    unpenalised = text(generate("auto", {}))
    penalised = text(generate("auto", dict(repeat_penalty=1.5, frequency_penalty=1.0)))
    assert unpenalised.count("the cat sat") >= 3, unpenalised  # the model goes on repeating
    assert penalised.count("the cat sat") <= 1, penalised


def test_logprobs_are_the_target_rows_log_softmax():
    """Through auto (drafted tokens included), each token's logprob and top list against the row
    a fresh context gives for the same text, adjusted with the same penalties."""
    from specgen.core.kv import evaluate
    from specgen.core.penalties import adjusted

    settings = dict(repeat_penalty=1.3, repeat_last_n=16, logit_bias="28+2")
    events = generate("auto", settings, n=16, logprobs=3)
    target = session(TARGET, DRAFT).target
    pen = RunConfig(**settings).sampling.penalties
    ctx = target.new_context(256)
    tokens = target.tokenize(REPETITIVE)
    assert any(e.from_draft for e in events)
    for e in events:
        ctx.clear()
        row = adjusted(evaluate(ctx, tokens), pen.window(tokens), pen).astype(np.float64)
        log_p = row - row.max() - math.log(np.exp(row - row.max()).sum())
        assert e.logprob.logprob == pytest.approx(log_p[e.token], abs=2e-3)
        assert [a.token for a in e.logprob.top] == list(np.argsort(-log_p, kind="stable")[:3])
        tokens.append(e.token)


def test_auto_sampling_with_penalties_is_distributed_as_plain(smollm2_f32, smollm2):
    """Penalties over the prompt and the first token, and a bias against the likeliest first token:
    auto's first two tokens against plain sampling's exact distribution of them (test_sampled_real)."""
    from specgen.core.kv import evaluate
    from specgen.core.penalties import Penalties, adjusted
    from specgen.core.sampling import SamplingParams, distribution
    from specgen.costs.curve import CostCurve
    from specgen.drafting.methods import METHODS, DrafterInputs

    target = smollm2_f32
    prompt = target.tokenize(COLOURS)
    ref_ctx = target.new_context(256)

    def p_after(tokens, params):
        ref_ctx.clear()
        pen = params.penalties
        return distribution(adjusted(evaluate(ref_ctx, tokens), pen.window(tokens), pen), params)

    plain_first = p_after(prompt, SamplingParams(1.0, top_k=TOP_K))
    pen = Penalties(repeat=1.8, last_n=64, presence=0.5, bias=((int(np.argmax(plain_first)), -1.0),))
    params = penalized(pen, 1.0, top_k=TOP_K)
    expected, first = Counter(), p_after(prompt, params)
    for x in map(int, np.flatnonzero(first)):
        if target.is_eog(x):
            expected[()] += first[x]
            continue
        after = p_after(prompt + [x], params)
        for y in map(int, np.flatnonzero(after)):
            expected[(x,) if target.is_eog(y) else (x, y)] += first[x] * after[y]
    assert not np.allclose(first, plain_first, atol=0.05)  # the penalties move the distribution

    ctx, dctx = target.new_context(256, n_seq_max=32), smollm2.new_context(256, n_seq_max=64)
    counts, accepted = Counter(), 0
    for seed in range(RUNS):  # fewer than test_sampled_real's: the bias and penalties spread p less
        p = penalized(pen, 1.0, top_k=TOP_K, seed=10_000 + seed)
        inputs = DrafterInputs(p, dctx, CostCurve([1, 32], [0.010, 0.012]), CostCurve([1, 8], [0.002, 0.003]),
                               reproducible=True)
        run = generated(target, ctx, prompt, 2, p, METHODS["auto"].drafter(inputs))
        counts[tuple(run.tokens)] += 1
        accepted += run.stats.accepted
    goodness_of_fit(counts, expected)
    assert accepted > RUNS // 4, accepted
