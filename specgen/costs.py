"""Measured decode costs c(B): seconds for one llama_decode of B tokens, per model and machine.

Measured at start-up in a spare sequence id (then removed), in passes of random size order, and
fitted so that noise cannot make a bigger batch look cheaper while the hardware's tile pattern
stays (fit()); cached per (model file, llama.cpp build, threads, context size, CPU) under
$SPECGEN_HOME/calibration, unless other processes kept the machine busy meanwhile. Live decodes
keep the level current (two scales: one token, memory-bound, and batches; machines get busy, and
a neighbour's memory traffic slows the first far more) and re-measure sizes whose shape they
disagree with. Attention makes a decode of B tokens after L others cost about
c(B) + gamma * B * L: gamma is measured once, at the first long prompt, and cached too. c(B)
asks for logits on every row; a decode that asks for one row's logits (catching a draft up on
committed text) costs about c(1) plus a per-token cost of the network without its output layer,
timed with the curve: with a large vocabulary that is several times cheaper.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .methods import AUTO_NODES
from .protocol import Batch, Context

# Every size up to 16: quantized kernels process rows in tiles (on these CPUs 8 rows cost less
# than 5-7 for gemma Q4_K_M), so the curve is not smooth enough to interpolate there. Up to 80,
# auto's largest tree (methods.AUTO_NODES): beyond the last measured size nothing is known, and gemma
# Q4_K_M's 65 rows took 186 ms where 64 took 170 (the 65th row's output layer runs apart from the
# tiles), against 164.5 extrapolated from 48 and 64: loop chains of 65 were chosen for it.
BATCH_SIZES = tuple(range(1, 17)) + (20, 24, 32, 48, 64, AUTO_NODES)
EMA = 0.1  # weight of one live measurement in the running estimate
# One decode is one sample, and machines hiccup (page faults, a neighbour's burst): bench's first
# gemma F32 batch of 2 once took 635 ms against 47, and read through a batch's small share of
# its own level that one decode put the batch level at 5.4x, so auto planned with batches 5x
# too dear for the rest of that prompt and most of the next. A live decode moves a level as if it
# were at most this many times the level it found: a single outlier moves it by at most
# EMA * (OUTLIER - 1), and a real change still gets there (a 3x slowdown within 30 decodes).
OUTLIER = 2.0
COUPLING = 0.1  # a one-token decode's weight in the batch level, relative to a batch's (see observe)
SHAPE_EMA, SHAPE_MIN_DECODES, SHAPE_TOLERANCE, MAX_RECHECKS = 0.2, 8, 1.25, 2  # see CostCurve.suspects
COARSE_SIZES, COARSE_PASSES = (2, 4, 8, 16), 3  # see TimedContext.retime
# Re-timing suspect sizes may take at most this share of the time live decodes took (after the
# first recheck): in a short run, measuring must not cost more than a wrong size would. Within a
# text, a recheck also waits until it costs no more than this share of that text's own decoding,
# else for the text's end (the next clear(), timed as the next prompt's set-up): timed inside a
# step, one recheck of B = 48 took 1.3 s of a 128-token answer's 2.1 s of decoding, and ten of them
# a tenth of a 30-prompt bench's, on whichever prompts they fell.
RECHECK_SHARE = 0.1
Cost = Callable[[int], float]  # seconds for a decode of B tokens


@dataclass
class CostCurve:
    """c(B): the calibrated shape (between and beyond the measured sizes: see _interpolate) times a level
    that live decodes keep current (level()). Only the levels move online, not the shape: a plain
    run observes B = 1 alone, and must not make c(1) cheaper than a stale c(2) (that would make
    speculation look costly)."""

    sizes: list[int]
    seconds: list[float]
    source: str = "measured"
    scale: float = 1.0  # the level of one-token decodes (memory-bound: a neighbour's memory traffic moves it)
    batch_scale: float = 1.0  # the level of batches (compute: moves less; see level())
    per_context: float = 0.0  # gamma: seconds per batch token per token of context
    per_context_at: int = 0  # the context length gamma was measured at (0: not yet)
    per_token_one_output: float = 0.0  # seconds each token past the first adds to a one-output decode
    cache_path: Path | None = None  # where the calibration cache keeps this curve
    # How it was measured (fit()): per size, how much the passes spread and the raw low quantile
    # (before noise dips were removed); passes; other processes' CPU use meanwhile; when.
    spread: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    passes: int = 0
    busy_cores: float | None = None
    measured_at: float = 0.0
    # Between measured sizes: "linear", or "step" (a measured curve: the next measured size's
    # cost, since an unmeasured size may sit past a tile edge; never cheaper than it looks)
    between: str = "linear"
    # A slow model's first calibration pass ran out of time at this size (0: it did not), and only
    # the largest size was timed past it: between them, linear (see measure()), not "step".
    linear_from: int = 0
    _table: list[float] = field(default_factory=list, repr=False)  # base(b) for b < TABLE
    _padded: list[int] = field(default_factory=list, repr=False)  # padded(b) for b < TABLE
    _shares: list[float] = field(default_factory=list, repr=False)  # (c(1) / c(b))^2 for b < TABLE: see _one_share
    pads: bool = False  # whether its context pads batches (set by CostAwareContext); if not, padded(b) = b
    # Per size, live decodes' log(seconds / curve) relative to its level (an EMA) and how many
    # there were: a size far off the others is a shape the curve has wrong (suspects()).
    _drift: dict[int, list[float]] = field(default_factory=dict, repr=False)
    rechecked: dict[int, int] = field(default_factory=dict, repr=False)
    threads: int = 0  # the thread count the shape is for (0: unknown; see for_threads)
    untimed_threads: bool = False  # the shape was carried over from another thread count
    _shapes: dict[int, tuple] = field(default_factory=dict, repr=False)  # other thread counts' shapes

    TABLE = 129  # the planner asks for c(b) many times a step: interpolate once

    def __post_init__(self) -> None:
        self._rebuild()

    def _rebuild(self) -> None:
        self._table = [0.0] + [self._interpolate(b) for b in range(1, self.TABLE)]
        # The cheapest size at or above each b (the smallest of equals): past a tile edge a batch
        # padded to the next edge costs less than the batch itself (gemma Q4_K_M on AVX-512: 8 rows
        # with logits take 38 ms, 7 take 56).
        self._padded = [0] * self.TABLE
        best = self.TABLE - 1
        for b in range(self.TABLE - 1, 0, -1):
            if self._table[b] <= self._table[best]:
                best = b
            self._padded[b] = best
        self._shares = [1.0] + [self._share_of(b) for b in range(1, self.TABLE)]

    def base(self, b: int) -> float:
        return self._table[b] if b < self.TABLE else self._interpolate(b)

    def _interpolate(self, b: int) -> float:
        xs, ys = self.sizes, self.seconds
        if b >= xs[-1] and self.between == "step" and xs[-1] > 1:
            # Past a measured curve's end: no cheaper per token than its last size (no tile
            # pattern can be known there).
            return ys[-1] * b / xs[-1]
        if b >= xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else ys[-1]
            return ys[-1] + max(0.0, slope) * (b - xs[-1])
        if self.between == "step" and not 0 < self.linear_from < b:
            return ys[bisect.bisect_left(xs, b)]
        return float(np.interp(b, xs, ys))

    def padded(self, b: int) -> int:
        """The size a decode of b tokens, all with logits, is cheapest at: b, or a bigger batch
        whose extra rows are padding (CostAwareContext adds them)."""
        return self._padded[b] if 0 < b < self.TABLE and self.pads else b

    def at(self, b: int, context: int, outputs: int | None = None) -> float:
        """Unscaled seconds for B tokens after `context` tokens, `outputs` of them with logits
        (default: all, as the curve was timed, at the padded size; in between, linear from one
        output to all). Padding rows sit in a sequence of their own: they add no context term."""
        seconds = self.base(self.padded(b))
        if outputs is not None and outputs < b > 1 and self.per_token_one_output > 0:
            one = min(seconds, self.base(1) + (b - 1) * self.per_token_one_output)
            seconds = one + (seconds - one) * (max(1, outputs) - 1) / (b - 1)
        return seconds + self.per_context * b * context

    def __call__(self, b: int, context: int = 0, outputs: int | None = None) -> float:
        """Seconds, on this machine now, for a decode of b tokens after `context` others."""
        return self.level(b) * self.at(b, context, outputs) if b > 0 else 0.0

    def read(self, b: int, context: int) -> float:
        """Seconds to evaluate the last b of `context` tokens with one output row (a draft catching
        up on text; a prompt): each attends, on average, to half of their span."""
        return self.level(b) * self.at(b, max(0, context - b // 2), outputs=1) if b > 0 else 0.0

    def _one_share(self, b: int) -> float:
        """How much of a b-token decode moves with the one-token level rather than the batch level:
        (c(1) / c(b))^2, 1 at b = 1, falling as the batch's compute outgrows the weights' reading.
        Fitted to gemma F32 while a neighbour took memory bandwidth (B = 1 1.49x its calibrated
        cost; B = 2, 4, 8, 16: 1.21, 1.10, 1.01, 0.87x; this predicts 1.20, 1.10, 1.04, 0.99)."""
        if b <= 1:
            return 1.0
        p = self.padded(b)
        return self._shares[p] if p < self.TABLE else self._share_of(p)

    def _share_of(self, size: int) -> float:
        """_one_share's formula for a decode of `size` rows (tabled below TABLE)."""
        return min(1.0, self.base(1) / self.base(size)) ** 2

    def level(self, b: int) -> float:
        """The scale for a decode of b tokens: the one-token level and the batch level, mixed."""
        w = self._one_share(b)
        return w * self.scale + (1 - w) * self.batch_scale

    def given(self, context: int) -> "Cost":
        """c(B) after `context` tokens, as the one-argument cost the planner's functions take."""
        return lambda b: self(b, context)

    def observe(self, b: int, seconds: float, context: int = 0, outputs: int | None = None) -> None:
        """Fold a real decode into its level (machines get busy), and into the size's drift from
        the others: decodes with logits on every row, as the shape was timed. Decodes with fewer
        output rows (a draft catching up, a prompt) move neither."""
        if outputs is not None and outputs < b:
            return
        level = self.level(b)
        ratio = bounded(seconds / self.at(b, context), level)
        drift = self._drift.setdefault(b, [0.0, 0])
        drift[0] += (math.log(ratio / level) - drift[0]) * (SHAPE_EMA if drift[1] else 1.0)
        drift[1] += 1
        w = self._one_share(b)
        if w > 0.95:  # one token (or a flat curve, as on a GPU: one level for all)
            self.scale = (1 - EMA) * self.scale + EMA * ratio
            # Weakly, the batch level too: a run that stopped drafting (batches looked dear) sees
            # no batches that could show it they got cheaper.
            self.batch_scale += (ratio - self.batch_scale) * EMA * COUPLING
        else:  # the batch level this decode implies, given the one-token level's share of it
            implied = bounded((ratio - w * self.scale) / (1 - w), self.batch_scale)
            self.batch_scale = (1 - EMA) * self.batch_scale + EMA * implied

    def suspects(self) -> list[int]:
        """Sizes whose live decodes keep disagreeing with the curve's shape (not its level): at
        least SHAPE_MIN_DECODES of them, off by more than SHAPE_TOLERANCE, rechecked at most
        MAX_RECHECKS times each (a cost the curve cannot model, e.g. attention at a long context,
        must not keep the machine re-measuring). Never B = 1: it is the level other sizes are
        timed against, so re-timing it cannot settle its drift (it was re-timed at every decode)."""
        return sorted(b for b, (log_ratio, n) in self._drift.items()
                      if b > 1 and n >= SHAPE_MIN_DECODES and abs(log_ratio) > math.log(SHAPE_TOLERANCE)
                      and self.rechecked.get(b, 0) < MAX_RECHECKS)

    def for_threads(self, threads: int) -> None:
        """The context now runs `threads` threads (another process took cores): the shape changes
        with them (one thread makes a batch of 8 gemma Q4_K_M tokens cost 6x one token, not 3.7x).
        Keep each thread count's shape; a count not seen yet starts from the current shape, to be
        rescaled from a few sizes timed at once (TimedContext), with every size open to rechecks
        again, so live decodes correct the rest (suspects())."""
        if threads == self.threads:
            return
        if self.threads:
            self._shapes[self.threads] = (self.sizes, self.seconds, self._drift, self.rechecked)
        self.untimed_threads = threads not in self._shapes and bool(self.threads)
        self.sizes, self.seconds, self._drift, self.rechecked = self._shapes.pop(
            threads, (list(self.sizes), list(self.seconds), {}, {}))
        self.threads = threads
        self._rebuild()

    def rescale(self, samples: dict[int, list[float]]) -> None:
        """A coarse new shape (samples: a few sizes, B = 1 among them, timed now with this thread
        count): every size's cost relative to one token is scaled by how much the nearest timed
        sizes' relative costs changed (log-linear in between), keeping the tile pattern, and c(1)
        stays the level (the scale follows the machine)."""
        one = float(np.quantile(samples[1], LOW_QUANTILE))
        timed = sorted(samples)
        change = [float(np.quantile(samples[b], LOW_QUANTILE)) / one / (self.base(b) / self.base(1)) for b in timed]
        log_change = np.interp(np.log(self.sizes), np.log(timed), np.log(change))
        self.seconds = [self.seconds[0]] + [s * float(np.exp(c)) for s, c in zip(self.seconds[1:], log_change[1:])]
        self.untimed_threads = False
        self._rebuild()

    def reshape(self, samples: dict[int, list[float]], references: dict[int, int] | None = None) -> None:
        """New costs for some sizes, from timings now (samples must include B = 1): each size's
        ratio to one token, times the curve's one-token cost, so the level stays the curve's. A
        size the timings find within SHAPE_TOLERANCE of the curve keeps its cost: its live drift
        came from elsewhere (attention at a long context, a noisy stretch), and a few re-timings
        are noisier than the calibration's passes (one moved gemma Q4_K_M's B=8 from 38 to 46 ms).

        `references` (size -> a calibrated size timed in the same passes): a size is re-costed only
        if its reference's ratio to one token is still the curve's, within SHAPE_TOLERANCE. On a
        shared machine noise is not one factor for all sizes: while another tenant took memory
        bandwidth, B = 1 (memory-bound) ran 45% slower and B = 11 5% slower, and re-costed against
        B = 1 alone, gemma F32's c(11) became 33 ms where it costs 48 (and was cached)."""
        one = float(np.quantile(samples[1], LOW_QUANTILE))
        costs = dict(zip(self.sizes, self.seconds))
        ratio = {b: self.seconds[0] * float(np.quantile(t, LOW_QUANTILE)) / one for b, t in samples.items()}
        references = references or {}
        for b in samples:
            if b == 1 or b in references.values():
                continue
            ref = references.get(b)
            self.rechecked[b] = self.rechecked.get(b, 0) + 1
            self._drift.pop(b, None)
            if ref is not None and abs(math.log(ratio[ref] / self.base(ref))) > math.log(SHAPE_TOLERANCE):
                continue  # the sizes moved apart: this moment, not the curve, is off
            if b not in costs or abs(math.log(ratio[b] / costs[b])) > math.log(SHAPE_TOLERANCE):
                costs[b] = ratio[b]
        self.sizes, self.seconds = sorted(costs), [costs[b] for b in sorted(costs)]
        self.spread = self.raw = []  # no longer one measurement's
        self._rebuild()

    def reference(self, b: int, exclude: list[int]) -> int | None:
        """The calibrated size nearest below b (else above) that is neither 1 nor in `exclude`:
        what a re-timing of b is checked against (reshape)."""
        below = [a for a in self.sizes if 1 < a < b and a not in exclude]
        above = [a for a in self.sizes if a > b and a not in exclude]
        return below[-1] if below else above[0] if above else None

    def relative(self) -> list[float]:
        return [s / self.seconds[0] for s in self.seconds]

    @property
    def busy(self) -> bool:
        """Measured while other processes used more than BUSY_CORES: not the machine's truth."""
        return is_busy(self.busy_cores)

    @property
    def noise(self) -> float:
        """The median spread over sizes (0 when unknown)."""
        return float(np.median(self.spread)) if self.spread else 0.0

    def to_json(self) -> dict:
        return {"sizes": self.sizes, "seconds": self.seconds, "per_context": self.per_context,
                "per_context_at": self.per_context_at, "per_token_one_output": self.per_token_one_output,
                "spread": self.spread, "raw": self.raw, "passes": self.passes, "busy_cores": self.busy_cores,
                "measured_at": self.measured_at, "between": self.between, "linear_from": self.linear_from}


# Calibration: every size timed in several passes, sizes in a fresh random order each pass, so a
# burst of noise or a slow drift of the machine's speed lands on different sizes each time.
MIN_PASSES, MAX_PASSES = 4, 8
MEASURE_BUDGET_S = 4.0  # a first run's calibration (`specgen calibrate` allows more)
PASS_BUDGET_S = 1.5  # the first pass stops at the size that takes it past this (big models)
LOW_QUANTILE = 0.25  # a size's cost: noise only ever adds time, so a low quantile of its passes
# A bigger batch that measured cheaper than a smaller one is kept as the hardware's (quantized
# kernels tile rows: on AVX-512 8 rows of gemma Q4_K_M cost less than 5, on AVX2 4 less than 3)
# only when every pass but one agrees (a one-sided sign test at this level: 5 of 6, 7 of 8) and by
# this much. Requiring all (0.0625 with 6 passes) let one burst of noise on an edge size erase the
# edge: a busy moment's calibration priced gemma Q4_K_M's 12 and 16 rows at 60.7 and 65.3 ms
# where a quiet one gave 47.9 and 53.4; simulated with 5% of timings 1.4x slower, the 12-row edge
# survived 50% of calibrations, and 94% allowing a pass against it, with no false dip in 300
# calibrations of a smooth curve.
DIP_SIGNIFICANCE, MIN_DIP = 0.11, 0.03
MIN_STEP = 0.01  # see fit()
BUSY_CORES = 0.3  # other processes using more than this many cores: the machine is busy


def bounded(value: float, level: float) -> float:
    """`value` (a live measurement relative to the curve) as one sample may move `level`: within a
    factor OUTLIER of it."""
    return min(max(value, level / OUTLIER), level * OUTLIER)


def is_busy(others_cores: float | None) -> bool:
    """Whether other processes' CPU use (None: unknown) makes timings taken meanwhile untrustworthy."""
    return others_cores is not None and others_cores > BUSY_CORES


def measure(ctx: Context, n_past: int, token: int, sizes: tuple[int, ...] = BATCH_SIZES,
            budget_s: float = MEASURE_BUDGET_S, seed: int = 0) -> CostCurve:
    """Time decodes of B copies of `token` after `n_past` committed tokens, in the last sequence id.

    Every token asks for logits, as in a tree verification or a draft level: the output layer
    runs once per requested row, and with a large vocabulary (gemma: 262k x 640) it is most of a
    token's work, so a curve timed with one output row would make big trees look nearly free.
    Sequence 0's KV is copied into the spare sequence first so attention spans a realistic
    context; the spare sequence is removed afterwards. The first pass goes up in size until
    PASS_BUDGET_S (larger sizes are extrapolated); then passes in random order until `budget_s`,
    at least MIN_PASSES. fit() turns the passes into the curve. Last, the largest size up to 16
    is timed again with one output row, for what a token costs without the output layer.
    How much CPU other processes used meanwhile is recorded: a busy machine's curve is not kept.
    """
    from .host import cpu_sample, others_cores

    spare = ctx.n_seq_max - 1
    sizes = tuple(b for b in sizes if b <= ctx.n_batch and n_past + b < ctx.n_ctx)
    _timed_decode(ctx, spare, n_past, token, sizes[-1])  # warm-up: page in weights, start threads
    before, started = cpu_sample(), time.perf_counter()
    samples: dict[int, list[float]] = {}
    for b in sizes:
        if time.perf_counter() - started > PASS_BUDGET_S and len(samples) >= 2:
            break
        samples[b] = [_timed_decode(ctx, spare, n_past, token, b)]
    # Cut short (a slow model): the largest size is still timed, unless even it would take
    # longer than a pass, so that auto's biggest trees are priced from a measurement. Extrapolated
    # at the last size's cost per token, gemma F32's 40 tokens were priced at 275 ms where they
    # take 200 (measured 20 -> 122 ms, 80 -> 342: straight in between), and auto never drafted
    # past 20 where llama.cpp's ngram modes verify 48-64 tokens at once.
    last, far, linear_from = max(samples), sizes[-1], 0
    if far not in samples and samples[last][0] * far / last <= PASS_BUDGET_S:
        samples[far] = [_timed_decode(ctx, spare, n_past, token, far)]
        linear_from = last
    rng = random.Random(seed)
    order = sorted(samples)
    passes = 1
    while passes < MAX_PASSES and (passes < MIN_PASSES or time.perf_counter() - started < budget_s):
        rng.shuffle(order)
        for b in order:
            samples[b].append(_timed_decode(ctx, spare, n_past, token, b))
        passes += 1
    curve = fit(samples, linear_from)
    m = max((b for b in curve.sizes if b <= 16), default=1)
    if m > 1:
        one = float(np.quantile([_timed_decode(ctx, spare, n_past, token, m, outputs=1) for _ in range(3)],
                                LOW_QUANTILE))
        curve.per_token_one_output = max(0.0, one - curve.seconds[0]) / (m - 1)
    curve.busy_cores = others_cores(before, cpu_sample())
    curve.measured_at = time.time()
    return curve


def fit(samples: dict[int, list[float]], linear_from: int = 0) -> CostCurve:
    """The curve from timed passes (samples[b][i]: size b in pass i): each size's low quantile,
    made non-decreasing except where a bigger size is significantly cheaper (dip()). A noisy
    low reading cannot make the planner prefer a bigger batch that really costs more, and the
    tile pattern the hardware shows survives, whatever it is on this CPU. `linear_from`: see
    CostCurve (sizes past it were skipped for time, not measured)."""
    sizes = sorted(samples)
    low = {b: float(np.quantile(samples[b], LOW_QUANTILE)) for b in sizes}
    fitted: dict[int, float] = {}
    for b in sizes:
        below = [fitted[a] for a in sizes if a < b and not dip(samples[a], samples[b])]
        # A size raised over a smaller one sits just above it: at an equal cost the planner would
        # take the bigger batch, which the noisy reading gives no reason to think is as cheap.
        fitted[b] = max([low[b], *(c * (1 + MIN_STEP) for c in below)])
    spread = [relative_spread(samples[b]) for b in sizes]
    return CostCurve(sizes, [fitted[b] for b in sizes], spread=spread, passes=min(map(len, samples.values())),
                     raw=[low[b] for b in sizes], between="step", linear_from=linear_from)


def dip(smaller: list[float], bigger: list[float]) -> bool:
    """Whether the bigger batch is really cheaper: cheaper in the same pass in all passes but one (a
    one-sided sign test over the passes both were timed in) and by at least MIN_DIP."""
    pairs = list(zip(smaller, bigger))
    wins = sum(y < x for x, y in pairs)
    p_value = sum(math.comb(len(pairs), k) for k in range(wins, len(pairs) + 1)) / 2 ** len(pairs)
    return p_value <= DIP_SIGNIFICANCE and np.quantile(bigger, LOW_QUANTILE) < (1 - MIN_DIP) * np.quantile(
        smaller, LOW_QUANTILE)


def relative_spread(seconds: list[float]) -> float:
    """Interquartile range over the low quantile: how much a size's timings moved between passes."""
    q1, q3 = np.quantile(seconds, [LOW_QUANTILE, 0.75])
    return float((q3 - q1) / q1) if q1 > 0 else 0.0


def measure_context(ctx: Context, curve: CostCurve, n_past: int, token: int,
                    sizes: tuple[int, ...] = (4, 8, 16), repeats: int = 3) -> None:
    """Set the curve's gamma from decodes after `n_past` committed tokens (a long prompt).

    Each size is timed twice, interleaved: after the prompt's context (sequence 0 copied into the
    spare sequence) and with no context (the spare sequence alone, from position 0). The
    difference is attention over the context; timing both in the same moment keeps a busy
    machine, or a noisy start-up curve, out of it. This relies on flash attention skipping
    masked cells (llama.cpp's CPU kernel does); without it both timings pay for every cell and
    gamma comes out near zero, which is also what such a backend's curve should use.
    """
    sizes = tuple(b for b in sizes if b <= ctx.n_batch and n_past + b < ctx.n_ctx)
    spare = ctx.n_seq_max - 1
    if not sizes or n_past <= 0 or spare == 0:
        return
    with_context = {b: float("inf") for b in sizes}
    without = dict(with_context)
    for _ in range(repeats):
        for b in sizes:
            with_context[b] = min(with_context[b], _timed_decode(ctx, spare, n_past, token, b))
            without[b] = min(without[b], _timed_decode(ctx, spare, 0, token, b, copy=False))
    # In the curve's units: `scale` multiplies base and context terms alike, so divide out how
    # much slower (or faster) the machine is now than when the curve was timed.
    busy = float(np.median([without[b] / curve.base(b) for b in sizes]))
    gammas = [max(0.0, with_context[b] - without[b]) / (b * n_past * busy) for b in sizes]
    curve.per_context, curve.per_context_at = float(np.median(gammas)), n_past


def _timed_decode(ctx: Context, spare: int, n_past: int, token: int, b: int, copy: bool = True,
                  outputs: int | None = None) -> float:
    """Seconds for one decode of b tokens in the spare sequence; logits on every row, or on the
    last `outputs` rows."""
    if spare != 0 and copy:
        ctx.seq_cp(0, spare, -1, -1)
    first_out = b - (outputs if outputs is not None else b)
    batch = Batch()
    for j in range(b):
        batch.add(token, n_past + j, (spare,), j >= first_out)
    t0 = time.perf_counter()
    ctx.decode(batch)
    seconds = time.perf_counter() - t0
    ctx.seq_rm(spare, n_past if spare == 0 else -1, -1)
    return seconds


# bump when what a cached curve means changes (2: every row outputs logits; 3: one-output cost;
# 4: passes in random order, noise dips removed, how busy the machine was; 5: a dip may lose one pass;
# 6: rechecks checked against a reference size: curves cached before may hold false dips from them;
# 7: timed up to 80 tokens; 8: a slow model's largest size timed too, linear up to it)
CURVE_VERSION = 8


def cache_key(model_path: str, build: str, threads: int, n_ctx: int, cpu: str = "") -> str:
    st = os.stat(model_path)
    blob = json.dumps([CURVE_VERSION, os.path.abspath(model_path), st.st_size, int(st.st_mtime), build, threads,
                       n_ctx, cpu])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_cached(path: Path) -> CostCurve | None:
    """The cached curve, or None (none, unreadable, or taken on a busy machine)."""
    try:
        data = json.loads(path.read_text())
        curve = CostCurve(list(data["sizes"]), list(data["seconds"]), source="cached",
                          per_context=float(data.get("per_context", 0.0)),
                          per_context_at=int(data.get("per_context_at", 0)),
                          per_token_one_output=float(data.get("per_token_one_output", 0.0)),
                          spread=list(data.get("spread", [])), raw=list(data.get("raw", [])),
                          passes=int(data.get("passes", 0)), busy_cores=data.get("busy_cores"),
                          measured_at=float(data.get("measured_at", 0.0)), between=data.get("between", "linear"),
                          linear_from=int(data.get("linear_from", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None if curve.busy else curve


def save_cached(path: Path, curve: CostCurve) -> None:
    """Keep the curve as this machine's truth, unless it was measured on a busy machine."""
    if curve.busy:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(curve.to_json()))
    os.replace(tmp, path)


class CostAwareContext:
    """A target's Context that decodes every batch at its cheapest size (CostCurve.padded): a
    batch just past a tile edge gets padding rows up to the next one, in the spare sequence, which
    is emptied again after; their logits are dropped. Delegates the rest. Only where sequence 0
    alone holds text between decodes (a target: a tree's branches live for one decode), so that a
    spare sequence the batch does not use is empty; a draft's branches live across its decodes."""

    def __init__(self, ctx: Context, curve: CostCurve, pad: bool = True):
        self.inner, self.curve = ctx, curve  # `inner`: for timings that must not count as steps
        curve.pads = pad  # the curve prices what this context decodes

    @property
    def _spare(self) -> int:
        """The sequence id calibration, rechecks and padding use (0: none to spare)."""
        return self.inner.n_seq_max - 1

    def _spare_free(self, batch: Batch) -> bool:
        return self._spare > 0 and all(self._spare not in ids for ids in batch.seq_ids)

    def _padded(self, batch: Batch) -> Batch:
        n = len(batch)
        size = self.curve.padded(n) if batch.n_outputs == n else n
        if size == n or size > self.inner.n_batch or not self._spare_free(batch):
            return batch
        padded = Batch(list(batch.tokens), list(batch.positions), list(batch.seq_ids), list(batch.logits))
        for j in range(size - n):
            padded.add(batch.tokens[-1], j, (self._spare,), True)
        return padded

    def _decode(self, batch: Batch, padded: Batch) -> np.ndarray:
        out = self.inner.decode(padded)
        if padded is not batch:
            self.inner.seq_rm(self._spare, -1, -1)
            out = out[:batch.n_outputs]
        return out

    def decode(self, batch: Batch) -> np.ndarray:
        return self._decode(batch, self._padded(batch))

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class TimedContext(CostAwareContext):
    """A CostAwareContext that feeds the duration of every decode into its cost curve, and
    re-measures sizes whose live decodes disagree with the curve's shape (CostCurve.suspects)
    when its spare sequence is free: after clear(), and (`live`: sequence 0 alone holds text
    between steps, as for the target) before any decode that does not use it."""

    def __init__(self, ctx: Context, curve: CostCurve, live: bool = False,
                 on_reshape: Callable[[CostCurve], None] | None = None):
        super().__init__(ctx, curve, pad=live)
        self.live, self.on_reshape = live, on_reshape
        self.curve.threads = ctx.n_threads  # what it was measured (and cached) with
        self._token = 0
        self.decode_s = self.measure_s = 0.0  # live decodes; rechecks and retimes
        self.text_decode_s = 0.0  # live decodes since the last clear()

    def decode(self, batch: Batch) -> np.ndarray:
        self.curve.for_threads(self.inner.n_threads)
        if self.live and len(batch) and self._spare_free(batch):
            self._token = batch.tokens[0]
            self.retime()
            self.recheck(within_s=RECHECK_SHARE * self.text_decode_s)
        padded = self._padded(batch)  # after a recheck: it may have moved a tile edge
        t0 = time.perf_counter()
        out = self._decode(batch, padded)
        seconds = time.perf_counter() - t0
        self.decode_s += seconds
        self.text_decode_s += seconds
        if 0 < len(padded) <= self.curve.sizes[-1]:  # steps, not prompt chunks (those extrapolate far)
            # The padding rows attend to nothing: the context term is the batch's own rows'.
            context = batch.positions[0] * len(batch) // len(padded)
            self.curve.observe(len(padded), seconds, context, padded.n_outputs)
        return out

    def clear(self) -> None:
        self.inner.clear()
        self.text_decode_s = 0.0
        self.retime()
        self.recheck()

    def retime(self) -> None:
        """After a change of thread count never timed before: a coarse shape for it, from
        COARSE_SIZES timed now (cheaper than losing steps, or rechecking size by size, until
        the live decodes have shown each size's new cost)."""
        if not self.curve.untimed_threads or self.inner.n_seq_max < 2:
            return
        samples = self._timed_passes([b for b in COARSE_SIZES if b <= min(self.inner.n_batch, self.curve.sizes[-1])],
                                     COARSE_PASSES)
        self.curve.rescale(samples)

    def _timed_passes(self, sizes: list[int], passes: int) -> dict[int, list[float]]:
        """`passes` interleaved timings of B = 1 and `sizes`, in random order, in the spare sequence
        (emptied first: the callers run when nothing live is in it) at position 0 (as calibrated)."""
        spare = self._spare
        self.inner.seq_rm(spare, -1, -1)
        samples: dict[int, list[float]] = {b: [] for b in [1, *sizes]}
        order, rng = list(samples), random.Random(len(self.curve.rechecked))
        t0 = time.perf_counter()
        for _ in range(passes):
            rng.shuffle(order)
            for b in order:
                samples[b].append(_timed_decode(self.inner, spare, 0, self._token, b, copy=False))
        self.measure_s += time.perf_counter() - t0
        return samples

    def recheck(self, within_s: float | None = None) -> list[int]:
        """Time the suspect sizes and B = 1, interleaved, in the (free) spare sequence at position
        0 (as calibrated), and reshape the curve with them; returns the sizes re-measured. Not
        while earlier measuring took more than RECHECK_SHARE of the decoding time, nor (given
        `within_s`) when its timings would take longer than that."""
        suspects = [b for b in self.curve.suspects() if b <= self.inner.n_batch]
        if not suspects or self.inner.n_seq_max < 2 or self.measure_s > RECHECK_SHARE * self.decode_s:
            return []
        from .host import cpu_sample, others_cores

        before = cpu_sample()
        references = {b: r for b in suspects if (r := self.curve.reference(b, suspects)) is not None
                      and r <= self.inner.n_batch}
        timed = sorted({*suspects, *references.values()})
        if within_s is not None and MIN_PASSES * sum(map(self.curve.base, [1, *timed])) > within_s:
            return []
        self.curve.reshape(self._timed_passes(timed, MIN_PASSES), references)
        calibrated = self.inner.n_threads == getattr(self.inner, "max_threads", self.inner.n_threads)
        if self.on_reshape is not None and calibrated and not is_busy(others_cores(before, cpu_sample())):
            self.on_reshape(self.curve)  # kept only when timed quiet, with the threads it is cached for
        return suspects
