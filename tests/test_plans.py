"""auto's plans as values: pricing (the measured overhead of a step) and guards per kind of plan,
over synthetic numbers and the fake backend."""

import pytest

from fakes import FakeContext, FakeModel, NoisyDraft
from specgen.core.sampling import SamplingParams
from specgen.core.verify import Verdict
from specgen.costs.curve import CostCurve
from specgen.drafting.guards import KindGuards, Overhead
from specgen.drafting.methods import METHODS, DrafterInputs
from specgen.drafting.plans import LOOKUP, PLAIN, StepPlan, plain_plan
from specgen.drafting.value import best_subtree

FLAT = CostCurve([1, 32], [0.010, 0.012])


def test_overhead_is_a_line_in_the_drafted_nodes_and_zero_until_measured():
    overhead = Overhead()
    assert overhead.line() == (0.0, 0.0)
    assert overhead.priced(FLAT.given(0))(5) == FLAT(5)
    for _ in range(60):
        for n in (0, 4, 16):
            overhead.observe(n, 0.0005 + 0.0001 * n, decode_s=0.010)
    fixed, per_node = overhead.line()
    assert fixed == pytest.approx(0.0005, rel=0.05) and per_node == pytest.approx(0.0001, rel=0.05)
    priced = overhead.priced(FLAT.given(0))
    assert priced(9) == pytest.approx(FLAT(9) + 0.0005 + 8 * 0.0001, rel=0.02)


def test_one_hiccup_moves_the_overhead_by_at_most_one_decode():
    overhead = Overhead()
    for _ in range(30):
        overhead.observe(0, 0.0005, decode_s=0.010)
    overhead.observe(0, 0.600, decode_s=0.010)  # a 600 ms stall
    assert overhead.line()[0] < 0.0005 + 0.2 * 0.010 + 1e-9


def test_a_dear_verification_buys_smaller_trees():
    """On a flat curve a chain of likely nodes pays to a long depth; the same chain, when every
    verified node costs a measured 2 ms beyond the decode, stops much sooner."""
    parents, accept = list(range(-1, 30)), [1.0] + [0.9] * 30
    free = best_subtree(parents, accept, FLAT.given(0))
    overhead = Overhead()
    for _ in range(50):
        for n in (0, 8):
            overhead.observe(n, 0.002 * n, decode_s=0.010)
    dear = best_subtree(parents, accept, overhead.priced(FLAT.given(0)))
    assert len(dear.nodes) < len(free.nodes) and dear.rate < free.rate


def test_plans_are_compared_by_rate_times_trust():
    plain = plain_plan(FLAT.given(0))
    lookup = StepPlan(LOOKUP, 2.0, FLAT(3))
    trusted_less = StepPlan("draft", 2.2, FLAT(3), draft_len=2, trust=0.5)
    assert max([plain, lookup, trusted_less], key=lambda p: p.score) is lookup
    assert plain.kind == PLAIN and plain.rate == pytest.approx(1 / FLAT(1))


def test_guards_bench_one_kind_and_let_the_others_run():
    guards = KindGuards()
    for _ in range(32):
        guards.record("lookup", tokens=1, seconds=0.02, plain_rate=100.0)  # 50 tok/s vs plain 100
        guards.record("draft", tokens=3, seconds=0.02, plain_rate=100.0)  # 150 tok/s
    assert guards.allowed(("lookup", "draft")) == {"draft"}


def test_a_benched_lookup_leaves_the_draft_running():
    """Lookup's losses bench lookup only: a draft that wins goes on (one global guard benched both)."""
    target = FakeModel(n_vocab=16, sharpness=2.0)
    dctx = FakeContext(NoisyDraft(target, noise=0.3), n_ctx=512, n_seq_max=64)
    inputs = DrafterInputs(SamplingParams(), dctx, FLAT, CostCurve([1, 8], [0.0005, 0.0006]), reproducible=True)
    auto = METHODS["auto"].drafter(inputs)
    auto.reset([0, 9, 8, 7, 9, 8, 7, 9, 8])  # lookup has a continuation to offer
    auto.guards.of("lookup").plain_left = 5
    auto.propose(16)
    assert auto.last_choice == "staged"


def test_auto_reads_no_clock_for_its_overhead_when_reproducible():
    inputs = DrafterInputs(SamplingParams(), None, FLAT, None, reproducible=True)
    auto = METHODS["auto"].drafter(inputs)
    auto.reset([0, 3, 4, 5, 3, 4, 5, 3, 4])
    for tok in (5, 3, 4, 5, 3, 4):
        auto.propose(8)
        auto.observe(Verdict([], [tok]), [tok])
    assert auto.overhead.line() == (0.0, 0.0)
