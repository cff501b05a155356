"""The plans `auto` chooses between each step, as small values: what a plan drafts, the tokens it is
expected to commit and the seconds it is expected to take (from the cost curves, the acceptance
estimates and the measured overhead of a step). auto.py enumerates them, prices them, runs the best.

  plain         1 token for c(1)
  lookup        a lookup tree's best nodes: E = 1 + sum of their reach, for c(1 + nodes)
  draft         the draft model's chain of k tokens: E = 1 + a_1 + a_1 a_2 + ..., for k draft
                decodes (and a share of its catch-up) + c(1 + k)
  draft+lookup  sampled only: the chain with the lookup nodes beside it at the root; the chain's
                first token, drawn from q without theirs, matters only when they are rejected
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specgen.core.tree import DraftTree
from specgen.costs.curve import Cost
from specgen.drafting.acceptance import NodeEvidence, SampledAcceptance
from specgen.drafting.value import Subtree, chain_expected, reach_probabilities

PLAIN, LOOKUP, DRAFT, GRAFT = "plain", "lookup", "draft", "draft+lookup"


@dataclass(frozen=True, eq=False)
class StopRule:
    """When a sampled draft chain stops: the token at depth d is drawn only while its expected gain,
    reach * acceptance(d, the draft's confidence at its parent), pays for its time (a draft decode
    and one more row in the target's batch) at the plan's rate. Decided from the parent's q row
    before anything is drawn from it, so rejection sampling stays exact."""

    floor: float  # seconds of one more token, times the plan's tokens per second
    acceptance: np.ndarray  # SampledAcceptance's estimate by (depth bin, confidence bin), at planning

    def __call__(self, depth: int, confidence: float, reach: float) -> float | None:
        """The children's reach, or None: do not draw them."""
        p = self.acceptance[SampledAcceptance.depth_bin(depth), SampledAcceptance.conf_bin(confidence)]
        gain = reach * float(p)
        return gain if gain >= self.floor else None


@dataclass(frozen=True)
class LookupOffer:
    """This step's lookup tree, with each node's estimate (capped) and where it came from, and the
    nodes worth verifying by target cost alone."""

    tree: DraftTree
    accept: list[float]
    evidence: list[NodeEvidence | None]
    best: Subtree


@dataclass(frozen=True)
class StepPlan:
    kind: str  # PLAIN | LOOKUP | DRAFT | GRAFT
    expected_tokens: float
    seconds: float
    lookup_nodes: tuple[int, ...] = ()  # of the step's LookupOffer tree
    draft_len: int = 0  # the draft chain's length
    # How far the measured record of this kind of plan lets its modelled rate be trusted (draft plans:
    # DraftEstimate.usable()); the pick compares rate * trust.
    trust: float = 1.0
    stop: StopRule | None = field(default=None, compare=False)

    @property
    def rate(self) -> float:
        return self.expected_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def score(self) -> float:
        return self.rate * self.trust

    @property
    def uses_draft(self) -> bool:
        return self.draft_len > 0


def plain_plan(cost: Cost) -> StepPlan:
    return StepPlan(PLAIN, 1.0, cost(1))


def lookup_plan(offer: LookupOffer | None) -> list[StepPlan]:
    if offer is None or not offer.best.nodes:
        return []
    return [StepPlan(LOOKUP, offer.best.expected_tokens, offer.best.seconds, tuple(offer.best.nodes))]


def graft_plan(chain: StepPlan, offer: LookupOffer | None, cost: Cost) -> StepPlan | None:
    """The sampled chain with the lookup plan's nodes beside it: they are verified first at the root,
    and the chain counts only when they are rejected. None when lookup has nothing to offer."""
    if offer is None or not offer.best.nodes:
        return None
    tree, nodes = offer.tree, offer.best.nodes
    reach = reach_probabilities(tree.parents, offer.accept)
    first = min(1.0, sum(reach[v] for v in nodes if tree.parents[v] == 0))
    expected = offer.best.expected_tokens + (1.0 - first) * (chain.expected_tokens - 1.0)
    k = chain.draft_len
    seconds = chain.seconds - cost(k + 1) + cost(k + 1 + len(nodes))
    return StepPlan(GRAFT, expected, seconds, tuple(nodes), k, chain.trust)


def replanned(plan: StepPlan, drafted: int, alpha: list[float], draft_step_s: float, cost: Cost) -> StepPlan:
    """A sampled chain its stop rule ended after `drafted` of its k tokens: priced as drafted."""
    k = plan.draft_len
    seconds = plan.seconds - (k - drafted) * draft_step_s - cost(k + 1) + cost(drafted + 1)
    return StepPlan(plan.kind, chain_expected(alpha, drafted), seconds, plan.lookup_nodes, drafted, plan.trust,
                    plan.stop)


def grafted(tree: DraftTree, lookup: DraftTree, nodes: tuple[int, ...], evidence: list[NodeEvidence | None]
            ) -> tuple[DraftTree, list[NodeEvidence | None]]:
    """The draft's tree with `nodes` of the lookup tree added as deterministic nodes (after the
    draft's own, so the draft's node indices, which its KV bookkeeping uses, stay as they are)."""
    out = DraftTree(list(tree.tokens), list(tree.parents), list(tree.q), dict(tree.q_rows), list(tree.drawn))
    kept: list[NodeEvidence | None] = [None] * len(tree)
    index = {0: 0}
    for v in sorted(nodes):
        index[v] = out.add(lookup.tokens[v], index[lookup.parents[v]])
        kept.append(evidence[v])
    return out, kept
