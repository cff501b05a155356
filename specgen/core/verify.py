"""Verification: walk the draft tree with the target's choices (p = target, q = draft).

At each node the target chooses the next token exactly as plain decoding would at that position:
argmax at temperature 0, the race winner of core/race.py when sampling (the same seed, position and
row give the same token). If it is a child of the node the walk descends, otherwise it is the bonus
token and the step ends. Every emitted token is then plain decoding's own choice, whoever proposed
the tree and however it is shaped: a child is accepted with the probability that p chooses it, and
a node's children together with the sum of their p. A draft model racing with the same noise
proposes what the target will choose far more often than an independent draw (drafting/model.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from specgen.core.constraint import Constraint, all_banned, banned_choice, masked, masked_argmax
from specgen.core.penalties import PathRows
from specgen.core.sampling import Sampler
from specgen.core.tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    path: list[int]  # accepted drafted nodes, root excluded, root-to-leaf order
    tokens: list[int]  # tokens to commit: the accepted nodes' tokens, then the target's bonus token

    @property
    def last_node(self) -> int:
        return self.path[-1] if self.path else 0


TargetRows = Union[np.ndarray, PathRows]  # rows[i]: the target's row for node i, as the sampler reads it


def walk(tree: DraftTree, logits: TargetRows, choose: Callable[[np.ndarray, int], int]) -> Verdict:
    """`logits[i]` is the target's row for node i; `choose(row, depth)` is the plain decoder's
    choice of the token after a node at that depth (the root's is 0)."""
    kids = tree.children()
    node, depth, path, tokens = 0, 0, [], []
    while True:
        y = choose(logits[node], depth)
        tokens.append(y)
        match = next((c for c in kids[node] if tree.tokens[c] == y), None)
        if match is None:
            return Verdict(path, tokens)
        path.append(match)
        node, depth = match, depth + 1


class RowNeeded(Exception):
    """A node decoded without logits (its child forced) where the grammar allows more than one token."""


def choose(sampler: Sampler, row: np.ndarray | None, position: int, constraint: Constraint | None = None) -> int:
    """Plain decoding's choice from one logits row of the token at `position` (its index in the
    text): under a constraint, from the masked row, and the constraint consumes it (the state the next row is masked with). `row` None (greedy, under
    a grammar): a node decoded without logits because the grammar forces its child; the one token
    the mask allows is the masked argmax of any row (RowNeeded where it allows more)."""
    if row is None:
        allowed = np.flatnonzero(constraint.allowed()) if constraint is not None else ()
        if len(allowed) != 1 or not sampler.params.greedy:
            raise RowNeeded
        y = int(allowed[0])
        constraint.consume(y)
        return y
    if constraint is None:
        return sampler.sample(row, position)
    if sampler.params.greedy:
        allowed = constraint.allowed()
        y = masked_argmax(row, allowed)
        if banned_choice(row, allowed, y):
            raise all_banned(allowed, constraint.position())
    else:
        y = sampler.sample(masked_checked(row, constraint), position)
    constraint.consume(y)
    return y


def masked_checked(row: np.ndarray, constraint: Constraint) -> np.ndarray:
    """The row masked by the constraint's state; a ConstraintError where nothing allowed is left
    (logit_bias at -inf on every allowed token), rather than a draw from no distribution."""
    allowed = constraint.allowed()
    out = masked(row, allowed)
    if out.max() == -np.inf:
        raise all_banned(allowed, constraint.position())
    return out


def verify(tree: DraftTree, logits: TargetRows, sampler: Sampler, n_past: int,
           constraint: Constraint | None = None) -> Verdict:
    """Walk the tree (its root at position `n_past`) with the plain decoder's choices. A
    constraint masks every visited row and ends at the state after the verdict's tokens."""
    return walk(tree, logits, lambda row, depth: choose(sampler, row, n_past + 1 + depth, constraint))
