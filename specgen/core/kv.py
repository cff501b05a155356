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


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(eq=False)
class Saved:
    """A prefix kept in host memory: the KV of `tokens` at positions 0..len-1 (Context.seq_save)."""

    tokens: list[int]
    state: bytes


class PromptCache:
    """What sequence 0 of one context holds between generations: a later prompt that begins with
    the same tokens evaluates only the rest (a conversation resent with one more turn).

    Exact, as a cold prefill, on specgen's build: every prefill decode is at most INVARIANT_ROWS
    tokens, so each token's KV is the same bits whichever decode computed it (a prompt chunk, a
    verified draft); attention sums a row's cells in cell order, which is position order until the
    cache's head wraps around (cells left empty by rejected drafts are skipped, not summed). A
    generation that starts further along than a cold one would wrap sooner, so the cache starts
    over (clears) once the head leads a cold start by more than half the context (`cells_written`:
    backend.py). One per context: every generation on it goes through it.
    `reuse` False: every prompt is read whole, in the decodes a cold cache reads it in (the same bits).
    A prefix shorter than `min_keep` (a chat template's header) is not kept: starting over puts the
    head back at the start, which a long conversation's later turns need more.

    `budget` > 0: up to that many bytes of other prefixes wait in host memory (least recently used
    dropped first). The live prefix is saved before a prompt would drop `min_keep` tokens or more of
    it, and a saved one that shares more with a prompt than the live one is put back: into an empty
    cache, from cell 0 in position order (holes closed), where a cold prefill puts the same tokens,
    so the answers stay a cold cache's (Context.seq_load)."""

    def __init__(self, reuse: bool = True, min_keep: int = 32, budget: int = 0) -> None:
        self.reuse, self.min_keep, self.budget = reuse, min_keep, budget
        self.tokens: list[int] = []  # sequence 0 holds the first n of these, at positions 0..n-1
        self.n = 0
        self.saved: list[Saved] = []  # least recently used first

    def reusable(self, prompt: list[int], ctx: Context, take: bool = True) -> int:
        """Prompt tokens whose KV can be kept: the common prefix, less the root (never evaluated
        by a prefill: the first step does); 0 where the head is too far along (see above). With a
        budget, the live prefix may be saved and a saved one put in its place first. `take` False
        (a request's cache_prompt: false): 0, the prompt read whole; the live prefix is saved first."""
        if not self.reuse:
            return 0
        if not take:
            if self.budget > 0 and hasattr(ctx, "seq_load") and self.n >= self.min_keep:
                self._save(ctx)
            return 0
        live = min(common_prefix(self.tokens[:self.n], prompt), len(prompt) - 1)
        lead = getattr(ctx, "cells_written", 0) - live  # how far the head is ahead of a cold start's
        keep = live if live >= self.min_keep and lead <= ctx.n_ctx // 2 else 0
        if self.budget <= 0 or not hasattr(ctx, "seq_load"):
            return keep
        best, got = self._best(prompt)
        restore = got >= self.min_keep and got > keep
        if self.n - (0 if restore else keep) >= self.min_keep:
            self._save(ctx)
            # the live prefix, saved, may be the best now (a head too far along: put back compact)
            best, got = self._best(prompt)
            restore = got >= self.min_keep and got > keep
        if not restore:
            return keep
        self.saved.remove(best)
        self.n = 0
        if not ctx.seq_load(COMMITTED_SEQ, best.state, len(best.tokens)):
            return 0
        self.tokens, self.n = best.tokens, len(best.tokens)
        return got

    def _best(self, prompt: list[int]) -> tuple[Saved | None, int]:
        """The saved prefix that shares most with `prompt`, and how many tokens it would keep."""
        best = max(self.saved, key=lambda s: common_prefix(s.tokens, prompt), default=None)
        return best, 0 if best is None else min(common_prefix(best.tokens, prompt), len(prompt) - 1)

    def _save(self, ctx: Context) -> None:
        """Copy the live prefix to host memory (a prefix of a saved one is not saved again)."""
        held = self.tokens[:self.n]
        if getattr(ctx, "cells_written", 0) > ctx.n_ctx:  # the head wrapped: cells are out of position order
            return
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
