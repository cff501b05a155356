"""Verification: walk the draft tree with the target's choices (p = target, q = draft).

At each node the target picks the next token exactly as plain decoding would: argmax at
temperature 0, one draw y ~ p when sampling. If y is a child of the node the walk descends,
otherwise y is the bonus token and the step ends. For drafts that are deterministic given the
context (n-gram lookup, top-k, best-first trees) this "sample-and-match" rule is lossless: every
emitted token is a draw from p given the text before it, the same draws plain decoding makes. A
p/q ratio test would be biased for such candidates (see ../shared/design/tree-on-llama-cpp.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    path: list[int]  # accepted drafted nodes, root excluded, root-to-leaf order
    tokens: list[int]  # tokens to commit: the accepted nodes' tokens, then the target's bonus token

    @property
    def last_node(self) -> int:
        return self.path[-1] if self.path else 0


def walk(tree: DraftTree, logits: np.ndarray, choose: Callable[[np.ndarray], int]) -> Verdict:
    """`logits[i]` is the target's row for node i; `choose` is the plain decoder's token choice."""
    kids = tree.children()
    node, path, tokens = 0, [], []
    while True:
        y = choose(logits[node])
        tokens.append(y)
        match = next((c for c in kids[node] if tree.tokens[c] == y), None)
        if match is None:
            return Verdict(path, tokens)
        path.append(match)
        node = match
