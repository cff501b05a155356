"""The plans `auto` chooses between each step, as small values: what a plan drafts, the tokens it is
expected to commit and the seconds it is expected to take (from the cost curves, the acceptance
estimates and the measured overhead of a step). auto.py enumerates them, prices them, runs the best.

  plain         1 token for c(1)
  lookup        a lookup tree's best nodes: E = 1 + sum of their reach, for c(1 + nodes)
  draft         the draft model's chain of k tokens: E = 1 + a_1 + a_1 a_2 + ..., for k draft
                decodes (and a share of its catch-up) + c(1 + k)
"""

from __future__ import annotations

from dataclasses import dataclass

from specgen.core.tree import DraftTree
from specgen.costs.curve import Cost
from specgen.drafting.acceptance import NodeEvidence
from specgen.drafting.value import Subtree

PLAIN, LOOKUP, DRAFT = "plain", "lookup", "draft"


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
    kind: str  # PLAIN | LOOKUP | DRAFT
    expected_tokens: float
    seconds: float
    lookup_nodes: tuple[int, ...] = ()  # of the step's LookupOffer tree
    draft_len: int = 0  # the draft chain's length
    # How far the measured record of this kind of plan lets its modelled rate be trusted (draft plans:
    # DraftEstimate.usable()); the pick compares rate * trust.
    trust: float = 1.0

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
