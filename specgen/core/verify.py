"""Verification: walk the draft tree with the target's choices (p = target, q = draft).

At each node the target picks the next token exactly as plain decoding would: argmax at
temperature 0, one draw y ~ p when sampling. If y is a child of the node the walk descends,
otherwise y is the bonus token and the step ends. For drafts that are deterministic given the
context (n-gram lookup, top-k, best-first trees) this "sample-and-match" rule is lossless: every
emitted token is a draw from p given the text before it, the same draws plain decoding makes. A
p/q ratio test would be biased for such candidates (see ../shared/design/tree-on-llama-cpp.md).
Drafts drawn from the draft's q are verified by rejection sampling instead (walk_rejection), which
may hold deterministic nodes beside the drawn ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

import numpy as np

from specgen.core.constraint import Constraint, all_banned, banned_choice, masked, masked_argmax
from specgen.core.penalties import PathRows
from specgen.core.sampling import Sampler, SamplingParams, draw, truncated
from specgen.core.tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    path: list[int]  # accepted drafted nodes, root excluded, root-to-leaf order
    tokens: list[int]  # tokens to commit: the accepted nodes' tokens, then the target's bonus token
    # Sampled trees: per node whose drawn children were tested, sum_x min(p(x), q(x)) (walk_rejection).
    overlap: dict[int, float] = field(default_factory=dict)

    @property
    def last_node(self) -> int:
        return self.path[-1] if self.path else 0


TargetRows = Union[np.ndarray, PathRows]  # rows[i]: the target's row for node i, as the sampler reads it


def walk(tree: DraftTree, logits: TargetRows, choose: Callable[[np.ndarray], int]) -> Verdict:
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


def walk_rejection(tree: DraftTree, logits: TargetRows, params: SamplingParams, rng: np.random.Generator,
                   constraint: Constraint | None = None) -> Verdict:
    """Recursive rejection sampling, for children drawn from q without replacement, beside which
    a node may also have deterministic children (lookup drafts, fixed before anything was drawn).

    At a node with deterministic children F and drawn children x_1..x_k (in draw order):
      1. If F is not empty, draw y ~ p. If y is in F, descend into it (it was emitted with
         probability p(y), as plain sampling would emit it). Otherwise y is discarded and p <- p
         restricted to the tokens outside F, renormalised: given y is not in F, that is exactly
         the distribution plain sampling emits from. Without drawn children y is the bonus token,
         so a deterministic tree makes the very draws of `walk` (sample-and-match).
      2. Drawn children against that p: accept x_i with probability min(1, p(x_i)/q(x_i)); on
         rejection p <- norm(max(p - q, 0)) and x_i leaves q (renormalised), which keeps the
         next round exact for a draw without replacement. If every child is rejected the bonus
         token is a draw from the last residual p.
    Each round is a rejection step whose result is exactly its p, so the emitted token is a draw
    from the target's p. This needs the candidates at a node to be fixed, or drawn in a number
    fixed, without looking at the draws themselves (a drawn child pruned for its value would bias
    the step), and the verifier's uniforms to be its own. A drawn child equal to one in F meets
    p(x) = 0 and is rejected. It accepts more than sample-and-match, because it uses q.

    The verdict's `overlap` records, per node whose drawn children were tested, sum_x min(p, q)
    over the p they met: the exact probability that the first drawn child is accepted there, an
    estimate of acceptance with less variance than counting accepts (auto learns from it).

    Under a constraint p is the masked target at every node (the grammar's state along the walked
    path): q is left as drawn, so a forbidden draw meets p = 0 and is rejected, exactly.
    """
    kids = tree.children()
    node, path, tokens, overlap = 0, [], [], {}

    def bonus(y: int) -> Verdict:
        if constraint is not None:
            constraint.consume(y)
        return Verdict(path, tokens + [y], overlap)

    while True:
        fixed = [c for c in kids[node] if not tree.drawn[c]]
        q_row = tree.q_rows.get(node)
        drawn = [c for c in kids[node] if tree.drawn[c]] if q_row is not None else []
        row = logits[node] if constraint is None else masked_checked(logits[node], constraint)
        rows = Rows.of(row, params, q_row if drawn else None)
        p = rows.p
        accepted = None
        if fixed:
            y = rows.token(draw(p, rng))
            accepted = next((c for c in fixed if tree.tokens[c] == y), None)
            if accepted is None and not drawn:
                return bonus(y)
            if accepted is None:
                p = outside(p, rows.index([tree.tokens[c] for c in fixed]))
                if p is None:  # p lay wholly on F and y missed it: impossible but for rounding
                    return bonus(y)
        if accepted is None and drawn:
            q = rows.q
            overlap[node] = float(np.minimum(p, q).sum())
            for child in drawn:
                x = rows.index([tree.tokens[child]])[0]  # drawn from q: within its support
                if accepts(rng.random(), p[x], q[x]):
                    accepted = child
                    break
                residual = np.maximum(p - q, 0.0)
                total = residual.sum()
                p = residual / total if total > 0 else p
                q[x] = 0.0
                q_total = q.sum()
                if q_total <= 0:
                    break
                q /= q_total
            if accepted is None:
                return bonus(rows.token(draw(p, rng)))
        if accepted is None:  # no children at all: the bonus token
            return bonus(rows.token(draw(p, rng)))
        if constraint is not None:
            constraint.consume(tree.tokens[accepted])
        tokens.append(tree.tokens[accepted])
        path.append(accepted)
        node = accepted


@dataclass
class Rows:
    """p (and q) at one node over the tokens either can emit: with top-k or top-p that is a few
    hundred of a 262k vocabulary, and each rejection round works on those alone. `ids` are the
    tokens, sorted (None: the whole vocabulary, index = token)."""

    ids: np.ndarray | None
    p: np.ndarray
    q: np.ndarray | None

    @classmethod
    def of(cls, logits: np.ndarray, params: SamplingParams, q_row: np.ndarray | None) -> "Rows":
        keep, z = truncated(logits, params)
        if keep is None:
            return cls(None, z, None if q_row is None else q_row.astype(np.float64, copy=True))
        ids = np.sort(keep) if q_row is None else np.union1d(keep, np.flatnonzero(q_row))
        p = np.zeros(len(ids), dtype=np.float64)
        p[np.searchsorted(ids, keep)] = z
        return cls(ids, p, None if q_row is None else q_row[ids].astype(np.float64))

    def token(self, i: int) -> int:
        return int(i) if self.ids is None else int(self.ids[i])

    def index(self, tokens: list[int]) -> list[int]:
        """Positions of those of `tokens` that p or q can emit (p and q are 0 at the others)."""
        if self.ids is None:
            return list(tokens)
        at = np.searchsorted(self.ids, tokens)
        return [int(i) for t, i in zip(tokens, at) if i < len(self.ids) and self.ids[i] == t]


def accepts(u: float, p_x: float, q_x: float) -> bool:
    """A draw x ~ q is accepted with probability min(1, p(x)/q(x)) (u uniform in [0, 1))."""
    return u * q_x < p_x


def outside(p: np.ndarray, tokens: list[int]) -> np.ndarray | None:
    """p given that the token is none of `tokens` (positions in p); None if p has no mass elsewhere."""
    p = p.copy()
    p[tokens] = 0.0
    total = p.sum()
    return p / total if total > 0 else None


class RowNeeded(Exception):
    """A node decoded without logits (its child forced) where the grammar allows more than one token."""


def choose(sampler: Sampler, row: np.ndarray | None, constraint: Constraint | None = None) -> int:
    """Plain decoding's choice from one logits row: under a constraint, from the masked row, and
    the constraint consumes it (the state the next row is masked with). `row` None (greedy, under
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
        return sampler.sample(row)
    if sampler.params.greedy:
        allowed = constraint.allowed()
        y = masked_argmax(row, allowed)
        if banned_choice(row, allowed, y):
            raise all_banned(allowed, constraint.position())
    else:
        y = sampler.sample(masked_checked(row, constraint))
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


def verify(tree: DraftTree, logits: TargetRows, sampler: Sampler, constraint: Constraint | None = None) -> Verdict:
    """Greedy or deterministic drafts: walk with the plain decoder (its very draws); sampled
    drafts, with or without deterministic nodes beside them: rejection sampling. A constraint
    masks every visited row and ends at the state after the verdict's tokens."""
    if sampler.params.greedy or not tree.sampled:
        return walk(tree, logits, lambda row: choose(sampler, row, constraint))
    return walk_rejection(tree, logits, sampler.params, sampler.rng, constraint)
