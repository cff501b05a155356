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
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from specgen.core.tuned import AUTO_NODES, CURVE_COUPLING, CURVE_EMA, CURVE_OUTLIER

# Every size up to 16: quantized kernels process rows in tiles (on these CPUs 8 rows cost less
# than 5-7 for gemma Q4_K_M), so the curve is not smooth enough to interpolate there. Up to 80,
# auto's largest tree (core.tuned.AUTO_NODES): beyond the last measured size nothing is known, and gemma
# Q4_K_M's 65 rows took 186 ms where 64 took 170 (the 65th row's output layer runs apart from the
# tiles), against 164.5 extrapolated from 48 and 64: loop chains of 65 were chosen for it.
BATCH_SIZES = tuple(range(1, 17)) + (20, 24, 32, 48, 64, AUTO_NODES)
SHAPE_EMA, SHAPE_MIN_DECODES, SHAPE_TOLERANCE, MAX_RECHECKS = 0.2, 8, 1.25, 2  # see CostCurve.suspects
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
    observed_s: float = field(default=0.0, repr=False)  # seconds of every live decode observed so far

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
        self.observed_s += seconds
        if outputs is not None and outputs < b:
            return
        level = self.level(b)
        ratio = bounded(seconds / self.at(b, context), level)
        drift = self._drift.setdefault(b, [0.0, 0])
        drift[0] += (math.log(ratio / level) - drift[0]) * (SHAPE_EMA if drift[1] else 1.0)
        drift[1] += 1
        w = self._one_share(b)
        if w > 0.95:  # one token (or a flat curve, as on a GPU: one level for all)
            self.scale = (1 - CURVE_EMA) * self.scale + CURVE_EMA * ratio
            # Weakly, the batch level too: a run that stopped drafting (batches looked dear) sees
            # no batches that could show it they got cheaper.
            self.batch_scale += (ratio - self.batch_scale) * CURVE_EMA * CURVE_COUPLING
        else:  # the batch level this decode implies, given the one-token level's share of it
            implied = bounded((ratio - w * self.scale) / (1 - w), self.batch_scale)
            self.batch_scale = (1 - CURVE_EMA) * self.batch_scale + CURVE_EMA * implied

    def follow(self, other: "CostCurve", weight: float) -> None:
        """Move this curve's one-token level `weight` of the way to another's: a curve whose own
        decodes are rare (a draft that sits out) learns how busy the machine is from one in use."""
        self.scale += (other.scale - self.scale) * weight

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
    factor CURVE_OUTLIER of it."""
    return min(max(value, level / CURVE_OUTLIER), level * CURVE_OUTLIER)


def is_busy(others_cores: float | None) -> bool:
    """Whether other processes' CPU use (None: unknown) makes timings taken meanwhile untrustworthy."""
    return others_cores is not None and others_cores > BUSY_CORES
