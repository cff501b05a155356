"""KV-cache bookkeeping shared by the target and the draft: committed text lives in sequence 0."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from specgen.core.protocol import Batch, Context

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


def decode_chunks(ctx: Context, tokens: list[int], start_pos: int = 0, seq_id: int = COMMITTED_SEQ,
                  logits_from: int = 0) -> Iterator[np.ndarray]:
    """Evaluate a run of tokens at start_pos.. in `seq_id`, in n_batch chunks, with logits for the
    tokens from index `logits_from` on; yields each chunk's logits rows (valid until the next decode)."""
    for off in range(0, len(tokens), ctx.n_batch):
        batch = Batch()
        for j, tok in enumerate(tokens[off:off + ctx.n_batch]):
            batch.add(tok, start_pos + off + j, (seq_id,), off + j >= logits_from)
        yield ctx.decode(batch)


def evaluate(ctx: Context, tokens: list[int], start_pos: int = 0, seq_id: int = COMMITTED_SEQ,
             last_logits: bool = True) -> np.ndarray | None:
    """Evaluate a run of tokens, asking for logits only after the last one (with a large vocabulary
    the output layer is most of a token's cost).

    Returns that row (a view, valid until the next decode on `ctx`), or None when not asked for
    or when there was nothing to evaluate.
    """
    last = None
    for out in decode_chunks(ctx, tokens, start_pos, seq_id, len(tokens) - 1 if last_logits else len(tokens)):
        if len(out):
            last = out[-1]
    return last


def prefill(ctx: Context, tokens: list[int]) -> None:
    """Clear the cache and put every prompt token but the last in sequence 0; the last one is the
    first step's root, evaluated by that step."""
    ctx.clear()
    evaluate(ctx, tokens[:-1], last_logits=False)
