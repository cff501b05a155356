"""KV-cache bookkeeping shared by the target and the draft: committed text lives in sequence 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from specgen.core.protocol import Batch, Context

COMMITTED_SEQ = 0
# The largest decode specgen's build computes with its batch-invariant kernels (docs/screening-and-
# kernels.md): a token's KV is then the same bits whatever else shares its decode, so a prompt cache
# prefills in decodes of at most this many tokens and a prefix kept from any earlier decode is exact.
INVARIANT_ROWS = 128


def keep_branch(ctx: Context, seq: int, last_pos: int) -> None:
    """Make sequence 0 hold exactly the text ending at `last_pos` on branch `seq`; drop the rest.

    By sequence id, never by position alone: siblings share positions.
    """
    ctx.seq_rm(seq, last_pos + 1, -1)
    if seq != COMMITTED_SEQ:
        ctx.seq_keep(seq)
        ctx.seq_cp(seq, COMMITTED_SEQ, -1, -1)
    ctx.seq_keep(COMMITTED_SEQ)


def decode_chunks(ctx: Context, tokens: list[int], start_pos: int = 0, seq_id: int = COMMITTED_SEQ,
                  logits_from: int = 0, chunk: int | None = None) -> Iterator[np.ndarray]:
    """Evaluate a run of tokens at start_pos.. in `seq_id`, in chunks of `chunk` (default n_batch),
    with logits for the tokens from index `logits_from` on; yields each chunk's logits rows (valid
    until the next decode)."""
    size = min(chunk or ctx.n_batch, ctx.n_batch)
    for off in range(0, len(tokens), size):
        batch = Batch()
        for j, tok in enumerate(tokens[off:off + size]):
            batch.add(tok, start_pos + off + j, (seq_id,), off + j >= logits_from)
        yield ctx.decode(batch)


def evaluate(ctx: Context, tokens: list[int], start_pos: int = 0, seq_id: int = COMMITTED_SEQ,
             last_logits: bool = True, chunk: int | None = None) -> np.ndarray | None:
    """Evaluate a run of tokens, asking for logits only after the last one (with a large vocabulary
    the output layer is most of a token's cost).

    Returns that row (a view, valid until the next decode on `ctx`), or None when not asked for
    or when there was nothing to evaluate.
    """
    last = None
    for out in decode_chunks(ctx, tokens, start_pos, seq_id, len(tokens) - 1 if last_logits else len(tokens), chunk):
        if len(out):
            last = out[-1]
    return last


def prefill(ctx: Context, tokens: list[int], keep: int = 0, chunk: int | None = None) -> int:
    """Put every prompt token but the last in sequence 0; the last one is the first step's root,
    evaluated by that step. `keep`: the first `keep` tokens are in sequence 0 already (a prompt
    cache): everything else is dropped and only the rest is evaluated, at the same positions, in
    decodes of `chunk` tokens (default n_batch). Returns the tokens kept (0 where the cache could
    not drop the rest: it was cleared)."""
    if keep <= 0 or not ctx.seq_rm(COMMITTED_SEQ, keep, -1):
        ctx.clear()
        keep = 0
    ctx.seq_keep(COMMITTED_SEQ)
    evaluate(ctx, tokens[keep:-1], start_pos=keep, last_logits=False, chunk=chunk)
    return keep


def has_room(ctx: Context, cells: int) -> bool:
    """Whether `cells` more cells keep the cache's head short of its end (see wraps_soon); True
    where the context does not count its cells (a test's fake)."""
    written = getattr(ctx, "cells_written", None)
    return written is None or written + cells <= ctx.n_ctx


def wraps_soon(ctx: Context, n_past: int) -> bool | None:
    """Whether the next decodes (up to n_batch cells, a quarter of a small cache: a step's tree, its
    padding, auto's timings take fewer) could take the cache's head round to its start, where cells
    left by rejected drafts and timings would take committed tokens before earlier ones, out of the
    position order plain decoding's lie in: specgen's build never moves the head back
    (`cells_written`: backend.py), and attention sums a row's cells in cell order. None: no such
    risk (or a context that does not count its cells). True: a re-read of the text from cell 0
    (reread) leaves that room. False: the text itself leaves no such room (near the end of a nearly
    full context): after one re-read, steps must take one cell each."""
    headroom = min(ctx.n_batch, ctx.n_ctx // 4)
    if has_room(ctx, headroom):
        return None
    return n_past + headroom <= ctx.n_ctx


def reread(ctx: Context, text: list[int], n_prompt: int, n_past: int, chunk: int | None) -> None:
    """Sequence 0 anew from cell 0, in position order, with the same bits: the prompt `text[:n_prompt]`
    as the generation's prefill read it (`chunk`, from an empty cache), then the committed tokens
    up to `n_past` in decodes of INVARIANT_ROWS, whose rows have the bits of any other batch."""
    prefill(ctx, text[:n_prompt], 0, chunk)
    evaluate(ctx, text[n_prompt - 1:n_past], start_pos=n_prompt - 1, last_logits=False, chunk=INVARIANT_ROWS)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def leaves_room(cells: int, kept: int, n_prompt: int, n_ctx: int) -> bool:
    """Whether a prompt of `n_prompt` tokens may keep its first `kept` from a cache whose head is at
    `cells` (cells_written). The cells must still be in position order: the head has not come round
    (cells <= n_ctx). Then the head leads a cold start's by `cells - kept`, and the lead must be at
    most half the cells a cold start has left after the prompt: so the prefill never comes round
    either, and the generation only where a cold one would use more than half its room."""
    return cells <= n_ctx and cells - kept <= (n_ctx - (n_prompt - 1)) // 2


def holds_from_start(ctx: Context) -> bool:
    """Sequence 0 still has position 0 (llama_memory_seq_pos_min; -1: empty). A sliding-window cache
    reuses the cells its window has left once its head comes round, dropping those positions: a
    prompt that keeps fewer tokens than the cache held would lack some that a cold prefill has."""
    pos_min = getattr(ctx, "seq_pos_min", None)
    return pos_min is None or pos_min(COMMITTED_SEQ) <= 0


@dataclass(eq=False)
class Saved:
    """A prefix kept in host memory: the KV of `tokens` at positions 0..len-1 (Context.seq_save)."""

    tokens: list[int]
    state: bytes


@dataclass(eq=False)
class Resume:
    """A saved prefix to put back for a prompt, and how many of the prompt's tokens it keeps."""

    saved: Saved
    kept: int


class PromptCache:
    """What sequence 0 of one context holds between generations: a later prompt that begins with
    the same tokens evaluates only the rest (a conversation resent with one more turn).

    Exact, as a cold prefill, on specgen's build: every prefill decode is at most INVARIANT_ROWS
    tokens, so each token's KV is the same bits whichever decode computed it (a prompt chunk, a
    verified draft); attention sums a row's cells in cell order, which is position order until the
    cache's head wraps around (cells left empty by rejected drafts are skipped, not summed). So a
    prefix is kept only from a cache whose head has not come round, and only where the head, which
    then leads a cold start's, leaves the prompt at least half the room a cold start has
    (`leaves_room`; `cells_written`: backend.py): else the cache starts over (clears). A prefix is
    kept only while the cache still holds position 0 (`holds_from_start`: a sliding window drops
    positions). One per context: every generation on it goes through it.
    `reuse` False: every prompt is read whole, in the decodes a cold cache reads it in (the same bits).
    A prefix shorter than `min_keep` (a chat template's header) is not kept: starting over puts the
    head back at the start, which a long conversation's later turns need more.

    `budget` > 0: up to that many bytes of other prefixes wait in host memory (least recently used
    dropped first). The live prefix is saved before a prompt would drop `min_keep` tokens or more of
    it, and a saved one that shares more with a prompt than the live one is put back: into an empty
    cache, from cell 0 in position order (holes closed), where a cold prefill puts the same tokens,
    so the answers stay a cold cache's (Context.seq_load). Its head is then at the saved prefix's
    end, so the same room rule applies to the tokens it keeps."""

    def __init__(self, reuse: bool = True, min_keep: int = 32, budget: int = 0) -> None:
        self.reuse, self.min_keep, self.budget = reuse, min_keep, budget
        self.tokens: list[int] = []  # sequence 0 holds the first n of these, at positions 0..n-1
        self.n = 0
        self.saved: list[Saved] = []  # least recently used first

    def reusable(self, prompt: list[int], ctx: Context, take: bool = True) -> int:
        """Prompt tokens whose KV can be kept: the common prefix, less the root (never evaluated
        by a prefill: the first step does); 0 where the cache cannot keep them exactly (see above).
        With a budget, the live prefix may be saved and a saved one put in its place first. `take`
        False (a request's cache_prompt: false): 0, the prompt read whole; the live prefix is saved first."""
        if not self.reuse:
            return 0
        saving = self.budget > 0 and hasattr(ctx, "seq_load")
        if not take:
            if saving and self.n >= self.min_keep:
                self._save(ctx)
            return 0
        keep = self._live(prompt, ctx)
        if not saving:
            return keep
        best = self._best(prompt, ctx.n_ctx, keep)
        if self.n - (0 if best else keep) >= self.min_keep:
            self._save(ctx)
            best = self._best(prompt, ctx.n_ctx, keep)  # the live prefix, saved, may be the best now
        return keep if best is None else self._restore(ctx, best)

    def _live(self, prompt: list[int], ctx: Context) -> int:
        """What the live prefix keeps of `prompt` (0: nothing)."""
        live = min(common_prefix(self.tokens[:self.n], prompt), len(prompt) - 1)
        cells = getattr(ctx, "cells_written", 0)
        fits = live >= self.min_keep and leaves_room(cells, live, len(prompt), ctx.n_ctx)
        return live if fits and holds_from_start(ctx) else 0

    def _best(self, prompt: list[int], n_ctx: int, keep: int) -> Resume | None:
        """The saved prefix that keeps the most of `prompt`, more than `keep` and at least min_keep,
        put back (its head at its end) with room left; None if none does."""
        resumes = [Resume(s, min(common_prefix(s.tokens, prompt), len(prompt) - 1)) for s in self.saved]
        fitting = [r for r in resumes if r.kept >= self.min_keep and r.kept > keep
                   and leaves_room(len(r.saved.tokens), r.kept, len(prompt), n_ctx)]
        return max(fitting, key=lambda r: r.kept, default=None)

    def _restore(self, ctx: Context, best: Resume) -> int:
        """Put `best` back in place of the live prefix; the tokens it keeps (0 where it failed)."""
        self.saved.remove(best.saved)
        self.n = 0
        if not ctx.seq_load(COMMITTED_SEQ, best.saved.state, len(best.saved.tokens)):
            return 0
        self.tokens, self.n = best.saved.tokens, len(best.saved.tokens)
        return best.kept

    def _save(self, ctx: Context) -> None:
        """Copy the live prefix to host memory (a prefix of a saved one is not saved again)."""
        held = self.tokens[:self.n]
        if getattr(ctx, "cells_written", 0) > ctx.n_ctx or not holds_from_start(ctx):  # cells out of position
            return  # order (the head came round), or positions dropped: a restore would not be a cold prefill
        longer = [s for s in self.saved if common_prefix(s.tokens, held) == len(held)]
        if longer:  # already saved, with more after it
            self.saved.remove(longer[0])
            self.saved.append(longer[0])
            return
        ctx.seq_rm(COMMITTED_SEQ, self.n, -1)  # a step cut short evaluated more than the text
        state = ctx.seq_save(COMMITTED_SEQ)
        if state is None or len(state) > self.budget:
            return
        self.saved = [s for s in self.saved if common_prefix(s.tokens, held) < len(s.tokens)]
        self.saved.append(Saved(held, state))
        while sum(len(s.state) for s in self.saved) > self.budget:
            self.saved.pop(0)

    def hold(self, text: list[int], n: int) -> None:
        """Sequence 0 holds text[:n] (`text` is the caller's, growing: not copied)."""
        self.tokens, self.n = text, min(n, len(text))

    def forget(self) -> None:
        self.n = 0
