"""Measured decode costs c(B): seconds for one llama_decode of B tokens, per model and machine.

Measured at start-up in a spare sequence id (then removed), cached per (model file, llama.cpp
build, threads, context size, CPU) under $SPECGEN_HOME/calibration. Attention makes a decode of
B tokens after L others cost about c(B) + gamma * B * L: gamma is measured once, at the first
long prompt, and cached too; live decodes keep a scale current (machines get busy). c(B) asks for
logits on every row; a decode that asks for one row's logits (catching a draft up on committed
text) costs about c(1) plus a per-token cost of the network without its output layer, timed with
the curve: with a large vocabulary that is several times cheaper.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .protocol import Batch, Context

# Every size up to 16: quantized kernels process rows in tiles (on these CPUs 8 rows cost less
# than 5-7 for gemma Q4_K_M), so the curve is not smooth enough to interpolate there.
BATCH_SIZES = tuple(range(1, 17)) + (20, 24, 32)
EMA = 0.1  # weight of one live measurement in the running estimate
Cost = Callable[[int], float]  # seconds for a decode of B tokens


@dataclass
class CostCurve:
    """c(B): the calibrated shape (linear in between and beyond the measured sizes) times a scale
    that live decodes keep current. Only the scale moves online: a plain run observes B = 1 alone,
    and must not make c(1) cheaper than a stale c(2) (that would make speculation look costly)."""

    sizes: list[int]
    seconds: list[float]
    source: str = "measured"
    scale: float = 1.0
    per_context: float = 0.0  # gamma: seconds per batch token per token of context
    per_context_at: int = 0  # the context length gamma was measured at (0: not yet)
    per_token_one_output: float = 0.0  # seconds each token past the first adds to a one-output decode
    cache_path: Path | None = None  # where the calibration cache keeps this curve
    _table: list[float] = field(default_factory=list, repr=False)  # base(b) for b < TABLE

    TABLE = 129  # the planner asks for c(b) many times a step: interpolate once

    def __post_init__(self) -> None:
        self._table = [0.0] + [self._interpolate(b) for b in range(1, self.TABLE)]

    def base(self, b: int) -> float:
        return self._table[b] if b < self.TABLE else self._interpolate(b)

    def _interpolate(self, b: int) -> float:
        xs, ys = self.sizes, self.seconds
        if b >= xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else ys[-1]
            return ys[-1] + slope * (b - xs[-1])
        return float(np.interp(b, xs, ys))

    def at(self, b: int, context: int, outputs: int | None = None) -> float:
        """Unscaled seconds for B tokens after `context` tokens, `outputs` of them with logits
        (default: all, as the curve was timed; in between, linear from one output to all)."""
        seconds = self.base(b)
        if outputs is not None and outputs < b > 1 and self.per_token_one_output > 0:
            one = min(seconds, self.base(1) + (b - 1) * self.per_token_one_output)
            seconds = one + (seconds - one) * (max(1, outputs) - 1) / (b - 1)
        return seconds + self.per_context * b * context

    def __call__(self, b: int, context: int = 0, outputs: int | None = None) -> float:
        """Seconds, on this machine now, for a decode of b tokens after `context` others."""
        return self.scale * self.at(b, context, outputs) if b > 0 else 0.0

    def read(self, b: int, context: int) -> float:
        """Seconds to evaluate the last b of `context` tokens with one output row (a draft catching
        up on text; a prompt): each attends, on average, to half of their span."""
        return self.scale * self.at(b, max(0, context - b // 2), outputs=1) if b > 0 else 0.0

    def given(self, context: int) -> "Cost":
        """c(B) after `context` tokens, as the one-argument cost the planner's functions take."""
        return lambda b: self(b, context)

    def observe(self, b: int, seconds: float, context: int = 0, outputs: int | None = None) -> None:
        """Fold a real decode into the scale (machines get busy)."""
        self.scale = (1 - EMA) * self.scale + EMA * seconds / self.at(b, context, outputs)

    def relative(self) -> list[float]:
        return [s / self.seconds[0] for s in self.seconds]

    def to_json(self) -> dict:
        return {"sizes": self.sizes, "seconds": self.seconds, "per_context": self.per_context,
                "per_context_at": self.per_context_at, "per_token_one_output": self.per_token_one_output}


def measure(ctx: Context, n_past: int, token: int, sizes: tuple[int, ...] = BATCH_SIZES,
            repeats: int = 2, budget_s: float = 1.0) -> CostCurve:
    """Time decodes of B copies of `token` after `n_past` committed tokens, in the last sequence id.

    Every token asks for logits, as in a tree verification or a draft level: the output layer
    runs once per requested row, and with a large vocabulary (gemma: 262k x 640) it is most of a
    token's work, so a curve timed with one output row would make big trees look nearly free.
    Sequence 0's KV is copied into the spare sequence first so attention spans a realistic
    context; the spare sequence is removed afterwards. One pass over the sizes, then more passes
    (keeping each size's fastest time) while the time budget lasts; sizes the first pass could
    not reach in budget are extrapolated. Last, the largest size up to 16 is timed again with
    one output row, for what a token costs without the output layer (per_token_one_output).
    """
    spare = ctx.n_seq_max - 1
    sizes = tuple(b for b in sizes if b <= ctx.n_batch and n_past + b < ctx.n_ctx)
    best: dict[int, float] = {}
    _timed_decode(ctx, spare, n_past, token, sizes[-1])  # warm-up: page in weights, start threads
    started = time.perf_counter()
    for _ in range(repeats):
        for b in sizes:
            if time.perf_counter() - started > budget_s and len(best) >= 2:
                break
            seconds = _timed_decode(ctx, spare, n_past, token, b)
            best[b] = min(seconds, best.get(b, seconds))
    measured = sorted(best)
    curve = CostCurve(measured, [best[b] for b in measured])
    m = max((b for b in measured if b <= 16), default=1)
    if m > 1:
        one = min(_timed_decode(ctx, spare, n_past, token, m, outputs=1) for _ in range(repeats))
        curve.per_token_one_output = max(0.0, one - best[1]) / (m - 1) if 1 in best else 0.0
    return curve


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


CURVE_VERSION = 3  # bump when what a cached curve means changes (2: every row outputs logits; 3: one-output cost)


def cache_key(model_path: str, build: str, threads: int, n_ctx: int, cpu: str = "") -> str:
    st = os.stat(model_path)
    blob = json.dumps([CURVE_VERSION, os.path.abspath(model_path), st.st_size, int(st.st_mtime), build, threads,
                       n_ctx, cpu])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_cached(path: Path) -> CostCurve | None:
    try:
        data = json.loads(path.read_text())
        return CostCurve(list(data["sizes"]), list(data["seconds"]), source="cached",
                         per_context=float(data.get("per_context", 0.0)),
                         per_context_at=int(data.get("per_context_at", 0)),
                         per_token_one_output=float(data.get("per_token_one_output", 0.0)))
    except (OSError, ValueError, KeyError):
        return None


def save_cached(path: Path, curve: CostCurve) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(curve.to_json()))
    os.replace(tmp, path)


class TimedContext:
    """A Context that feeds the duration of every decode into a cost curve (delegates the rest)."""

    def __init__(self, ctx: Context, curve: CostCurve):
        self.inner, self.curve = ctx, curve  # `inner`: for timings that must not count as steps

    def decode(self, batch: Batch) -> np.ndarray:
        t0 = time.perf_counter()
        out = self.inner.decode(batch)
        if 0 < len(batch) <= self.curve.sizes[-1]:  # steps, not prompt chunks (those extrapolate far)
            self.curve.observe(len(batch), time.perf_counter() - t0, batch.positions[0], batch.n_outputs)
        return out

    def __getattr__(self, name: str):
        return getattr(self.inner, name)
