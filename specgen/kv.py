"""KV-cache bookkeeping shared by the target and the draft: committed text lives in sequence 0."""

from __future__ import annotations

from .protocol import Batch, Context

COMMITTED_SEQ = 0


def keep_branch(ctx: Context, seq: int, last_pos: int) -> None:
    """Make sequence 0 hold exactly the text ending at `last_pos` on branch `seq`; drop the rest.

    By sequence id, never by position alone: siblings share positions.
    """
    ctx.seq_rm(seq, last_pos + 1, -1)
    if seq != COMMITTED_SEQ:
        ctx.seq_keep(seq)
        ctx.seq_cp(seq, COMMITTED_SEQ, -1, -1)
    ctx.seq_keep(COMMITTED_SEQ)


def prefill(ctx: Context, tokens: list[int]) -> None:
    """Clear the cache and put every prompt token but the last in sequence 0 (in n_batch chunks);
    the last one is the first step's root, evaluated by that step."""
    ctx.clear()
    head = tokens[:-1]
    for off in range(0, len(head), ctx.n_batch):
        batch = Batch()
        for j, tok in enumerate(head[off:off + ctx.n_batch]):
            batch.add(tok, off + j, (COMMITTED_SEQ,), False)
        ctx.decode(batch)
