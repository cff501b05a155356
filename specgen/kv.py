"""KV-cache bookkeeping shared by the target and the draft: committed text lives in sequence 0."""

from __future__ import annotations

from .protocol import Context

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
