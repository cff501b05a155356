"""Contexts that decode at a curve's cheapest sizes and keep it current: every live decode feeds
its level, and sizes whose shape live decodes disagree with are re-timed when that is affordable."""

from __future__ import annotations

import random
import time
from typing import Callable

import numpy as np

from specgen.core.kv import has_room
from specgen.core.protocol import Batch, Context
from specgen.costs.curve import MIN_PASSES, CostCurve, is_busy
from specgen.costs.measure import _timed_decode
from specgen.host import cpu_sample, others_cores

COARSE_SIZES, COARSE_PASSES = (2, 4, 8, 16), 3  # see TimedContext.retime
# Re-timing suspect sizes may take at most this share of the time live decodes took (after the
# first recheck): in a short run, measuring must not cost more than a wrong size would. Within a
# text, a recheck also waits until it costs no more than this share of that text's own decoding,
# else for the text's end (the next clear(), timed as the next prompt's set-up): timed inside a
# step, one recheck of B = 48 took 1.3 s of a 128-token answer's 2.1 s of decoding, and ten of them
# a tenth of a 30-prompt bench's, on whichever prompts they fell.
RECHECK_SHARE = 0.1


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
        if size == n or size > self.inner.n_batch or not self._spare_free(batch) or not has_room(self.inner, size):
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
            self.retime(mid_text=True)
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
        # The timings took cells, and specgen's build never moves the head back (kv.py): cleared
        # again, the next prompt starts at cell 0, where plain decoding's does. A prompt read in
        # decodes of more rows than specgen's attention takes goes through ggml's, whose sums
        # depend on where the cells lie (greedy auto once differed from plain there).
        self.inner.clear()

    def retime(self, mid_text: bool = False) -> None:
        """After a change of thread count never timed before: a coarse shape for it, from
        COARSE_SIZES timed now (cheaper than losing steps, or rechecking size by size, until
        the live decodes have shown each size's new cost)."""
        if not self.curve.untimed_threads or self.inner.n_seq_max < 2:
            return
        sizes = [b for b in COARSE_SIZES if b <= min(self.inner.n_batch, self.curve.sizes[-1])]
        if mid_text and not has_room(self.inner, COARSE_PASSES * (1 + sum(sizes))):
            return  # the timings' cells would take the head round under the text: at the next clear()
        samples = self._timed_passes(sizes, COARSE_PASSES)
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
        before = cpu_sample()
        references = {b: r for b in suspects if (r := self.curve.reference(b, suspects)) is not None
                      and r <= self.inner.n_batch}
        timed = sorted({*suspects, *references.values()})
        if within_s is not None and (MIN_PASSES * sum(map(self.curve.base, [1, *timed])) > within_s
                                     or not has_room(self.inner, MIN_PASSES * (1 + sum(timed)))):
            return []  # within a text: too dear now, or its cells would take the head round
        self.curve.reshape(self._timed_passes(timed, MIN_PASSES), references)
        calibrated = self.inner.n_threads == getattr(self.inner, "max_threads", self.inner.n_threads)
        if self.on_reshape is not None and calibrated and not is_busy(others_cores(before, cpu_sample())):
            self.on_reshape(self.curve)  # kept only when timed quiet, with the threads it is cached for
        return suspects
