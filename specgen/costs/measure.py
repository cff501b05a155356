"""Calibration: timing decodes of each batch size in a spare sequence id, in passes of random size
order, and fitting the curve so that noise cannot make a bigger batch look cheaper."""

from __future__ import annotations

import math
import random
import time

import numpy as np

from specgen.core.protocol import Batch, Context
from specgen.costs.curve import (BATCH_SIZES, DIP_SIGNIFICANCE, LOW_QUANTILE, MAX_PASSES, MEASURE_BUDGET_S, MIN_DIP,
                                 MIN_PASSES, MIN_STEP, PASS_BUDGET_S, CostCurve)
from specgen.host import cpu_sample, others_cores


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
