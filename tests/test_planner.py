"""The planner over synthetic numbers: cost curves decide tree sizes, acceptance decides whether to
draft at all, the guard backs off when speculation loses; and `auto` stays lossless."""

from collections import Counter

import numpy as np
import pytest

from fakes import FakeContext, FakeModel, NoisyDraft
from harness import generated
import specgen.costs.measure as costs_measure
from specgen.costs.curve import BATCH_SIZES, CostCurve
from specgen.costs.measure import measure, measure_context
from specgen.costs.timed import TimedContext
from specgen.drafting.methods import METHODS, DrafterInputs
from specgen.drafting.model import ModelDrafter
from specgen.core.protocol import Batch
from specgen.drafting.acceptance import AcceptanceModel, race_estimates
from specgen.drafting.guards import Guard, PlainSpeed
from specgen.drafting.value import best_chain_length, best_subtree, reach_probabilities
from specgen.core.sampling import SamplingParams
from specgen.core.tree import DraftTree
from specgen.core.verify import Verdict

FLAT = CostCurve([1, 32], [0.010, 0.012])  # memory-bound: a batch of 32 costs 1.2x one token
STEEP = CostCurve([1, 2, 4, 8], [0.010, 0.018, 0.034, 0.066])  # compute-bound: ~linear


def chain(n, p):
    return list(range(-1, n)), [1.0] + [p] * n


def test_reach_probability_is_product_along_the_path():
    assert reach_probabilities([-1, 0, 1, 0], [1.0, 0.5, 0.5, 0.2]) == [1.0, 0.5, 0.25, 0.2]


def test_flat_costs_grow_bigger_trees_than_steep_costs():
    parents, accept = chain(12, 0.8)
    flat = best_subtree(parents, accept, FLAT)
    steep = best_subtree(parents, accept, STEEP)
    assert len(flat.nodes) == 12
    assert 0 < len(steep.nodes) < 4
    assert flat.rate > 1 / FLAT(1) and steep.rate > 1 / STEEP(1)


def test_zero_acceptance_means_plain_decoding():
    parents, accept = chain(8, 0.0)
    for curve in (FLAT, STEEP):
        plan = best_subtree(parents, accept, curve)
        assert plan.nodes == [] and plan.expected_tokens == 1.0


def test_steep_costs_and_weak_drafts_mean_plain():
    parents, accept = chain(8, 0.3)
    assert best_subtree(parents, accept, STEEP).nodes == []


def test_subtree_is_ancestor_closed_and_prefers_likely_branches():
    # root -> a (0.9) -> b (0.9); root -> c (0.05)
    plan = best_subtree([-1, 0, 1, 0], [1.0, 0.9, 0.9, 0.05], CostCurve([1, 4], [0.010, 0.0125]))
    assert plan.nodes == [1, 2]


def test_draft_chain_length_follows_costs_and_acceptance():
    assert best_chain_length(0.0, FLAT, 0.004, 8)[0] == 0
    assert best_chain_length(0.9, FLAT, 0.001, 8)[0] == 8
    k_costly, _ = best_chain_length(0.9, FLAT, 0.008, 8)
    assert 0 < k_costly < 8
    assert best_chain_length(0.9, FLAT, 0.001, 8, c_draft_fixed=1.0)[0] == 0  # backlog too big
    # ... for one step; a prompt's catch-up serves every later step: with 2,000 tokens left to
    # write it pays, with 10 it does not.
    assert best_chain_length(0.9, FLAT, 0.001, 8, c_draft_fixed=1.0, tokens_left=2000)[0] > 0
    assert best_chain_length(0.9, FLAT, 0.001, 8, c_draft_fixed=1.0, tokens_left=10)[0] == 0


def test_cost_curve_interpolates_extrapolates_and_tracks_scale():
    c = CostCurve([1, 4, 8], [1.0, 2.0, 4.0])
    assert c(2) == pytest.approx(4 / 3) and c(16) == pytest.approx(8.0) and c(0) == 0.0
    for _ in range(200):
        c.observe(8, 2.0)  # batches got twice as fast
        c.observe(1, 0.5)  # and so did one token
    assert c(1) == pytest.approx(0.5, rel=1e-3) and c(8) == pytest.approx(2.0, rel=1e-3)


def test_a_measured_curve_is_never_cheaper_per_token_past_its_last_size():
    """Past the last measured size a tile edge may lie anywhere (gemma Q4_K_M: 65 rows took 186 ms
    where 64 took 170, and 164.5 was extrapolated from 48 and 64): a measured curve prices such
    sizes at its last size's cost per token, so the planner stops at a size it knows."""
    c = CostCurve([1, 48, 64], [0.010, 0.126, 0.162], between="step")
    assert c(65) / 65 >= c(64) / 64 and c(72) == pytest.approx(0.162 * 72 / 64)
    # The sizes calibration times reach past the biggest tree auto may build.
    assert max(BATCH_SIZES) >= METHODS["auto"].params["max_nodes"]


def test_one_token_and_batches_keep_their_own_level():
    """A neighbour's memory traffic slows a memory-bound decode of one token far more than a
    batch (gemma F32: B = 1 at 1.5x its calibrated cost, B = 8 at 1.0x). One scale for both made
    the planner price a batch of 8 at 1.5x too and stop drafting; each keeps its own level, a
    small batch following the one-token level by how much of its cost reading the weights is."""
    c = CostCurve([1, 2, 8, 16], [1.0, 1.5, 2.5, 4.0])
    for _ in range(100):
        c.observe(1, 1.5)
        c.observe(8, 2.5)
        c.observe(16, 4.0)
    assert c(1) == pytest.approx(1.5, rel=0.02)
    assert c(8) == pytest.approx(2.5, rel=0.05) and c(16) == pytest.approx(4.0, rel=0.05)
    assert 1.5 < c(2) < 1.5 * 1.5  # between the two levels
    # Batches unseen for long follow the one-token level, slowly: none could show them cheaper.
    c = CostCurve([1, 8], [1.0, 2.5])
    for _ in range(300):
        c.observe(1, 0.5)
    assert c(1) == pytest.approx(0.5, rel=0.02) and c(8) < 0.6 * 2.5


def test_one_slow_decode_barely_moves_a_level_and_a_real_slowdown_still_does():
    """A pair A bench's first batch of 2 once took 635 ms against gemma F32's 47 (a hiccup; the
    next ones took 47-54): read through a small batch's share of its own level, that one decode put
    the batch level at 5.4x and auto planned with batches 5x too dear for a prompt and a half
    (q81 lost at 0.90x). One decode moves a level at most as far as a decode at twice it would."""
    def f32():
        return CostCurve([1, 2, 8, 16], [0.040, 0.047, 0.074, 0.100])
    c = f32()
    c.observe(2, 0.635)
    assert c(2) <= 1.1 * 0.047 + 1e-9 and c(8) <= 1.1 * 0.074 + 1e-9
    c = f32()
    c.observe(1, 0.360)  # a one-token hiccup (9x)
    assert c(1) <= 1.1 * 0.040 + 1e-9 and c(8) <= 1.1 * 0.074 + 1e-9
    # A machine that really got 3x slower is followed within a few dozen decodes, as before.
    c = f32()
    for _ in range(30):
        c.observe(1, 0.120)
    assert c(1) > 2.8 * 0.040
    for _ in range(30):
        c.observe(8, 3 * 0.074)
    assert c(8) > 2.5 * 0.074
    # And plain decoding's measured speed, what the guards hold speculation to.
    plain = PlainSpeed()
    for _ in range(5):
        plain.observe_plain(0.032)
    plain.observe_plain(0.586)  # a step that ran into a hiccup
    assert plain.rate(0.0) > 0.75 / 0.032
    for _ in range(15):
        plain.observe_plain(0.096)
    assert plain.rate(0.0) < 1.1 / 0.096


def test_calibration_times_batches_that_output_every_row_and_cleans_up():
    """A tree verify asks for logits at every node; with a large vocabulary the output layer is
    most of a token's cost, so calibration batches must ask for every row too."""
    ctx = FakeContext(FakeModel(n_vocab=16), n_ctx=256, n_seq_max=4, n_batch=128)
    ctx.decode(_prompt_batch([3, 4, 5]))
    committed = {s: dict(cells) for s, cells in ctx.kv.items()}
    curve = measure(ctx, 3, 7, budget_s=60.0)
    assert curve.sizes == list(BATCH_SIZES)
    timed = ctx.calls[1:]
    every_row = [b for b in timed if all(b.logits)]
    assert {len(b) for b in every_row} == set(BATCH_SIZES)
    # Then the one-output cost (a draft catching up on committed text): 16 tokens, last row only.
    one_row = [b for b in timed if not all(b.logits)]
    assert one_row and all(len(b) == 16 and b.logits == [False] * 15 + [True] for b in one_row)
    assert {s: cells for s, cells in ctx.kv.items() if cells} == committed  # spare sequence removed


def test_one_output_decodes_cost_the_network_without_its_output_layer():
    """Catching a draft up on 16 committed tokens asks for one row of logits: with a large
    vocabulary that costs a fraction of 16 rows of logits, and the planner must know it."""
    curve = CostCurve([1, 16], [0.010, 0.040], per_token_one_output=0.001)
    assert curve(16, outputs=1) == pytest.approx(0.010 + 15 * 0.001)
    assert curve(16, outputs=16) == pytest.approx(curve(16)) == pytest.approx(0.040)
    assert curve(16, outputs=1) < curve(16, outputs=8) < curve(16)  # in between: linear in outputs
    assert curve(1, outputs=0) == pytest.approx(0.010)
    curve.observe(16, curve.at(16, 0, outputs=1), outputs=1)  # a one-output decode as predicted
    assert curve.scale == pytest.approx(1.0)
    assert CostCurve([1, 16], [0.010, 0.040])(16, outputs=1) == pytest.approx(0.040)  # unmeasured: all rows


def test_cost_grows_with_context_and_gamma_comes_from_long_prompt_decodes(monkeypatch):
    curve = CostCurve([1, 8, 16], [0.010, 0.020, 0.030])
    # Synthetic timings: +2 us per batch token per context token, on a machine 1.5x busier than
    # when the curve was timed (which must not be read as context cost).
    def timed(ctx, spare, n_past, token, b, copy=True, outputs=None):
        return 1.5 * (curve.base(b) + (2e-6 * b * n_past if copy else 0.0))
    monkeypatch.setattr(costs_measure, "_timed_decode", timed)
    measure_context(FakeContext(FakeModel(), n_ctx=2048, n_seq_max=4), curve, 1000, 5)
    assert curve.per_context == pytest.approx(2e-6) and curve.per_context_at == 1000
    assert curve(8, context=1500) == pytest.approx(curve(8) + 2e-6 * 8 * 1500)
    assert curve(16, 1500) / curve(1, 1500) > CostCurve([1, 8, 16], [0.010, 0.020, 0.030])(16) / 0.010  # steeper
    curve.observe(8, curve.at(8, 1500), context=1500)  # a decode as predicted leaves the scale alone
    assert curve.scale == pytest.approx(1.0)


def test_live_steps_move_the_scale_but_prompt_chunks_do_not():
    """A prompt chunk of hundreds of tokens lies far beyond the calibrated sizes: read through the
    curve's extrapolation it would say nothing true about the machine."""
    curve = CostCurve([1, 8], [1e-9, 2e-9])  # any real decode is far slower than this curve
    timed = TimedContext(FakeContext(FakeModel(), n_ctx=512, n_seq_max=4), curve)
    timed.decode(_prompt_batch(list(range(1, 41))))
    assert curve.scale == 1.0
    step = Batch()
    step.add(7, 40, (0,), True)
    timed.decode(step)
    assert curve.scale > 1.0


def _prompt_batch(tokens):
    batch = Batch()
    for i, tok in enumerate(tokens):
        batch.add(tok, i, (0,), i == len(tokens) - 1)
    return batch


def test_acceptance_model_learns_from_tested_nodes_only():
    model = AcceptanceModel()
    before = model.lookup_p(4, 1)
    tree = DraftTree.chain(9, [1, 2, 3])
    evidence = [None] + [model.lookup_evidence(4, d) for d in (1, 2, 3)]
    for _ in range(30):
        model.observe(tree, evidence, path=[])  # first token rejected: depths 2-3 untested
    assert model.lookup_p(4, 1) < 0.2 < before
    assert model.lookup_p(4, 2) == pytest.approx(AcceptanceModel().lookup_p(4, 2))
    lowered = model.lookup_p(4, 1)
    model.new_text()  # a new prompt: old evidence counts half, the estimate moves back to the prior
    assert lowered < model.lookup_p(4, 1) < before


def test_lookup_acceptance_is_keyed_by_effective_match_length():
    model = AcceptanceModel()
    # A node two deep in the continuation of a 5-token match extends a 6-token match.
    assert model.lookup_bin(5, 2) == model.lookup_bin(6, 1)
    assert model.lookup_p(1, 1) < model.lookup_p(4, 1) < model.lookup_p(20, 1) < model.lookup_p(30, 1)


def test_guard_backs_off_when_losing_and_probes_again():
    guard = Guard(window=4, margin=0.97, backoff=3)
    for _ in range(4):
        assert guard.allow_speculation()
        guard.record(tokens=1, seconds=0.02, plain_rate=100.0)  # 50 tok/s vs plain 100
    assert [guard.allow_speculation() for _ in range(4)] == [False, False, False, True]
    for _ in range(4):
        guard.record(tokens=1, seconds=0.02, plain_rate=100.0)
    assert [guard.allow_speculation() for _ in range(7)] == [False] * 6 + [True]  # doubled


def auto_run(target, draft, prompt, n, sampling, curve, draft_curve=None, reproducible=False):
    """`auto` on fakes with fixed synthetic cost curves (fake decodes take microseconds; timing
    them would make the curves meaningless), built from the method table as every run builds it."""
    ctx = FakeContext(target, n_ctx=512, n_seq_max=32)
    dctx = FakeContext(draft, n_ctx=512, n_seq_max=64) if draft is not None else None
    auto = METHODS["auto"].drafter(DrafterInputs(sampling, dctx, curve, draft_curve, reproducible))
    run = generated(target, ctx, prompt, n, sampling, auto)
    return run.tokens, run.stats, auto


def plain_tokens(target, prompt, n, sampling):
    return generated(target, FakeContext(target, n_ctx=512, n_seq_max=1), prompt, n, sampling).tokens


LOOPY = {(3, 4): 5, (4, 5): 6, (5, 6): 3, (6, 3): 4}


def test_auto_greedy_lookup_is_lossless_and_drafts_on_flat_costs():
    target = FakeModel(n_vocab=16, sharpness=2.0, script=LOOPY)
    prompt = [0, 3, 4, 5, 6, 3, 4]
    tokens, stats, auto = auto_run(target, None, prompt, 48, SamplingParams(), FLAT)
    assert tokens == plain_tokens(target, prompt, 48, SamplingParams())
    assert stats.accepted > 0 and stats.target_calls < 24 and auto.choices["lookup"] > 0


def test_auto_uses_a_good_cheap_draft_where_lookup_has_nothing():
    target = FakeModel(n_vocab=16, sharpness=2.0)
    draft = NoisyDraft(target, noise=0.3)  # agrees with the target nearly always
    prompt = [0, 9, 8, 7]
    tokens, stats, auto = auto_run(target, draft, prompt, 48, SamplingParams(), FLAT,
                                   CostCurve([1, 8], [0.002, 0.003]))
    assert tokens == plain_tokens(target, prompt, 48, SamplingParams())
    assert auto.choices["staged"] > auto.choices["plain"]
    assert stats.mean_accepted > 2


def auto_with_draft(draft, draft_curve):
    dctx = FakeContext(draft, n_ctx=512, n_seq_max=64)
    return METHODS["auto"].drafter(DrafterInputs(SamplingParams(), dctx, FLAT, draft_curve))


def test_a_draft_behind_on_committed_text_is_priced_at_one_output_row():
    """After lookup steps the draft has text to catch up on: one decode with one row of logits.
    Priced as if every row output logits (steep on a CPU with a large vocabulary), a backlog of
    40 tokens would shut the draft out for the rest of the text."""
    target = FakeModel(n_vocab=64, sharpness=2.0)
    backlog = list(range(10, 50))  # no repeats: lookup has nothing to offer
    every_row = dict(sizes=[1, 2, 32, 64], seconds=[0.002, 0.004, 0.064, 0.128])
    choices = {}
    for one_output in (0.0, 0.0001):  # unmeasured: all rows; measured: the body alone per token
        auto = auto_with_draft(NoisyDraft(target, 0.3), CostCurve(**every_row, per_token_one_output=one_output))
        auto.reset([0, 1, 2, 3])
        auto.model.observe(Verdict([], backlog[:1]), backlog)  # steps that did not use the draft
        assert auto.model.backlog == 4 + 40  # the prompt too: auto's draft reads it when first used
        auto.propose(16)
        choices[one_output] = auto.last_choice
    assert choices == {0.0: "plain", 0.0001: "staged"}


def test_a_draft_catch_up_must_pay_for_itself_soon_however_long_the_budget():
    """Reading 200 tokens into the draft (0.4 s here) would pay over 2,000 tokens, but a text can
    end after three: auto starts the draft only when it earns its catch-up back within
    CATCH_UP_HORIZON tokens, as it does when the backlog is short."""
    target = FakeModel(n_vocab=512, sharpness=2.0)
    choices = {}
    for backlog in (4, 200):
        draft_curve = CostCurve([1, 8], [0.002, 0.016], per_token_one_output=0.002)
        auto = auto_with_draft(NoisyDraft(target, 0.3), draft_curve)
        auto.reset(list(range(10, 10 + backlog)))  # no repeats: lookup has nothing to offer
        assert auto.model.backlog == backlog
        auto.propose(2000)
        choices[backlog] = auto.last_choice
    assert choices == {4: "staged", 200: "plain"}


def test_a_draft_judged_too_weak_is_tried_again_later():
    """Acceptance is learned only from steps that use the draft: a low estimate would otherwise
    keep it out for good, though the text (and how well the draft knows it) changes."""
    target = FakeModel(n_vocab=64, sharpness=2.0)
    auto = auto_with_draft(NoisyDraft(target, 0.3), CostCurve([1, 8], [0.002, 0.003], per_token_one_output=5e-5))
    auto.reset([0, 1, 2, 3])
    auto.draft.alpha = 0.05  # as after a stretch of text the draft got wrong
    for step, tok in enumerate(range(10, 110)):
        auto.propose(16)
        if auto.last_choice == "staged":
            break
        auto.observe(Verdict([], [tok]), [tok])
    assert auto.last_choice == "staged" and 5 < step < 100


def test_auto_reads_the_prompt_into_the_draft_only_when_it_first_uses_the_draft():
    """A long prompt that lookup serves well would cost the draft a whole prefill for nothing."""
    target = FakeModel(n_vocab=16, sharpness=2.0, script=LOOPY)
    draft = NoisyDraft(target, noise=0.3)
    looping = [0] + [3, 4, 5, 6] * 20
    tokens, _, auto = auto_run(target, draft, looping, 24, SamplingParams(), FLAT, CostCurve([1, 8], [0.002, 0.003]))
    assert auto.choices["staged"] == 0 and auto.model.cache.ctx.calls == []  # lookup all along
    assert tokens == plain_tokens(target, looping, 24, SamplingParams())
    fresh = [0, 9, 8, 7]
    tokens, _, auto = auto_run(target, draft, fresh, 24, SamplingParams(), FLAT, CostCurve([1, 8], [0.002, 0.003]))
    first = auto.model.cache.ctx.calls[0]
    assert auto.choices["staged"] > 0 and first.tokens == fresh and first.logits == [False] * 3 + [True]
    assert tokens == plain_tokens(target, fresh, 24, SamplingParams())


def test_auto_stays_plain_when_nothing_is_accepted_and_costs_are_steep():
    target = FakeModel(n_vocab=16, sharpness=2.0)  # no repetition: lookup never matches usefully
    prompt = [0, 3, 4, 5, 6, 3, 4]
    tokens, stats, auto = auto_run(target, None, prompt, 60, SamplingParams(), STEEP)
    assert tokens == plain_tokens(target, prompt, 60, SamplingParams())
    assert auto.choices["plain"] + auto.choices["guard"] >= 50


@pytest.mark.parametrize("prompt, noise", [([0, 4, 5], 1.0), ([0, 2, 3, 2, 3], 3.0)])
def test_auto_sampled_writes_plains_tokens_under_the_same_seed(prompt, noise):
    """At T > 0 auto drafts with the draft racing on the target's noise (and lookup after a
    repeat): whatever it runs, each seed's text is plain sampling's."""
    target = FakeModel(n_vocab=6, sharpness=1.0, script={(2,): 3, (3,): 2})
    draft = NoisyDraft(target, noise=noise)
    n, runs = 6, 150
    choices, accepted, texts = Counter(), 0, set()
    for seed in range(runs):
        plain = plain_tokens(target, prompt, n, SamplingParams(1.0, seed=seed))
        tokens, stats, auto = auto_run(target, draft, prompt, n, SamplingParams(1.0, seed=seed),
                                       FLAT, CostCurve([1, 8], [0.002, 0.003]))
        assert tokens == plain, seed
        choices.update(auto.choices)
        accepted += stats.accepted
        texts.add(tuple(plain))
    assert choices["staged"] + choices["lookup"] > runs // 10, choices  # it drafted
    assert accepted > runs and len(texts) > 5  # the script makes most texts loop on 2, 3


def test_seeded_auto_ignores_clocks_and_repeats_its_text(monkeypatch):
    """With a seed, auto plans from the cost curves only: a slow clock (which makes an unseeded
    auto's guard back off) changes nothing, so the same command gives the same text. Drafting
    from q, its draws are not plain's (equal in distribution: test_auto_sampled_*); without a
    draft model (lookup: deterministic drafts, sample-and-match) they are plain's, draw for draw."""
    import specgen.drafting.auto

    target = FakeModel(n_vocab=16, sharpness=2.0)
    draft = NoisyDraft(target, noise=0.3)
    prompt, params, draft_curve = [0, 9, 8, 7], SamplingParams(0.8, seed=5), CostCurve([1, 8], [0.002, 0.003])

    def run(seconds_per_call, reproducible):
        clock = iter(np.cumsum(np.random.default_rng(0).exponential(seconds_per_call, 100_000)))
        monkeypatch.setattr(specgen.drafting.auto.time, "perf_counter", lambda: float(next(clock)))
        tokens, _, auto = auto_run(target, draft, prompt, 64, params, FLAT, draft_curve, reproducible=reproducible)
        return tokens, auto.choices

    fast, slow = run(0.0001, True), run(0.03, True)
    assert fast == slow
    assert slow[1]["draft"] + slow[1]["staged"] > 0  # the seeded runs did draft from q
    assert run(0.03, False)[1] != slow[1]  # unseeded, the clock does steer auto (the guard backs off)
    looping = FakeModel(n_vocab=16, sharpness=2.0, script=LOOPY)
    loop_prompt = [0, 3, 4, 5, 6, 3, 4]
    tokens, _, auto = auto_run(looping, None, loop_prompt, 48, params, FLAT, reproducible=True)
    assert auto.choices["lookup"] > 0 and tokens == plain_tokens(looping, loop_prompt, 48, params)


def test_a_benched_draft_is_not_used_until_its_backoff_ends():
    """The draft guard: after draft steps realised slower than plain, auto drafts without the
    model for the guard's backoff, then tries it again."""
    target = FakeModel(n_vocab=16, sharpness=2.0)
    dctx = FakeContext(NoisyDraft(target, noise=0.3), n_ctx=512, n_seq_max=64)
    inputs = DrafterInputs(SamplingParams(), dctx, FLAT, CostCurve([1, 8], [0.0005, 0.0006]), reproducible=True)

    def choices(auto, steps):
        out = []
        for tok in range(10, 10 + steps):
            auto.propose(16)
            out.append(auto.last_choice)
            auto.observe(Verdict([], [tok]), [tok])
        return out

    fresh = METHODS["auto"].drafter(inputs)
    fresh.reset([0, 9, 8, 7])
    assert choices(fresh, 1) == ["staged"]  # a cheap draft on a flat target curve is worth a try
    dctx.clear()
    benched = METHODS["auto"].drafter(inputs)
    benched.reset([0, 9, 8, 7])
    benched.guards.of("draft").plain_left = 3
    assert choices(benched, 4) == ["guard"] * 3 + ["staged"]  # plain, where the benched draft would have won


def test_draft_efficiency_follows_realised_rates_and_relaxes():
    """Draft steps that take twice the time planned halve the draft's rate in the plan; so do
    steps that commit fewer tokens than planned; steps without the draft let it drift back, so it
    is tried again later, but not at each new text."""
    from specgen.drafting.acceptance import DraftEstimate

    est = DraftEstimate()
    for _ in range(80):
        est.observe_step(planned_tokens=2.0, planned_s=0.020, tokens=2, seconds=0.040)
    assert est.usable() == pytest.approx(0.5, abs=0.01)
    # q81's creative text (gemma F32, -d self): 2.24 tokens planned a step, 1.59 committed, in the
    # time planned. The chain model took every drafted token as likely as the first.
    est = DraftEstimate()
    committed = [1, 2, 2, 1, 2, 1, 2, 2, 1, 2, 2, 1, 2, 2, 1, 3, 2, 1, 1, 2] * 5  # mean 1.65
    for tokens in committed:
        est.observe_step(planned_tokens=2.24, planned_s=0.067, tokens=tokens, seconds=0.067)
    assert est.usable() == pytest.approx(1.65 / 2.24, abs=0.1)
    for _ in range(80):  # steps that beat their plan: never planned as better than the model
        est.observe_step(planned_tokens=2.0, planned_s=0.020, tokens=4, seconds=0.010)
    assert est.efficiency > 1.0 and est.usable() == 1.0
    est.efficiency = 0.5
    for _ in range(200):  # two texts' worth of steps without the draft (pair A): still sitting out
        est.relax(0.004)
    assert est.usable() < 0.7
    for _ in range(1800):
        est.relax(0.004)
    assert est.usable() > 0.95  # but tried again in the end


def test_one_slow_draft_step_does_not_bench_the_draft():
    """A draft step that ran into a hiccup (10x its usual time) would have made each drafted token
    look 2.8x dearer until RELAX brought it back, tens of steps later; it moves the estimates as
    a step at twice them would."""
    from specgen.drafting.acceptance import DraftEstimate

    est = DraftEstimate()
    est.observe_step_cost(0.007, c_draft_1=0.007)
    est.observe_step_cost(0.070, c_draft_1=0.007)
    assert est.step_cost(0.007) <= 1.2 * 0.007 + 1e-12
    est.observe_step(planned_tokens=2.0, planned_s=0.080, tokens=2, seconds=0.800)
    assert est.usable() >= 0.9
    for _ in range(40):  # a draft that really got 10x dearer is still followed
        est.observe_step_cost(0.070, c_draft_1=0.007)
    assert est.step_cost(0.007) > 0.9 * 0.070


def test_guard_judges_long_steps_after_fewer_of_them():
    """32 steps of 64-token chains would be 2,000 tokens of losing before the guard could act."""
    guard = Guard(window=32, min_steps=4, window_tokens=128)
    for _ in range(3):
        guard.record(tokens=64, seconds=1.0, plain_rate=100.0)  # 64 tok/s vs plain 100
    assert guard.allow_speculation()  # three steps are too few to judge
    guard.record(tokens=64, seconds=1.0, plain_rate=100.0)
    assert not guard.allow_speculation()
    short = Guard(window=32, min_steps=4, window_tokens=128)
    for _ in range(8):
        short.record(tokens=2, seconds=0.04, plain_rate=100.0)
    assert short.allow_speculation()  # 16 tokens: not yet judged


def test_the_likeliest_sibling_keeps_its_estimate_and_the_others_share_the_rest():
    from specgen.drafting.tuning import MAX_ACCEPT, MAX_ACCEPT_LOOP
    from specgen.drafting.value import cap_siblings as _cap_siblings
    from specgen.core.tree import DraftTree

    tree = DraftTree.root_only(1)
    loop, short, other = tree.add(2, 0), tree.add(3, 0), tree.add(4, 0)
    tree.add(5, loop)
    capped = _cap_siblings(tree, [1.0, 0.995, 0.6, 0.01, 0.9])
    assert capped[loop] == MAX_ACCEPT
    assert capped[short] + capped[other] == pytest.approx(0.0, abs=1e-12)  # nothing left for them
    assert capped[4] == 0.9  # an only child below keeps its own estimate
    assert _cap_siblings(tree, [1.0, 0.5, 0.3, 0.1, 0.5])[1:4] == [0.5, 0.3, 0.1]  # within the cap: as learned
    assert _cap_siblings(tree, [1.0, 0.3, 0.7, 0.1, 0.5])[1:4] == pytest.approx([0.29, 0.7, 0.0])
    # A loop node's own cap is higher (loops were accepted 2,726 times of 2,726): a loop chain of
    # 63 tokens can pay where at 0.99 a token it could not.
    caps = [1.0, MAX_ACCEPT_LOOP, MAX_ACCEPT, MAX_ACCEPT, MAX_ACCEPT_LOOP]
    assert _cap_siblings(tree, [1.0, 0.999, 0.6, 0.01, 0.999], caps) == pytest.approx(
        [1.0, MAX_ACCEPT_LOOP, 0.0, 0.0, MAX_ACCEPT_LOOP])
    capped = _cap_siblings(tree, [1.0, 0.2, 0.999, 0.01, 0.5], caps)
    assert capped[1:4] == pytest.approx([MAX_ACCEPT_LOOP - MAX_ACCEPT, MAX_ACCEPT, 0.0])


def test_draft_steps_whose_tree_is_pruned_to_nothing_count_against_the_draft():
    """The draft chain is chosen by its learned first-token acceptance, then pruned by each
    token's q: a draft unsure of everything drafts and verifies nothing, but its decodes were
    paid. Those steps count as speculation: the guards back off (the steps were invisible to them,
    and made gemma F32's plain steps 30% slower)."""
    unsure = FakeModel(n_vocab=64, sharpness=0.01)  # q ~ 1/64 for every token
    dctx = FakeContext(unsure, n_ctx=512, n_seq_max=64)
    mild = CostCurve([1, 2, 32], [0.010, 0.0112, 0.030])  # a second row costs 12% more
    inputs = DrafterInputs(SamplingParams(), dctx, mild, CostCurve([1, 8], [0.002, 0.0025]), reproducible=True)
    auto = METHODS["auto"].drafter(inputs)
    auto.reset([0, 9, 8, 7])
    choices, drafted = [], []
    for tok in range(10, 70):
        tree = auto.propose(16)
        choices.append(auto.last_choice)
        drafted.append(tree.n_drafted)
        auto.observe(Verdict([], [tok]), [tok])
    assert choices[0] == "staged" and drafted[0] == 0  # chosen by alpha, pruned to nothing
    assert "staged" not in choices[32:48]  # judged losing after the guards' window (32 steps), backed off


def test_a_short_match_is_trusted_as_far_as_its_other_occurrences_agree():
    """After a 2-token match, the next token is the one the n-gram's earlier occurrences agree on
    (92% of the time after a 3-token match whose 2-4 occurrences all agree, 10-45% when they
    disagree): measured per support class, a unanimous short match is worth drafting on a
    curve where a single or split one is not."""
    from specgen.drafting.lookup import LookupDrafter
    from specgen.drafting.sources import MAJORITY, MINORITY, SINGLE, UNANIMOUS

    lookup = LookupDrafter()
    lookup.reset([0, 9, 3, 4, 5, 11, 12, 3, 4, 5, 13, 14, 3, 4, 6, 15, 16, 3, 4])
    assert lookup.support([3, 4], 5, 2) == MAJORITY and lookup.support([3, 4], 6, 2) == MINORITY
    assert lookup.support([4, 5], 11, 2) == MINORITY and lookup.support([16, 3], 4, 2) == SINGLE
    assert lookup.support([9, 3, 4, 5, 13], 14, 5) == SINGLE  # 4-grams at most: (3, 4, 5, 13) occurred once
    lookup.reset([0, 3, 4, 5, 11, 3, 4, 5, 12])
    assert lookup.support([3, 4], 5, 2) == UNANIMOUS

    curve = CostCurve([1, 2, 4, 8], [0.010, 0.0135, 0.020, 0.030])
    texts = {"unanimous": [9, 3, 4, 5, 11, 12, 3, 4, 5, 13, 14, 3, 4, 5, 15],
             "split": [9, 3, 4, 5, 11, 12, 3, 4, 6, 13, 14, 3, 4, 7, 15],
             "single": [9, 3, 4, 5, 11]}
    drafted = {}
    for name, text in texts.items():
        auto = METHODS["auto"].drafter(DrafterInputs(SamplingParams(), costs=curve, reproducible=True))
        auto.reset([0, *text, 16, 3, 4])  # ends in a 2-token match ("16" is new)
        drafted[name] = auto.propose(16).tokens[1:]
    assert drafted == {"unanimous": [5], "split": [], "single": []}


def test_a_draft_far_behind_reads_only_the_recent_text_and_output_stays_exact():
    """auto's draft starts reading a long prompt at its last WINDOW tokens (a 3-token answer to a
    long prompt ran at a third of plain's speed while the draft read it all); verification keeps
    the output plain's."""
    from specgen.drafting.model import DraftCache

    target = FakeModel(n_vocab=64, sharpness=2.0)
    rng = np.random.default_rng(0)
    prompt = [0] + [int(t) for t in rng.integers(2, 64, 400)]
    draft_curve = CostCurve([1, 8], [0.002, 0.003], per_token_one_output=5e-5)
    tokens, _, auto = auto_run(target, NoisyDraft(target, noise=0.3), prompt, 24, SamplingParams(), FLAT, draft_curve)
    assert tokens == plain_tokens(target, prompt, 24, SamplingParams())
    assert auto.choices["staged"] > 0
    read = [(t, p) for call in auto.model.cache.ctx.calls for t, p in zip(call.tokens, call.positions)]
    # Read in chunks of n_batch from position 0: the text's last WINDOW tokens when it was first used.
    w = DraftCache.WINDOW
    assert [p for _, p in read[:w]] == list(range(w))
    text, first = prompt + tokens, [t for t, _ in read[:w]]
    assert any(text[j:j + w] == first for j in range(1, len(text) - w))


def test_a_unanimous_short_match_is_drafted_as_deep_as_its_support_pays():
    """How deep a chain could pay is judged before the trie is built: with every node as
    supported as the first, not as if the nodes below it had occurred once (that capped a
    unanimous 2-token match's chain at one token on this curve)."""
    passage = list(range(20, 32))
    text = [40, *passage, 41, *passage, 42, *passage, 43, 20, 21]  # ends in a 2-token match
    curve = CostCurve([1, 2, 4, 8, 16], [0.010, 0.0135, 0.020, 0.030, 0.050])
    auto = METHODS["auto"].drafter(DrafterInputs(SamplingParams(), costs=curve, reproducible=True))
    auto.reset([0, *text])
    assert auto.propose(16).tokens[1:8] == passage[2:9]


def test_where_a_templates_copies_part_is_learned_apart_from_the_passage():
    """Lines that repeat but for one number (a year, a counter): under a long match the number's
    4-gram has had a different follower every time (a split), and its failures are learned in
    that class, not in the passage's: the passage's estimate stays high, and a line's 16 tokens
    after its number are drafted in one chain (with failures pooled, chains stopped at 11)."""
    import specgen.drafting.auto as A

    line, tail = list(range(20, 30)), [30, 31, 32, 33, 34, 50]
    script = {(k,): k + 1 for k in [*range(20, 29), *range(30, 34)]} | {(34,): 50, (50,): 20}
    for n in range(60, 75):  # each line's number follows the previous line's
        script[(n,)] = 30
        script[(n, *tail, *line)] = n + 1
    target = FakeModel(n_vocab=80, sharpness=2.0, script=script)
    prompt = [0, 5, *line, 60, *tail, *line]
    curve = CostCurve([1, 2, 4, 8, 16, 32], [0.010, 0.0135, 0.020, 0.030, 0.050, 0.09])
    accepted = []
    observe = A.AutoDrafter.observe

    def spy(self, verdict, committed):
        accepted.append(len(verdict.path))
        observe(self, verdict, committed)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(A.AutoDrafter, "observe", spy)
        tokens, _, _ = auto_run(target, None, prompt, 160, SamplingParams(), curve, reproducible=True)
    assert tokens == plain_tokens(target, prompt, 160, SamplingParams())
    assert max(accepted) >= 14


def test_a_quoted_passage_is_drafted_as_far_as_a_flat_curve_affords_from_the_first_step():
    """A fresh planner, a 30-token match with a passage of 60 after it, gemma F32's curve (40 ms,
    then about 4 ms a token): the copy is drafted 39+ tokens deep at once. At the first priors for
    24-39 and 40+ matched tokens (0.95, 0.97; 0.98 and 0.98-0.997 were measured) it drafted 23,
    and q257's 39-token quote took two verifications where llama.cpp's ngram modes took one."""
    passage = list(range(100, 190))
    prompt = [1, 2, *passage, 3, *passage[:30]]
    f32 = CostCurve([1, 2, 4, 8, 16, 20, 80], [0.0397, 0.0498, 0.0632, 0.0775, 0.1068, 0.1223, 0.3417])
    auto = METHODS["auto"].drafter(DrafterInputs(SamplingParams(), costs=f32, reproducible=True))
    auto.reset(prompt)
    tree = auto.propose(79)
    assert tree.n_drafted >= 39 and tree.tokens[1:tree.n_drafted + 1] == passage[30:30 + tree.n_drafted]


def test_sampled_auto_learns_how_often_the_draft_wins_the_targets_race():
    """At T > 0 the draft's race winner is accepted where it is the target's: a draft close to the
    target is priced high and drafts chains; one far from it is priced low, and auto stops using it.
    64 tokens: in 16, a random draft's winner and runner-up (a leaf beside it) hit the target's
    winner often enough to be worth a row on this flat curve."""
    target = FakeModel(n_vocab=64, sharpness=2.0)
    prompt, params, draft_curve = [0, 9, 8, 7], SamplingParams(1.0, seed=3), CostCurve([1, 8], [0.004, 0.005])
    _, good_stats, good = auto_run(target, NoisyDraft(target, noise=0.05), prompt, 64, params, FLAT, draft_curve,
                                   reproducible=True)
    _, _, bad = auto_run(target, NoisyDraft(target, noise=4.0), prompt, 64, params, FLAT, draft_curve,
                         reproducible=True)
    assert good.draft.alpha > 0.8 and good_stats.mean_accepted > 1.5
    assert bad.draft.alpha < 0.5
    share = lambda auto: auto.choices["staged"] / auto.choices.total()  # noqa: E731
    assert share(good) > 0.8 and share(bad) < 0.5

def test_race_estimates_follow_the_margin_between_the_draft_finishers():
    """A thin margin: the draft's winner is a coin flip and its runner-up often the target's
    winner; a wide one: the winner nearly surely. Never more than certain together."""
    thin, wide = race_estimates([1.0, 0.95, 0.2]), race_estimates([5.0, 1.0, 0.5])
    assert thin[0] < 0.6 < 0.95 < wide[0] and thin[1] > 0.25 > 0.01 > wide[1]
    assert thin[2] < thin[1] and sum(thin) <= 1 and sum(wide) <= 1
    assert race_estimates([3.0]) == race_estimates([3.0, -np.inf])[:1] and race_estimates([]) == []


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_a_sampled_draft_adds_its_runner_up_as_a_leaf_it_never_expands(temperature):
    """Sampling with leaves=1: beside each drafted node the draft's race runner-up, never
    expanded, so the draft still decodes once per level (a chain's cost); greedy, no leaves."""
    target = FakeModel(n_vocab=64, sharpness=1.0)
    prompt = [0, 5, 9, 12]
    for params, with_leaves in ((SamplingParams(temperature, seed=5), True), (SamplingParams(), False)):
        drafter = ModelDrafter(FakeContext(NoisyDraft(target, 0.5), n_ctx=128, n_seq_max=16), params,
                               branching=1, leaves=1, max_depth=5, max_nodes=10)
        drafter.reset(prompt, None)
        tree = drafter.propose(5, max_nodes=10)
        kids = tree.children()
        expanded = [v for v in range(len(tree)) if kids[v]]
        assert drafter.last_calls == max(tree.depths()) == len(expanded)  # one draft decode a level
        assert all(len(kids[v]) <= 2 and sum(bool(kids[c]) for c in kids[v]) <= 1 for v in expanded)
        assert (len(tree) - 1 > len(expanded)) == with_leaves
        if with_leaves:  # a runner-up is less likely than the winner beside it
            assert all(tree.q[kids[v][0]] >= tree.q[kids[v][1]] for v in expanded if len(kids[v]) == 2)
