"""The value of a draft tree: the expected number of tokens a step commits, E = 1 + sum over drafted
nodes of P(node accepted), against its cost, draft work plus c_target(tree size). A node is worth
verifying only while it raises E / cost. Pure functions over numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specgen.core.tree import DraftTree
from specgen.costs.curve import Cost
from specgen.drafting.sources import LOOP_NODE
from specgen.drafting.tuning import MAX_ACCEPT, MAX_ACCEPT_LOOP


# --- value of a tree -----------------------------------------------------------------------------


def reach_probabilities(parents: Sequence[int], accept: Sequence[float]) -> list[float]:
    """P(node accepted) = P(parent accepted) * P(node accepted | parent accepted); root = 1."""
    reach = [1.0] * len(parents)
    for i in range(1, len(parents)):
        reach[i] = reach[parents[i]] * accept[i]
    return reach


@dataclass(frozen=True)
class Subtree:
    nodes: list[int]  # drafted nodes to verify (ancestor-closed, parents first)
    expected_tokens: float  # E[tokens committed by the step], bonus included
    seconds: float  # expected step time: draft cost + c_target(len(nodes) + 1)

    @property
    def rate(self) -> float:
        return self.expected_tokens / self.seconds if self.seconds > 0 else 0.0


def best_subtree(parents: Sequence[int], accept: Sequence[float], c_target: Cost,
                 draft_seconds: float = 0.0, max_nodes: int = 64) -> Subtree:
    """The prefix of nodes (by reach probability, which keeps it ancestor-closed) that maximises
    expected tokens per second. Plain decoding is the empty prefix: E = 1, cost c_target(1)."""
    reach = reach_probabilities(parents, accept)
    order = sorted(range(1, len(parents)), key=lambda v: (-reach[v], v))[:max_nodes]
    best = Subtree([], 1.0, draft_seconds + c_target(1))
    expected = 1.0
    for k, v in enumerate(order, 1):
        expected += reach[v]
        plan_s = draft_seconds + c_target(k + 1)
        if expected / plan_s > best.rate:
            best = Subtree(sorted(order[:k]), expected, plan_s)
    return best


def best_chain_length(alpha: float | Sequence[float], c_target: Cost, c_draft_step: float, max_len: int,
                      c_draft_fixed: float = 0.0, tokens_left: int | None = None) -> tuple[int, float]:
    """For a draft chain whose tokens are accepted with probability alpha each (given the one
    before; a sequence: alpha[d - 1] at depth d, its last value beyond), the length k maximising
    E[tokens]/cost and that rate; k = 0 is plain decoding.
    E = 1 + alpha + ... + alpha^k; cost = this step's share of the fixed draft cost + k draft
    steps + c_target(k + 1). The fixed cost (catching the draft's cache up: the whole prompt, the
    first time) is paid once for every later step, so a step is charged the share of it that
    its tokens are of the `tokens_left` to write; charged whole, a long prompt would keep a
    draft that pays from ever starting."""
    best_k, best_rate = 0, 1.0 / c_target(1)
    expected, p = 1.0, 1.0
    alphas = _per_depth(alpha)
    for k in range(1, max_len + 1):
        p *= alphas[min(k, len(alphas)) - 1]
        expected += p
        share = min(1.0, expected / tokens_left) if tokens_left else 1.0
        rate = expected / (c_draft_fixed * share + k * c_draft_step + c_target(k + 1))
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k, best_rate


def chain_expected(alpha: float | Sequence[float], k: int) -> float:
    """E[tokens] of a k-token chain accepted with alpha (one value, or per depth as in
    best_chain_length), the bonus token included."""
    alphas = _per_depth(alpha)
    expected, reach = 1.0, 1.0
    for d in range(1, k + 1):
        reach *= alphas[min(d, len(alphas)) - 1]
        expected += reach
    return expected


def _per_depth(alpha: float | Sequence[float]) -> list[float]:
    return [alpha] if isinstance(alpha, (int, float)) else list(alpha)


# --- no estimate is certainty --------------------------------------------------------------------
# A node's acceptance, or its siblings' together (they are exclusive outcomes), is capped, or every
# depth would look free: the cap bounds how deep a chain can pay (docs/auto.md, "Tuned constants").


def cap(source: str) -> float:
    return MAX_ACCEPT_LOOP if source == LOOP_NODE else MAX_ACCEPT


def cap_siblings(tree: DraftTree, accept: list[float], caps: list[float] | None = None) -> list[float]:
    """Siblings are exclusive: their acceptance estimates may sum to at most the cap (per node,
    `caps`; default MAX_ACCEPT; siblings together: their highest). Each estimate was learned as
    if its node stood alone, so the likeliest keeps its own and the others share what is left, in
    order: a 4-token match beside a loop cannot halve the loop's estimate (scaling them all by
    their sum did, and cut 31-token loop chains to 15)."""
    out = list(accept)
    caps = caps or [MAX_ACCEPT] * len(accept)
    for kids in tree.children():
        if not kids:
            continue
        kids = sorted(kids, key=lambda c: -out[c])
        left = max(caps[c] for c in kids)
        for c in kids:
            out[c] = min(out[c], caps[c], left)
            left -= out[c]
    return out
