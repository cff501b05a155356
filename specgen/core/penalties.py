"""logit_bias and the repetition penalties: the target's logits row adjusted with the tokens before
the position it scores, as llama.cpp's samplers do (its logit_bias sampler, then its penalties).

A penalty depends on the text before the position, so inside a draft tree each node's row is
adjusted with the tokens on its own path (the committed text, then the path's tokens down to that
node); plain decoding adjusts its one row with the committed text, through the same function. So
every row the verifier meets is the row plain decoding would meet after the same text, and
verification stays exact (docs/losslessness.md). The draft's rows are left as drafted: only the
target's choices decide what is committed.

The chain, the same for plain and speculative decoding (sampling.py holds the rest):
  logit_bias -> repeat/frequency/presence penalties -> top-k -> temperature -> top-p -> min-p -> draw
(greedy: argmax after the penalties).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specgen.core.tree import DraftTree

WHOLE_CONTEXT = -1  # repeat_last_n -1: the whole context, as llama.cpp reads it


@dataclass(frozen=True)
class Penalties:
    """llama.cpp's penalties sampler and logit bias. For each token t that occurs c > 0 times in
    the window (the last `last_n` tokens of the text, prompt included, as llama-server counts):
    logit /= repeat if logit > 0 else logit *= repeat; then logit -= c * frequency + presence.
    `bias`: (token, added logit) pairs, applied first; -inf bans the token."""

    repeat: float = 1.0
    last_n: int = 64  # 0: no penalty; -1: the whole context
    frequency: float = 0.0
    presence: float = 0.0
    bias: tuple[tuple[int, float], ...] = ()

    @property
    def penalizes(self) -> bool:
        return self.last_n != 0 and (self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0)

    @property
    def active(self) -> bool:
        """Whether any row changes: without that, rows are used as decoded, at no cost."""
        return self.penalizes or any(b != 0.0 for _, b in self.bias)

    def window(self, text: Sequence[int]) -> Sequence[int]:
        """The tokens the penalties count, from the text before the position scored."""
        return text if self.last_n == WHOLE_CONTEXT else text[len(text) - min(self.last_n, len(text)):]


def adjusted(row: np.ndarray, window: Sequence[int], pen: Penalties) -> np.ndarray:
    """A copy of one logits row with the bias added, then the penalties for the tokens in
    `window` (Penalties.window of the text before the row's position)."""
    out = np.array(row, dtype=np.float32, copy=True)
    if pen.bias:
        ids = np.fromiter((t for t, _ in pen.bias), dtype=np.int64, count=len(pen.bias))
        out[ids] += np.fromiter((b for _, b in pen.bias), dtype=np.float32, count=len(pen.bias))
    if pen.penalizes and len(window):
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        x = out[ids]
        x = np.where(x <= 0, x * np.float32(pen.repeat), x / np.float32(pen.repeat))
        out[ids] = x - (counts * pen.frequency + pen.presence).astype(np.float32)
    return out


class PathRows:
    """The rows of one target decode as the sampler sees them: node i's row adjusted with the
    committed text and the tokens on the path down to node i, computed when first asked (the walk
    visits a path, not the whole tree). Indexed like the decode's logits."""

    def __init__(self, logits: np.ndarray, tree: DraftTree | None, text: Sequence[int], pen: Penalties):
        self.logits, self.tree, self.text, self.pen = logits, tree, text, pen
        self._done: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.logits)

    def __getitem__(self, node: int) -> np.ndarray:
        row = self._done.get(node)
        if row is None:
            path = [] if self.tree is None else [self.tree.tokens[v] for v in self.tree.path_to(node)]
            recent = self.pen.window(self.text)  # at most last_n tokens: the path's own join them
            row = self._done[node] = adjusted(self.logits[node], self.pen.window([*recent, *path]), self.pen)
        return row


class Scoring:
    """What turns a decode's logits into the rows the sampler reads, for one generation: the text
    so far (the prompt, then each committed token; its last token is the root of the next tree)
    and the request's Penalties. Inactive penalties: the rows are the logits themselves."""

    def __init__(self, pen: Penalties, prompt: Sequence[int]):
        self.pen = pen if pen.active else None
        self.text: list[int] = list(prompt) if self.pen is not None else []

    def rows(self, logits: np.ndarray, tree: DraftTree | None = None) -> np.ndarray | PathRows:
        if self.pen is None:
            return logits
        return PathRows(logits, tree, self.text, self.pen)

    def commit(self, tokens: Sequence[int]) -> None:
        if self.pen is not None:
            self.text.extend(tokens)
