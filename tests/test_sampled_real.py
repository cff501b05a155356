"""`auto` at T > 0 on real models: it drafts from q and verifies by rejection sampling, and what it
emits is distributed as plain sampling's output (two-sample chi-square per position): with a
draft model, with a vocabulary-subset draft that cannot propose the target's second choice, and
with lookup nodes beside the drawn chain. tests/test_rejection.py shows each rule's test failing
when the rule is broken; here the whole stack (llama.cpp batches, the draft's KV, the planner)."""

from collections import Counter

import numpy as np
import pytest

pytestmark = pytest.mark.real

RUNS, N, TOP_K = 160, 2, 4


def chi_square_ok(a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    seen = (a + b) > 0
    chi2 = (((a[seen] - b[seen]) ** 2) / (a[seen] + b[seen])).sum()
    df = max(1, int(seen.sum()) - 1)
    critical = df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3  # p = 0.001 (Wilson-Hilferty)
    return chi2 < critical, f"chi2 {chi2:.1f} over {seen.sum()} tokens (critical {critical:.1f})"


def compare_with_plain(target, draft_ctx, prompt_text, temperature=1.0, draft_s=0.002):
    """Plain and auto (a synthetic flat cost curve and a cheap draft, `draft_s` a token, so that
    auto drafts; seeded, so it plans from the curves alone), RUNS times each: per-position
    counts, and auto's choices."""
    from specgen.core.engine import GenerationRequest, TokenEvent, generate
    from specgen.core.sampling import SamplingParams
    from specgen.core.stats import RunStats
    from specgen.costs.curve import CostCurve
    from specgen.drafting.methods import METHODS, DraftingKit

    prompt = target.tokenize(prompt_text)
    ctx = target.new_context(256, n_seq_max=32)
    counts = {"plain": np.zeros((N, target.n_vocab)), "auto": np.zeros((N, target.n_vocab))}
    choices, accepted = Counter(), 0
    for seed in range(RUNS):
        for name in counts:
            params = SamplingParams(temperature, top_k=TOP_K, seed=seed if name == "plain" else 10_000 + seed)
            drafter = None
            if name == "auto":
                kit = DraftingKit(params, draft_ctx, CostCurve([1, 32], [0.010, 0.012]),
                                  CostCurve([1, 8], [draft_s, 1.5 * draft_s]), reproducible=True)
                drafter = METHODS["auto"].drafter(kit)
            stats = RunStats()
            events = generate(target, ctx, GenerationRequest(prompt, N, params), stats, drafter)
            for pos, e in enumerate(e for e in events if isinstance(e, TokenEvent)):
                counts[name][pos, e.token] += 1
            if drafter is not None:
                choices.update(drafter.choices)
                accepted += stats.accepted
    for pos in range(N):
        ok, why = chi_square_ok(counts["plain"][pos], counts["auto"][pos])
        assert ok, f"position {pos}: {why}"
    return counts, choices, accepted


def test_auto_with_a_draft_samples_as_plain(smollm2_f32, smollm2):
    dctx = smollm2.new_context(256, n_seq_max=64)
    _, choices, accepted = compare_with_plain(smollm2_f32, dctx, "The three primary colors are")
    assert choices["staged"] > RUNS * 0.9 and accepted > RUNS // 2, (choices, accepted)


def test_auto_with_a_subset_draft_samples_as_plain(tmp_path, smollm2_path, smollm2_f32):
    """The cut draft cannot propose the target's second choice for the first token: q is zero
    there, and rejection sampling emits it from the residual as often as plain sampling does."""
    from specgen.core.kv import evaluate
    from specgen.core.vocab import SubsetContext
    from specgen.llama.backend import LlamaModel
    from specgen.llama.gguf import TokenTable, cut_vocabulary

    target, text = smollm2_f32, "The capital of France is"
    second = int(np.argsort(-evaluate(target.new_context(128, n_seq_max=8), target.tokenize(text)))[1])
    keep = [int(i) for i in TokenTable.read(smollm2_path).keep(np.arange(8000), 8000) if i != second]
    cut_vocabulary(smollm2_path, tmp_path / "cut.gguf", np.array(keep))
    draft = LlamaModel(tmp_path / "cut.gguf")
    dctx = SubsetContext(draft.new_context(256, n_seq_max=64), draft.subset_of_target, target.n_vocab)
    counts, choices, accepted = compare_with_plain(target, dctx, text)
    assert counts["plain"][0, second] > RUNS // 20 and counts["auto"][0, second] > RUNS // 20
    assert choices["staged"] > RUNS * 0.9 and accepted > RUNS // 2, (choices, accepted)


def test_auto_with_lookup_nodes_beside_the_drawn_chain_samples_as_plain(smollm2_f32, smollm2):
    """A prompt that repeats itself: lookup proposes its continuation, put beside the draft's
    chain (drawn from q without the lookup's tokens) in one tree, as auto does when the draft is
    nearly free."""
    dctx = smollm2.new_context(256, n_seq_max=64)
    text = "one two three. one two three. one two"
    _, choices, accepted = compare_with_plain(smollm2_f32, dctx, text, draft_s=0.0001)
    assert choices["staged+lookup"] > RUNS // 2 and accepted > RUNS // 2, (choices, accepted)
