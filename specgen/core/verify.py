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

from specgen.core.sampling import Sampler, SamplingParams, distribution, draw
from specgen.core.tree import DraftTree


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


def walk_rejection(tree: DraftTree, logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> Verdict:
    """Recursive rejection sampling, for children drawn from q without replacement.

    At an expanded node: try the children in the order they were drawn; accept child x with
    probability min(1, p(x)/q(x)); on rejection p <- norm(max(p - q, 0)) and x leaves q (renormalized).
    If every child is rejected the bonus token is a draw from the residual p. Lossless like plain
    sampling and accepts more than sample-and-match, because it uses q.
    """
    kids = tree.children()
    node, path, tokens = 0, [], []
    while True:
        p = distribution(logits[node], params)
        q_row = tree.q_rows.get(node)
        accepted = None
        if q_row is not None and kids[node]:
            q = q_row.astype(np.float64, copy=True)
            for child in kids[node]:
                x = tree.tokens[child]
                if rng.random() * q[x] < p[x]:
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
            y = draw(p, rng)
            tokens.append(y)
            # A node without q (a deterministic child set) still descends on a match.
            match = None if q_row is not None else next((c for c in kids[node] if tree.tokens[c] == y), None)
            if match is None:
                return Verdict(path, tokens)
            accepted = match
        else:
            tokens.append(tree.tokens[accepted])
        path.append(accepted)
        node = accepted


def verify(tree: DraftTree, logits: np.ndarray, sampler: Sampler) -> Verdict:
    """Greedy or deterministic drafts: walk with the plain decoder; sampled drafts: rejection sampling."""
    if sampler.params.greedy or not tree.sampled:
        return walk(tree, logits, sampler.sample)
    return walk_rejection(tree, logits, sampler.params, sampler.rng)
