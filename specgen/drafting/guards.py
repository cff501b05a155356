"""What `auto`'s steps realised, held against plain decoding measured in the same run: plain's own
speed (PlainSpeed), a guard per kind of plan that benches a kind realised slower than plain
(Guard, KindGuards), and the time a step takes beyond its modelled decodes (Overhead), so that
verification's own work is priced as measured. A wrong cost model cannot hide a loss.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from specgen.costs.curve import Cost, bounded
from specgen.drafting.tuning import (GUARD_BACKOFF, GUARD_MARGIN, GUARD_MAX_BACKOFF, GUARD_MIN_STEPS, GUARD_WINDOW,
                                     GUARD_WINDOW_TOKENS, MAX_PROBE_EVERY, OVERHEAD_EMA, PLAIN_EMA, PROBE_CLEAR_WIN,
                                     PROBE_EVERY)


@dataclass
class PlainSpeed:
    """Plain decoding's speed, measured in this run: the guard holds speculation to it, not to the
    cost model, so a wrong curve (a poisoned cache, a machine that got busy) cannot hide a loss.

    Steps that draft nothing are plain steps; when speculation keeps choosing to draft, every
    `interval` speculative steps one step is a plain probe. A probe costs a step's worth of
    speedup, so the interval doubles (up to MAX_PROBE_EVERY) while speculation since the last
    plain step clearly wins (PROBE_CLEAR_WIN), and falls back to PROBE_EVERY when it does not.
    """

    seconds: float | None = None  # a plain step, EMA; None until one is measured
    interval: int = PROBE_EVERY
    since: int = 0  # speculative steps since the last plain one
    _tokens: int = 0  # committed by those speculative steps
    _spec_s: float = 0.0  # and their seconds

    def due(self) -> bool:
        return self.since >= self.interval

    def rate(self, modelled: float) -> float:
        """Plain tokens per second: measured, or `modelled` until a plain step has been timed."""
        return 1.0 / self.seconds if self.seconds else modelled

    def observe_plain(self, seconds: float) -> None:
        if self._spec_s > 0 and self.seconds:
            wins = self._tokens / self._spec_s > PROBE_CLEAR_WIN / self.seconds
            self.interval = min(MAX_PROBE_EVERY, self.interval * 2) if wins else PROBE_EVERY
        if self.seconds is None:
            self.seconds = seconds
        else:  # one hiccup (a 586 ms step among 32 ms ones) must not make speculation look like a win for long
            self.seconds += (bounded(seconds, self.seconds) - self.seconds) * PLAIN_EMA
        self.since, self._tokens, self._spec_s = 0, 0, 0.0

    def observe_speculative(self, tokens: int, seconds: float) -> None:
        self.since += 1
        self._tokens += tokens
        self._spec_s += seconds


class Guard:
    """Back off to plain decoding when speculation is realised slower than plain; probe later.

    Keeps the realised tokens/second of the last `window` speculative steps and compares it with
    plain decoding's measured speed; after a loss, plain for `backoff` steps (doubling on repeated
    losses, reset after a win), then speculation gets another chance. Long steps are judged sooner:
    once at least `min_steps` of them committed `window_tokens` (32 steps of 64-token chains would
    be 2,000 tokens of losing).
    """

    def __init__(self, window: int = GUARD_WINDOW, margin: float = GUARD_MARGIN, backoff: int = GUARD_BACKOFF,
                 max_backoff: int = GUARD_MAX_BACKOFF, min_steps: int = GUARD_MIN_STEPS,
                 window_tokens: int = GUARD_WINDOW_TOKENS):
        self.window, self.margin = window, margin
        self.min_steps, self.window_tokens = min_steps, window_tokens
        self.base_backoff, self.backoff, self.max_backoff = backoff, backoff, max_backoff
        self.steps: deque[tuple[int, float]] = deque(maxlen=window)
        self.plain_left = 0

    def allow_speculation(self) -> bool:
        if self.plain_left > 0:
            self.plain_left -= 1
            return False
        return True

    def record(self, tokens: int, seconds: float, plain_rate: float) -> None:
        self.steps.append((tokens, seconds))
        committed = sum(t for t, _ in self.steps)
        if len(self.steps) < self.window and (len(self.steps) < self.min_steps or committed < self.window_tokens):
            return
        rate = committed / max(1e-9, sum(s for _, s in self.steps))
        if rate < self.margin * plain_rate:
            self.plain_left = self.backoff
            self.backoff = min(self.max_backoff, self.backoff * 2)
            self.steps.clear()
        elif rate > plain_rate:
            self.backoff = self.base_backoff


@dataclass
class KindGuards:
    """One Guard per kind of plan ("lookup", "draft"): a kind whose steps were realised slower than
    plain decoding sits out its backoff while the others go on (one global switch benched lookup
    for a draft's losses, and the draft for lookup's)."""

    guards: dict[str, Guard] = field(default_factory=dict)

    def of(self, kind: str) -> Guard:
        if kind not in self.guards:
            self.guards[kind] = Guard()
        return self.guards[kind]

    def allowed(self, kinds: tuple[str, ...]) -> set[str]:
        """The kinds that may run this step (each call is one step of every backoff)."""
        return {kind for kind in kinds if self.of(kind).allow_speculation()}

    def record(self, kind: str, tokens: int, seconds: float, plain_rate: float) -> None:
        self.of(kind).record(tokens, seconds, plain_rate)


@dataclass
class Overhead:
    """Seconds a step takes beyond its target decode as the cost curve models it: verification's
    walk over the p rows, the KV edits, the engine's bookkeeping; a line in the drafted nodes,
    fitted to decayed sums of every timed step (plain steps are its n = 0). Zero until measured,
    and when planning must not read clocks (a seed was given)."""

    sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # weight, n, n^2, seconds, n * seconds

    def observe(self, nodes: int, seconds: float, decode_s: float) -> None:
        """One step: `seconds` beyond its modelled decode of `decode_s`, bounded by that decode (a
        hiccup must not price every tree out; a decode faster than modelled gives a negative one)."""
        seconds = min(max(seconds, -0.5 * decode_s), decode_s)
        for i, x in enumerate((1.0, nodes, nodes * nodes, seconds, nodes * seconds)):
            self.sums[i] += (x - self.sums[i]) * OVERHEAD_EMA

    def line(self) -> tuple[float, float]:
        """(seconds a step, seconds a drafted node), neither below 0."""
        w, n, nn, s, ns = self.sums
        if w <= 0:
            return 0.0, 0.0
        n, nn, s, ns = n / w, nn / w, s / w, ns / w
        var = nn - n * n
        slope = max(0.0, (ns - n * s) / var) if var > 1e-9 else 0.0
        return max(0.0, s - slope * n), slope

    def priced(self, c_target: Cost) -> Cost:
        """c_target with the overhead of verifying b - 1 drafted nodes added."""
        fixed, per_node = self.line()
        if fixed == 0.0 and per_node == 0.0:
            return c_target
        return lambda b: c_target(b) + fixed + per_node * (b - 1)
