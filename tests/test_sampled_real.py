"""`auto` at T > 0 on real models: it drafts from q and verifies by rejection sampling, and what it
emits is distributed as plain sampling's output: with a draft model, with a vocabulary-subset
draft that cannot propose the target's second choice, and with lookup nodes beside the drawn
chain. tests/test_rejection.py shows each rule's test failing when the rule is broken; here the
whole stack (llama.cpp batches, the draft's KV, the planner).

Plain sampling draws from distribution(logits, params) (tests/test_sampling.py), so its output
over the first two tokens is known exactly from the target's logits (reference()); auto's counts
are tested against it (chi-square goodness of fit, tests/chisquare.py), the first token and the
pair. RUNS is sized to catch a plausible bug: accepting a drawn token with probability p(x)
instead of min(1, p(x)/q(x)) makes every test here fail (run against that bug, 2026-11-27: the
first token's chi2 180.4, 234.7 and 29.8 with 3 df against a critical 16.3, in the order below)."""

from collections import Counter

import numpy as np
import pytest

import chisquare

pytestmark = pytest.mark.real

RUNS, TOP_K = 240, 4
COLOURS = "The three primary colors are"  # a first token spread over four choices (about .5, .22, .17, .12)


def reference(target, prompt: list[int], temperature: float) -> Counter:
    """Plain sampling's distribution over the tokens it emits first, two at most: p(x) after the
    prompt times p(y | x), from the target's own logits (an end-of-generation token is not
    emitted: the text ends before it)."""
    from specgen.core.kv import evaluate
    from specgen.core.sampling import SamplingParams, distribution

    params = SamplingParams(temperature, top_k=TOP_K)
    ctx = target.new_context(256)

    def p_after(tokens: list[int]) -> np.ndarray:
        ctx.clear()
        return distribution(evaluate(ctx, tokens).copy(), params)  # the row is valid until the next decode

    first, out = p_after(prompt), Counter()
    for x in map(int, np.flatnonzero(first)):
        if target.is_eog(x):
            out[()] += first[x]
            continue
        after = p_after(prompt + [x])
        for y in map(int, np.flatnonzero(after)):
            out[(x,) if target.is_eog(y) else (x, y)] += first[x] * after[y]
    return out


def goodness_of_fit(counts: Counter, expected: Counter) -> None:
    """auto's counts of the first token and of the first two against plain's exact distribution;
    a sequence plain cannot emit fails outright."""
    keys = sorted(set(expected) | set(counts))
    p = np.array([expected[k] for k in keys])
    n = np.array([counts[k] for k in keys], dtype=np.float64)
    firsts = sorted({k[:1] for k in keys})
    by_first = np.array([[k[:1] == x for k in keys] for x in firsts], dtype=np.float64)
    ok, why = chisquare.one_sample(by_first @ n, by_first @ p)
    assert ok, f"first token: {why}"
    ok, why = chisquare.one_sample(n, p)
    assert ok, f"first two tokens: {why}"


def compare_with_plain(target, draft_ctx, prompt_text, temperature=1.0, draft_s=0.002):
    """auto (a synthetic flat cost curve and a cheap draft, `draft_s` a token, so that auto drafts;
    seeded, so it plans from the curves alone), RUNS times, tested against plain sampling's exact
    distribution: (counts of auto's first two tokens, plain's distribution of them, auto's
    choices, tokens accepted)."""
    from specgen.core.engine import GenerationRequest, TokenEvent, generate
    from specgen.core.sampling import SamplingParams
    from specgen.core.stats import RunStats
    from specgen.costs.curve import CostCurve
    from specgen.drafting.methods import METHODS, DraftingKit

    prompt = target.tokenize(prompt_text)
    expected = reference(target, prompt, temperature)
    ctx = target.new_context(256, n_seq_max=32)
    counts, choices, accepted = Counter(), Counter(), 0
    for seed in range(RUNS):
        params = SamplingParams(temperature, top_k=TOP_K, seed=10_000 + seed)
        kit = DraftingKit(params, draft_ctx, CostCurve([1, 32], [0.010, 0.012]),
                          CostCurve([1, 8], [draft_s, 1.5 * draft_s]), reproducible=True)
        drafter = METHODS["auto"].drafter(kit)
        stats = RunStats()
        events = generate(target, ctx, GenerationRequest(prompt, 2, params), stats, drafter)
        counts[tuple(e.token for e in events if isinstance(e, TokenEvent))] += 1
        choices.update(drafter.choices)
        accepted += stats.accepted
    goodness_of_fit(counts, expected)
    return counts, expected, choices, accepted


def test_auto_with_a_draft_samples_as_plain(smollm2_f32, smollm2):
    dctx = smollm2.new_context(256, n_seq_max=64)
    _, _, choices, accepted = compare_with_plain(smollm2_f32, dctx, COLOURS)
    assert choices["staged"] > RUNS * 0.9 and accepted > RUNS // 2, (choices, accepted)


def test_auto_with_a_subset_draft_samples_as_plain(tmp_path, smollm2_path, smollm2_f32):
    """The cut draft cannot propose the target's second choice for the first token: q is zero
    there, and rejection sampling emits it from the residual as often as plain sampling does."""
    from specgen.core.vocab import SubsetContext
    from specgen.llama.backend import LlamaModel
    from specgen.llama.gguf import TokenTable, cut_vocabulary

    target = smollm2_f32
    first = Counter()
    for key, p in reference(target, target.tokenize(COLOURS), 1.0).items():
        first[key[:1]] += p
    (second,) = first.most_common(2)[1][0]
    keep = [int(i) for i in TokenTable.read(smollm2_path).keep(np.arange(8000), 8000) if i != second]
    cut_vocabulary(smollm2_path, tmp_path / "cut.gguf", np.array(keep))
    draft = LlamaModel(tmp_path / "cut.gguf")
    dctx = SubsetContext(draft.new_context(256, n_seq_max=64), draft.subset_of_target, target.n_vocab)
    counts, _, choices, accepted = compare_with_plain(target, dctx, COLOURS)
    assert first[(second,)] > 0.1 and sum(n for k, n in counts.items() if k[:1] == (second,)) > RUNS // 20
    assert choices["staged"] > RUNS * 0.9 and accepted > RUNS // 2, (choices, accepted)


def test_auto_with_lookup_nodes_beside_the_drawn_chain_samples_as_plain(smollm2_f32, smollm2):
    """A prompt that repeats itself: lookup proposes its continuation, put beside the draft's
    chain (drawn from q without the lookup's tokens) in one tree, as auto does when the draft is
    nearly free."""
    dctx = smollm2.new_context(256, n_seq_max=64)
    text = "one two three. one two three. one two"
    _, _, choices, accepted = compare_with_plain(smollm2_f32, dctx, text, draft_s=0.0001)
    assert choices["staged+lookup"] > RUNS // 2 and accepted > RUNS // 2, (choices, accepted)
