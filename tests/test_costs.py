"""Costs the planner can trust, over synthetic noisy timings: calibration keeps the hardware's tile
pattern and drops noise, busy machines' curves are not cached, and a poisoned cache is re-measured."""

import types

import numpy as np
import pytest

from fakes import FakeContext, FakeModel
import specgen.costs.curve as costs
import specgen.costs.measure as costs_measure
import specgen.costs.timed as costs_timed
from specgen.costs.cache import load_cached, save_cached
from specgen.costs.curve import CostCurve
from specgen.costs.measure import fit, measure
from specgen.costs.timed import TimedContext
from specgen.drafting.value import best_subtree
from specgen.core.protocol import Batch


def patch_time(monkeypatch, clock) -> None:
    """The clock calibration and the timed contexts read."""
    for module in (costs_measure, costs_timed):
        monkeypatch.setattr(module, "time", clock)


def passes(true_cost, sizes, n=6, noise=0.02, spikes=(), seed=0):
    """n passes of timings: true cost times (1 + |N(0, noise)|) (noise only adds time), plus
    `spikes`: (size, pass, factor) bursts, or a factor below 1 for one lucky low reading."""
    rng = np.random.default_rng(seed)
    samples = {b: [true_cost(b) * (1 + abs(rng.normal(0, noise))) for _ in range(n)] for b in sizes}
    for b, i, factor in spikes:
        samples[b][i] *= factor
    return samples


def linear(b):
    return 0.010 * (1 + 0.25 * (b - 1))


def tiled(b):
    """AVX2-like quantized kernels: rows in tiles of 2, a leftover row on a slow path."""
    return 0.010 * (1 + 0.25 * (b - 1)) + (0.006 if b % 2 and b > 1 else 0.0)


SIZES = list(range(1, 17))


def test_a_tile_pattern_measured_in_every_pass_is_kept():
    curve = fit(passes(tiled, SIZES))
    assert curve.base(4) < curve.base(3) and curve.base(8) < curve.base(7)  # the hardware's dips
    for b in SIZES:
        assert curve.base(b) == pytest.approx(tiled(b), rel=0.06)


# gemma Q4_K_M on a 2-core AVX-512 EPYC, ms (logits on every row): multiples of 4 cost less than
# the sizes just below them.
GEMMA_Q4 = {1: 10.4, 2: 23.5, 3: 28.2, 4: 32.6, 5: 47.0, 6: 52.4, 7: 58.5, 8: 40.0, 9: 53.0, 10: 60.0, 11: 64.6,
            12: 49.6, 13: 65.7, 14: 71.3, 15: 75.0, 16: 54.4}


def test_a_tile_edge_survives_a_noisy_pass():
    """A burst of noise on an edge size in one pass of six: the edge stays (it erased gemma
    Q4_K_M's 12- and 16-row edges on a busy machine)."""
    samples = passes(lambda b: GEMMA_Q4[b] / 1000, SIZES, spikes=[(b, 2, 1.4) for b in (8, 12, 16)])
    curve = fit(samples)
    for edge in (8, 12, 16):
        assert curve.base(edge) < curve.base(edge - 1)
        assert curve.base(edge) == pytest.approx(GEMMA_Q4[edge] / 1000, rel=0.06)


def test_noise_cannot_make_a_bigger_batch_look_cheaper():
    """One lucky pass and drift make size 12 read cheaper than 11 (the low quantile alone says so):
    the fitted curve does not, so the planner does not buy the bigger tree that really costs more."""
    samples = passes(linear, SIZES, spikes=[(12, i, 0.86) for i in range(3)] + [(11, 0, 1.3)])
    low = {b: np.quantile(samples[b], 0.25) for b in SIZES}
    assert low[12] < low[11]  # what a plain low quantile would plan with
    curve = fit(samples)
    assert all(curve.base(b) < curve.base(b + 1) for b in range(1, 16))
    # An eleventh drafted node, unlikely to be accepted, after ten likely ones: with the raw
    # reading B = 12 looks cheaper than B = 11 and the planner takes it; not with the fitted curve.
    accept = [1.0] + [0.95] * 10 + [0.02]
    parents = list(range(-1, 11))
    raw = CostCurve(SIZES, [low[b] for b in SIZES])
    assert len(best_subtree(parents, accept, raw).nodes) == 11
    assert len(best_subtree(parents, accept, curve).nodes) < 11


def test_unmeasured_sizes_cost_the_next_measured_size():
    """Past 16 only some sizes are timed: an unmeasured one may sit past a tile edge, so it is never
    planned cheaper than the next measured size."""
    curve = fit(passes(linear, [1, 2, 4, 8, 16, 20, 24, 32], noise=0.0))
    assert curve.base(17) == curve.base(20) and curve.base(21) == curve.base(24)
    assert curve.base(40) > curve.base(32)


class SlowModelClock:
    """A model whose decodes take `cost(b)` seconds, on a fake clock that only they advance."""

    def __init__(self, cost):
        self.cost, self.now, self.timed = cost, 0.0, []

    def decode(self, ctx, spare, n_past, token, b, copy=True, outputs=None):
        self.timed.append(b)
        self.now += self.cost(b)
        return self.cost(b)


def slow_calibration(monkeypatch, cost):
    clock = SlowModelClock(cost)
    monkeypatch.setattr(costs_measure, "_timed_decode", clock.decode)
    patch_time(monkeypatch, types.SimpleNamespace(perf_counter=lambda: clock.now, time=lambda: 0.0))
    ctx = FakeContext(FakeModel(n_vocab=16), n_ctx=256, n_seq_max=4)
    ctx.n_batch = 128
    return clock, measure(ctx, 0, 7, budget_s=0.0)


def test_a_slow_models_calibration_still_times_the_largest_tree(monkeypatch):
    """gemma F32's shape (40 ms, then 4 ms a token): the first pass runs out of time at 32 tokens,
    but 80, auto's largest tree, is timed too, and sizes between are priced on the line between
    32 and 80 (at 32's cost per token, 48 were priced 8% dear and 80 15%: big trees never paid)."""
    def f32(b):
        return 0.040 + 0.004 * (b - 1)

    clock, curve = slow_calibration(monkeypatch, f32)
    assert 48 not in curve.sizes and 64 not in curve.sizes and curve.sizes[-1] == 80
    assert curve.linear_from == 32 and clock.timed.count(80) == 1 + curve.passes  # the warm-up, then each pass
    for b in (33, 40, 48, 64, 79, 80):
        assert curve.base(b) == pytest.approx(f32(b), rel=0.01)
    assert curve.base(17) == curve.base(20)  # below the cut, unmeasured sizes still cost the next measured one
    restored = CostCurve(**{k: v for k, v in curve.to_json().items()})
    assert restored.base(48) == pytest.approx(f32(48), rel=0.01)


def test_a_model_too_slow_for_its_largest_tree_in_one_pass_is_not_timed_there(monkeypatch):
    def huge(b):
        return 0.5 + 0.1 * (b - 1)

    clock, curve = slow_calibration(monkeypatch, huge)
    assert curve.sizes[-1] < 80 and curve.linear_from == 0 and clock.timed.count(80) == 1  # the warm-up alone
    assert curve.base(80) >= huge(80)  # past the end: no cheaper per token than the last size timed


def test_calibration_passes_visit_sizes_in_a_new_order_each_time():
    ctx = FakeContext(FakeModel(n_vocab=16), n_ctx=256, n_seq_max=4)
    curve = measure(ctx, 0, 7, sizes=(1, 2, 3, 4, 5, 6), budget_s=0.0)
    timed = [len(b) for b in ctx.calls[1:] if all(b.logits)]
    assert curve.passes == costs.MIN_PASSES and len(timed) == 6 * costs.MIN_PASSES
    orders = [tuple(timed[i:i + 6]) for i in range(6, len(timed), 6)]
    assert len(set(orders)) > 1 and all(sorted(o) == [1, 2, 3, 4, 5, 6] for o in orders)
    assert len(curve.spread) == 6 and curve.measured_at > 0


def test_other_processes_cpu_is_what_the_machine_used_less_what_we_used():
    from specgen.host import others_cores

    assert others_cores((0.0, 100.0, 10.0), (2.0, 104.0, 11.0)) == pytest.approx(1.5)  # 4 s used, 1 s ours
    assert others_cores((0.0, 100.0, 10.0), (0.01, 100.0, 10.0)) is None  # too short for clock ticks
    assert others_cores(None, (2.0, 104.0, 11.0)) is None


def test_a_child_process_we_ran_is_not_another_processs_load():
    """bench runs llama.cpp as a child: its CPU is ours, not a busy machine's. Read from our own
    counter (what others_cores subtracts), so that other processes' load on this machine, which
    the whole-machine count includes, cannot move the result."""
    import subprocess
    import sys

    from specgen.host import cpu_sample

    before = cpu_sample()
    if before is None:
        pytest.skip("no /proc/stat here")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    after = cpu_sample()
    assert after[2] - before[2] >= 0.55  # the child's 0.6 s of CPU, to clock ticks (this process only waited)


def test_a_curve_measured_on_a_busy_machine_is_not_kept(tmp_path):
    path = tmp_path / "curve.json"
    busy = fit(passes(linear, SIZES))
    busy.busy_cores = 1.2
    save_cached(path, busy)
    assert not path.exists()
    quiet = fit(passes(linear, SIZES))
    quiet.busy_cores, quiet.measured_at = 0.05, 1.0e9
    save_cached(path, quiet)
    loaded = load_cached(path)
    assert loaded.base(8) == pytest.approx(quiet.base(8)) and loaded.measured_at == 1.0e9
    assert loaded.spread == pytest.approx(quiet.spread) and loaded.between == "step"
    path.write_text(path.read_text().replace('"busy_cores": 0.05', '"busy_cores": 1.5'))
    assert load_cached(path) is None  # written busy by anyone: measured again


class Clock:
    """A fake perf_counter that a fake context advances by each decode's true cost."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class TimedFake(FakeContext):
    def __init__(self, clock, true_cost, **kw):
        super().__init__(FakeModel(n_vocab=16), **kw)
        self.clock, self.true_cost = clock, true_cost

    def decode(self, batch):
        live = (0,) in batch.seq_ids  # a step; calibration times the spare sequence
        self.clock.t += self.true_cost(len(batch), live)
        return super().decode(batch)


def step(ctx, n_past, b):
    """A verification-shaped batch of b tokens in sequence 0, then back to n_past (as after a step)."""
    batch = Batch()
    for j in range(b):
        batch.add(5, n_past + j, (0,), True)
    ctx.decode(batch)
    ctx.seq_rm(0, n_past, -1)


def test_a_poisoned_cache_is_re_measured_where_live_decodes_disagree(monkeypatch, tmp_path):
    """A curve cached with a false dip: its batch of 8 at half its cost (a noisy moment). Live
    decodes of 8 keep disagreeing with it relative to the others, so 8 is timed again (with B = 1
    and its reference size 7, in the spare sequence) and the corrected curve replaces the cache;
    the sizes that agree are left."""
    clock = Clock()
    patch_time(monkeypatch, types.SimpleNamespace(perf_counter=clock, time=lambda: 1.0e9))
    poisoned = CostCurve(SIZES, [linear(b) * (0.5 if b == 8 else 1.0) for b in SIZES])
    path = tmp_path / "curve.json"
    saved = []
    ctx = TimedFake(clock, lambda b, live: linear(b), n_ctx=1 << 16, n_seq_max=4)
    ctx.decode(Batch([3, 4], [0, 1], [(0,), (0,)], [False, True]))  # the prompt
    timed = TimedContext(ctx, poisoned, live=True, on_reshape=lambda c: (saved.append(c), save_cached(path, c)))
    for _ in range(80):  # a text long enough to afford the recheck within it (see the next test)
        for b in (1, 2, 8):
            step(timed, 2, b)
    assert poisoned.base(8) == pytest.approx(linear(8), rel=0.01)
    assert poisoned.base(2) == pytest.approx(linear(2)) and poisoned.base(6) == pytest.approx(linear(6))
    assert saved and load_cached(path).base(8) == pytest.approx(linear(8), rel=0.01)
    assert {s: cells for s, cells in ctx.kv.items() if cells} == {0: {0: 3, 1: 4}}  # spare sequence left empty
    assert not poisoned.suspects()


def test_a_recheck_waits_for_the_end_of_a_text_that_cannot_afford_it(monkeypatch):
    """Timed inside a step, a recheck lands on one prompt's decoding time (one of B = 48 took 1.3 s
    of a 128-token answer's 2.1 s): within a text it waits until it costs at most RECHECK_SHARE of
    that text's decoding so far, else it runs at the next clear(), before the next text."""
    clock = Clock()
    patch_time(monkeypatch, types.SimpleNamespace(perf_counter=clock, time=lambda: 1.0e9))
    poisoned = CostCurve(SIZES, [linear(b) * (0.5 if b == 8 else 1.0) for b in SIZES])
    ctx = TimedFake(clock, lambda b, live: linear(b), n_ctx=1 << 16, n_seq_max=4)
    ctx.decode(Batch([3, 4], [0, 1], [(0,), (0,)], [False, True]))  # the prompt
    timed = TimedContext(ctx, poisoned, live=True)
    for _ in range(12):  # 0.6 s of decoding; the recheck would take about 0.25 s
        for b in (1, 2, 8):
            step(timed, 2, b)
    assert poisoned.suspects() == [8] and not poisoned.rechecked
    during = timed.decode_s
    timed.clear()
    assert poisoned.rechecked == {8: 1} and poisoned.base(8) == pytest.approx(linear(8), rel=0.01)
    assert timed.decode_s == during and timed.measure_s > 0  # measuring, not decoding


def test_a_size_that_keeps_disagreeing_is_rechecked_only_so_often(monkeypatch):
    """A cost the curve cannot model (here: size 8 always slower live than when re-timed) must not
    keep the machine re-measuring."""
    clock = Clock()
    patch_time(monkeypatch, types.SimpleNamespace(perf_counter=clock, time=lambda: 1.0e9))
    ctx = TimedFake(clock, lambda b, live: linear(b) * (2.0 if live and b == 8 else 1.0), n_ctx=1 << 16, n_seq_max=4)
    curve = CostCurve(SIZES, [linear(b) for b in SIZES])
    timed = TimedContext(ctx, curve, live=True)
    for _ in range(100):
        for b in (1, 2, 8):  # 2 as well: with 8 the only batch, the batch level would absorb it
            step(timed, 0, b)
    assert curve.rechecked == {8: costs.MAX_RECHECKS}
    assert curve.base(8) == pytest.approx(linear(8), rel=0.01)  # what timing it found, each time


def test_the_guard_backs_off_when_plain_probes_are_faster_whatever_the_curve_says(monkeypatch):
    """The curve says one token costs 100 ms and a batch hardly more (a stale cache from a busy
    machine), so drafting long lookup chains looks like a 9x win; really a token costs 10 ms and
    each further row 15 ms, so every chain loses to plain decoding. Plain probes measure that, and
    the guard backs off; without them it would trust the curve and never back off."""
    import specgen.drafting.auto
    from specgen.core.engine import GenerationRequest, generate
    from specgen.drafting.methods import METHODS, DrafterInputs
    from specgen.drafting.guards import PlainSpeed
    from specgen.core.sampling import SamplingParams
    from specgen.core.stats import RunStats

    clock = Clock()
    monkeypatch.setattr(specgen.drafting.auto.time, "perf_counter", clock)
    target = FakeModel(n_vocab=16, sharpness=2.0, script={(3, 4): 5, (4, 5): 6, (5, 6): 3, (6, 3): 4})

    def run():
        ctx = TimedFake(clock, lambda b, live: 0.010 + 0.015 * (b - 1), n_ctx=4096, n_seq_max=32)
        ctx.model = target
        stale = CostCurve([1, 32], [0.100, 0.105])
        auto = METHODS["auto"].drafter(DrafterInputs(SamplingParams(), None, stale))
        for _ in generate(target, ctx, GenerationRequest([0, 3, 4, 5, 6, 3, 4], 2000, SamplingParams()), RunStats(), auto):
            pass
        return auto.choices

    choices = run()
    assert choices["probe"] > 0 and choices["guard"] >= choices["lookup"] > 0
    monkeypatch.setattr(PlainSpeed, "due", lambda self: False)
    assert run()["guard"] == 0


def test_a_step_that_drafts_nothing_measures_plain_decoding_and_no_probe_is_owed():
    """A plain step the planner chose tells what plain decoding takes, as a probe would: a probe (a
    plain step forced in place of a draft) is owed only after PROBE_EVERY speculative steps with no
    plain step between. On gemma Q4_K_M half of auto's steps draft nothing, and probes were still
    forced into loops the text was copying."""
    from specgen.drafting.methods import METHODS, DrafterInputs
    from specgen.drafting.tuning import PROBE_EVERY
    from specgen.core.sampling import SamplingParams
    from specgen.core.verify import Verdict

    steep = CostCurve([1, 8], [0.010, 0.080])  # a batch costs what its tokens do one by one
    auto = METHODS["auto"].drafter(DrafterInputs(SamplingParams(), costs=steep))
    auto.reset([0, 3, 4, 5, 3, 4, 5])
    auto.plain.since = PROBE_EVERY - 1  # as after 15 speculative steps
    auto.propose(16)
    assert auto.last_choice == "plain"
    auto.observe(Verdict([], [9]), [9])
    assert auto.plain.seconds is not None and auto.plain.since == 0


def test_plain_probes_grow_rarer_while_speculation_clearly_wins_and_return_when_it_does_not():
    from specgen.drafting.guards import PlainSpeed
    from specgen.drafting.tuning import MAX_PROBE_EVERY, PROBE_EVERY

    plain = PlainSpeed()
    intervals = []
    for tokens in (3, 3, 3, 3, 3, 3, 3, 1):  # 3 tokens per 20 ms step vs plain's 1 per 10 ms; then 1
        for _ in range(plain.interval):
            assert not plain.due()
            plain.observe_speculative(tokens, 0.020)
        assert plain.due()
        plain.observe_plain(0.010)
        intervals.append(plain.interval)
    assert intervals == [PROBE_EVERY, 32, 64, 128, MAX_PROBE_EVERY, MAX_PROBE_EVERY, MAX_PROBE_EVERY, PROBE_EVERY]
    assert plain.rate(modelled=1.0) == pytest.approx(100.0)


def test_each_thread_count_keeps_its_own_shape():
    """When a busy machine takes a core, the context drops to one thread and batches get dearer
    relative to one token; the curve corrected for that is set aside, not mixed into the
    two-thread shape, when the core comes back."""
    curve = CostCurve(SIZES, [linear(b) for b in SIZES])
    curve.threads = 2
    curve.for_threads(1)
    assert curve.base(8) == pytest.approx(linear(8)) and curve.suspects() == []
    curve.reshape({1: [0.010] * 4, 8: [0.060] * 4})  # one thread: a batch of 8 costs 6x one token
    assert curve.base(8) == pytest.approx(0.060)
    curve.for_threads(2)
    assert curve.base(8) == pytest.approx(linear(8))
    curve.for_threads(1)
    assert curve.base(8) == pytest.approx(0.060) and curve.rechecked == {8: 1}


def test_a_thread_count_never_timed_gets_a_coarse_shape_at_once(monkeypatch):
    """Another process takes a core and the context drops to one thread: batches now cost far
    more relative to one token. A few sizes are timed at once and the whole shape rescaled from
    them, instead of planning with the two-thread shape until each size has been seen to lose."""
    clock = Clock()
    patch_time(monkeypatch, types.SimpleNamespace(perf_counter=clock, time=lambda: 1.0e9))
    one_thread = lambda b: 0.010 * (1 + 0.6 * (b - 1))
    ctx = TimedFake(clock, lambda b, live: linear(b) if ctx.n_threads == 2 else one_thread(b), n_ctx=1 << 16, n_seq_max=4)
    ctx.n_threads = 2
    curve = CostCurve(SIZES, [linear(b) for b in SIZES])
    timed = TimedContext(ctx, curve, live=True)
    step(timed, 0, 1)
    assert curve.base(8) == pytest.approx(linear(8))
    ctx.n_threads = 1
    step(timed, 0, 1)
    for b in (2, 4, 6, 8, 12, 16):
        assert curve.base(b) / curve.base(1) == pytest.approx(one_thread(b) / one_thread(1), rel=0.05), b
    ctx.n_threads = 2  # the core is back: the two-thread shape, as it was
    step(timed, 0, 1)
    assert curve.base(8) == pytest.approx(linear(8))


def test_rechecks_take_a_bounded_share_of_the_decoding_time(monkeypatch):
    """Many sizes keep disagreeing with the curve live (a cost it cannot model): re-timing them
    all, again and again, would cost a short run more than a wrong size does. After the first
    recheck, each one waits until measuring so far is at most RECHECK_SHARE of the decode time."""
    clock = Clock()
    patch_time(monkeypatch, types.SimpleNamespace(perf_counter=clock, time=lambda: 1.0e9))
    monkeypatch.setattr(costs_timed, "RECHECK_SHARE", 0.1)
    ctx = TimedFake(clock, lambda b, live: linear(b) * (2.0 if live and 5 <= b <= 12 else 1.0), n_ctx=1 << 16,
                    n_seq_max=4)
    curve = CostCurve(SIZES, [linear(b) for b in SIZES])
    timed = TimedContext(ctx, curve, live=True)
    started = []  # (measuring so far, decoding so far) as each recheck began
    timed_passes = timed._timed_passes
    monkeypatch.setattr(timed, "_timed_passes", lambda *a: (started.append((timed.measure_s, timed.decode_s)),
                                                            timed_passes(*a))[1])
    for _ in range(40):
        for b in range(1, 13):
            step(timed, 0, b)
    assert len(started) > 1 and started[0][0] == 0.0
    assert all(measured <= 0.1 * decoded for measured, decoded in started[1:])


def test_one_token_is_never_a_suspect():
    """B = 1 is the level the other sizes are timed against: re-timing it cannot settle its drift,
    so a suspect B = 1 was re-timed before every decode."""
    curve = CostCurve(SIZES, [linear(b) for b in SIZES])
    for _ in range(50):
        curve.observe(1, 3 * linear(1))
        curve.observe(8, linear(8))
    assert 1 not in curve.suspects()


def quads(b):
    """AVX-512-like: rows in tiles of 4, where a part-filled tile costs more than a full one."""
    return 0.010 * (1 + 0.25 * (b - 1)) + (0.02 if b > 4 and b % 4 else 0.0)


def test_a_batch_past_a_tile_edge_is_priced_and_decoded_at_the_next_edge():
    """gemma Q4_K_M on AVX-512: 8 rows with logits take 38 ms, 5-7 take 47-56. A batch of 6 is
    planned at 8's cost and decoded as 8 rows, the 2 extra in the spare sequence: its own rows'
    logits are what they would be alone, and the spare sequence is empty again after."""
    curve = CostCurve(SIZES, [quads(b) for b in SIZES], between="step", per_token_one_output=0.001, pads=True)
    assert [curve.padded(b) for b in (1, 2, 4, 5, 6, 7, 8, 9, 16)] == [1, 2, 4, 8, 8, 8, 8, 12, 16]
    assert curve(6) == curve(8) < quads(6) and curve(4) == pytest.approx(quads(4))
    assert curve(6, outputs=1) < curve(6)  # a one-output decode (catching up on text) is not padded

    model = FakeModel(n_vocab=16)
    ctx, alone = FakeContext(model, n_seq_max=4), FakeContext(model, n_seq_max=4)
    padded = costs_timed.CostAwareContext(ctx, curve)
    batch = Batch()
    for j, tok in enumerate([3, 4, 5, 6, 7, 8]):
        batch.add(tok, j, (0,), True)
    out = padded.decode(batch)
    assert len(ctx.calls[-1]) == 8 and {ids for ids in ctx.calls[-1].seq_ids[6:]} == {(3,)}
    assert np.array_equal(out, alone.decode(batch)) and not ctx.kv.get(3)
    ctx.seq_rm(0, -1, -1)
    batch.seq_ids = [(0, 3)] * 6  # a tree branch holds the spare sequence: no padding then
    padded.decode(batch)
    assert len(ctx.calls[-1]) == 6


def test_a_context_whose_branches_outlive_a_decode_is_not_padded_nor_priced_padded():
    """A draft's branches stay in their sequences across its decodes, the spare one among them:
    its context does not pad, and its curve prices each size as measured."""
    curve = CostCurve(SIZES, [quads(b) for b in SIZES], between="step")
    ctx = FakeContext(FakeModel(n_vocab=16), n_seq_max=4)
    timed = TimedContext(ctx, curve)  # not live: a draft's
    batch = Batch()
    for j in range(6):
        batch.add(3 + j, j, (0,), True)
    timed.decode(batch)
    assert len(ctx.calls[-1]) == 6 and curve.padded(6) == 6 and curve.at(6, 0) == pytest.approx(quads(6))


def test_padded_decodes_are_observed_at_the_size_decoded(monkeypatch):
    clock = Clock()
    patch_time(monkeypatch, types.SimpleNamespace(perf_counter=clock, time=lambda: 1.0e9))
    curve = CostCurve(SIZES, [quads(b) for b in SIZES], between="step")
    ctx = TimedFake(clock, lambda b, live: quads(b), n_ctx=1 << 16, n_seq_max=4)
    timed = TimedContext(ctx, curve, live=True)
    for _ in range(20):
        step(timed, 0, 6)
    assert len(ctx.calls[-1]) == 8 and curve.scale == pytest.approx(1.0) and not curve.suspects()


def test_a_recheck_that_finds_the_curve_about_right_leaves_it():
    """Re-timings (4 passes) are noisier than the calibration: one that lands within the shape
    tolerance of the curve keeps the curve's cost; one far off replaces it."""
    curve = CostCurve(SIZES, [quads(b) for b in SIZES], between="step")
    curve.reshape({1: [0.010] * 4, 8: [quads(8) * 1.2] * 4, 12: [quads(12) * 2.0] * 4})
    assert curve.base(8) == pytest.approx(quads(8)) and curve.base(12) == pytest.approx(2.0 * quads(12))
    assert curve.rechecked == {8: 1, 12: 1}


def test_a_recheck_while_the_sizes_move_apart_changes_nothing():
    """Noise on a shared machine is not one factor: while another tenant takes memory bandwidth,
    B = 1 (memory-bound) runs 45% slower and bigger batches hardly slower. Re-costed against B = 1
    alone, a batch of 11 would look a third cheaper than it is (gemma F32's cached curve got
    c(11) = 33 ms where it costs 48); its reference size, timed in the same passes, shows the
    moment is off, and the curve keeps its cost."""
    curve = CostCurve(SIZES, [quads(b) for b in SIZES], between="step")
    contended = {1: [0.010 * 1.45] * 4, 8: [quads(8)] * 4, 12: [quads(12)] * 4}
    curve.reshape(contended, {12: 8})
    assert curve.base(12) == pytest.approx(quads(12)) and curve.rechecked == {12: 1}
    alone = CostCurve(SIZES, [quads(b) for b in SIZES], between="step")
    alone.reshape({1: contended[1], 12: contended[12]})  # no reference: what the recheck used to do
    assert alone.base(12) == pytest.approx(quads(12) / 1.45)
    quiet = CostCurve(SIZES, [quads(b) * (2.0 if b == 12 else 1.0) for b in SIZES], between="step")
    quiet.reshape({1: [0.010] * 4, 8: [quads(8)] * 4, 12: [quads(12)] * 4}, {12: 8})
    assert quiet.base(12) == pytest.approx(quads(12))  # the reference agrees: re-costed


@pytest.mark.real
def test_the_calibration_cache_tells_two_builds_with_the_same_system_info_apart():
    """A rebuilt library whose system info reads the same (faster kernels under the same names) is
    another build: curves cached for the old one are not read for it. The key holds the loaded
    libraries' files."""
    from dataclasses import replace

    from specgen.llama import tools
    from specgen.models.curves import build_key

    info = tools.build_info()
    assert "libllama" in info.library and "libggml-cpu" in info.library
    rebuilt = replace(info, library=info.library.replace(":", ":1", 1))
    assert build_key(rebuilt) != build_key(info) and build_key(info) == build_key(tools.build_info())


@pytest.mark.real
def test_timings_at_a_texts_start_leave_its_prompt_where_plain_decodings_starts(monkeypatch, gemma):
    """clear() re-times suspect sizes in the spare sequence before the next prompt; those decodes
    take cells, and specgen's build never moves the cache's head back. Left so, auto's prompt was
    read from a later cell than plain decoding's, and a prompt of more rows than specgen's own
    attention takes goes through ggml's, whose sums depend on where the cells lie: gemma's greedy
    auto then wrote other text than plain (seen under load, when rechecks run). Now the prompt
    starts at cell 0 either way, and its logits are plain's bit for bit."""
    import json
    from pathlib import Path

    from specgen.core.kv import prefill

    monkeypatch.setattr(CostCurve, "suspects", lambda self: [4, 8])
    lines = (Path(__file__).parent.parent / "specgen" / "suites" / "builtin.jsonl").read_text().splitlines()
    text = next(q for q in map(json.loads, lines) if q["question_id"] == "summarization-2")["turns"][0]
    tokens = gemma.tokenize(text)
    assert len(tokens) > 128  # read in a decode of more rows than specgen's attention takes
    rows = []
    for timed in (False, True):
        ctx = gemma.new_context(1024, n_seq_max=8, n_threads=1, n_outputs=16)
        curve = CostCurve(SIZES, [linear(b) for b in SIZES])
        live = TimedContext(ctx, curve, live=True) if timed else ctx
        prefill(live, tokens)
        assert ctx.cells_written == len(tokens) - 1  # the prompt from cell 0, nothing before it
        if timed:
            assert curve.rechecked  # the timings ran
        rows.append(np.array(live.decode(Batch([tokens[-1]], [len(tokens) - 1], [(0,)], [True]))[0], copy=True))
    assert np.array_equal(rows[0], rows[1])


def test_timings_and_padding_never_take_the_head_past_the_caches_end(monkeypatch):
    """specgen's build never moves the KV head back, so a cell taken is taken until the text is read
    anew (core/kv.py reread): within a text, timings and padding rows that would take the head past
    the cache's end are left for the next clear() (where the cache is empty), not made."""
    clock = Clock()
    patch_time(monkeypatch, types.SimpleNamespace(perf_counter=clock, time=lambda: 1.0e9))
    ctx = TimedFake(clock, lambda b, live: linear(b), n_ctx=64, n_seq_max=4)
    curve = CostCurve(SIZES, [linear(b) for b in SIZES])
    monkeypatch.setattr(CostCurve, "suspects", lambda self: [8])
    monkeypatch.setattr(CostCurve, "padded", lambda self, b: 4 if b < 4 else b)
    timed = TimedContext(ctx, curve, live=True)
    ctx.decode(Batch(list(range(40)), list(range(40)), [(0,)] * 40, [False] * 39 + [True]))  # the prompt
    timed.decode_s = 1.0  # decoding enough for a recheck to be affordable
    step(timed, 40, 1)
    assert curve.rechecked == {} and ctx.cells_written <= ctx.n_ctx  # refused: 3 x (1 + 7 + 8) rows
    ctx.cells_written = ctx.n_ctx - 2
    step(timed, 40, 1)
    assert ctx.cells_written == ctx.n_ctx - 1  # one row, unpadded
    timed.clear()
    assert curve.rechecked == {8: 1}  # made at the text's end, in an empty cache
