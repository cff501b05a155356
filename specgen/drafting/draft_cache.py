"""The draft model's KV cache, kept in step with the committed text."""

from __future__ import annotations

import numpy as np

from specgen.core.kv import COMMITTED_SEQ, common_prefix, evaluate, keep_branch, prefill
from specgen.core.protocol import Context


class DraftCache:
    """The draft model's KV cache, kept in step with the committed text in sequence 0.

    Proposals evaluate drafted tokens in extra sequences (one per branch); after verification the
    deepest accepted node that the draft evaluated is kept, everything else is removed by sequence
    id, so the next step evaluates only the tokens the draft has not seen (usually the bonus token).
    """

    # A lazy cache further behind than this starts over from the text's last WINDOW tokens: the
    # draft proposes from recent text (lookup copies from far back), and reading a long prompt
    # cost gemma's -d self draft 0.5 ms a token, 400 ms for a RAG prompt, paid by the first step
    # that uses it: a 3-token answer ran at a third of plain's speed. Verification keeps the output
    # exact whatever the draft has read.
    WINDOW = 256

    def __init__(self, ctx: Context, lazy: bool = False):
        self.ctx = ctx
        self.lazy = lazy  # leave the prompt to the first catch-up, which never comes if the draft is unused
        self.tokens: list[int] = []  # committed text (lazy: from where the draft started reading)
        self.from_start = True  # whether self.tokens starts the text (a lazy restart drops its head)
        self.n_eval = 0  # committed tokens evaluated into sequence 0
        self.caught_up = False  # whether this step evaluated the root (the last committed token)

    def reset(self, tokens: list[int]) -> None:
        """Prefill the prompt but its last token (the first root), as the target does (lazy: none).
        The prefix it shares with the text already read stays (a conversation's next turn, an agent's
        next call): only the rest is read. The draft's bits need not be a cold read's, since
        verification decides every token."""
        held = self.tokens[:self.n_eval] if self.from_start else []
        keep = min(common_prefix(held, tokens), len(tokens) - 1)
        if not self.lazy:
            self.n_eval = len(tokens) - 1
            prefill(self.ctx, tokens, keep=keep)
        elif keep > 0 and self.ctx.seq_rm(COMMITTED_SEQ, keep, -1):
            self.ctx.seq_keep(COMMITTED_SEQ)
            self.n_eval = keep
        else:
            self.ctx.clear()
            self.n_eval = 0
        self.tokens, self.from_start = list(tokens), True
        self.caught_up = False

    @property
    def behind(self) -> int:
        """Committed tokens the next catch-up evaluates (the root included)."""
        behind = len(self.tokens) - self.n_eval
        return min(behind, self.WINDOW) if self.lazy else behind

    def catch_up(self) -> np.ndarray:
        """Evaluate the committed tokens the draft has not seen; q-logits after the last one.
        Lazy, more than WINDOW behind: start over from the last WINDOW (positions from 0)."""
        if self.lazy and len(self.tokens) - self.n_eval > self.WINDOW:
            self.ctx.seq_rm(COMMITTED_SEQ, 0, -1)  # the only sequence between steps
            self.tokens, self.n_eval, self.from_start = self.tokens[-self.WINDOW:], 0, False
        last = evaluate(self.ctx, self.tokens[self.n_eval:], self.n_eval)
        self.n_eval = len(self.tokens)
        self.caught_up = True
        assert last is not None, "catch_up needs at least one unevaluated token (the root)"
        return last

    def commit(self, committed: list[int], kept_seq: int, kept_depth: int) -> None:
        """Keep the branch `kept_seq` up to `kept_depth` tokens past the root; drop the rest.

        A step that did not use the draft only appends: the next catch-up evaluates the backlog.
        """
        root_pos = len(self.tokens) - 1
        if self.caught_up:
            keep_branch(self.ctx, kept_seq, root_pos + kept_depth)
            self.n_eval = root_pos + kept_depth + 1
        self.tokens.extend(committed)
        self.caught_up = False
