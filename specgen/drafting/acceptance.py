"""What `auto` learns about acceptance: how likely a drafted node is accepted, by where it came from.

Lookup nodes by effective match length and support (AcceptanceModel), draft-model nodes by their q
(at T > 0 the draft races with the target's noise: the same bins learn how often its winner is the
target's), and the draft model's first-token acceptance and cost per drafted token (DraftEstimate). Estimates are Beta posteriors over bins whose priors are in tuning.py.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specgen.core.tree import DraftTree
from specgen.costs.curve import bounded
from specgen.drafting.sources import DRAFT_MODEL_NODE, LOOKUP_NODE, LOOP_NODE, MAX_MATCH, SINGLE
from specgen.drafting.tuning import (ALPHA_EMA, ALPHA_PRIOR, BIN_DECAY, BIN_WEIGHT, LOOKUP_PRIOR, LOOP_PRIOR,
                                     MATCH_BINS, NEW_TEXT_FADE, Q_BINS, RACE_FIRST, RACE_LATER, RACE_MARGIN_KNOTS,
                                     RACE_SECOND, RELAX, STEP_COST_EMA, SUPPORT_PRIOR,
                                     EFFICIENCY_CREDIT, EFFICIENCY_EMA, EFFICIENCY_RELAX)


@dataclass
class BetaBins:
    """P(accept | bin) as Beta posteriors; the prior mean per bin and its weight in pseudo-counts.

    Old evidence fades (`decay` per update of a bin), so the estimate follows the text at hand: a
    prompt full of copied passages and a page of arithmetic accept lookup drafts very differently.
    """

    prior: np.ndarray
    weight: float = BIN_WEIGHT
    decay: float = BIN_DECAY
    hits: np.ndarray = field(init=False)
    trials: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.hits = np.zeros_like(self.prior, dtype=np.float64)
        self.trials = np.zeros_like(self.prior, dtype=np.float64)

    def mean(self, b: int) -> float:
        return float((self.prior[b] * self.weight + self.hits[b]) / (self.weight + self.trials[b]))

    def update(self, b, accepted: bool) -> None:
        self.hits[b] = self.hits[b] * self.decay + accepted
        self.trials[b] = self.trials[b] * self.decay + 1


MATCH_BIN_TOPS = tuple(b - 1 for b in MATCH_BINS[1:]) + (MAX_MATCH,)


@dataclass(frozen=True)
class NodeEvidence:
    """What a drafted node's acceptance was estimated from: its source and the bin of that
    source's estimate (lookup: effective match length; draft model: q)."""

    source: str  # LOOKUP_NODE | LOOP_NODE | DRAFT_MODEL_NODE | a history.py source
    bin: int


class AcceptanceModel:
    """How likely a drafted node is accepted given its parent was, learned online.

    Draft-model nodes: by the draft probability q of the node (10 bins; prior = q, a calibrated
    draft accepts about q of the time). Lookup nodes: by effective match length m (the node at
    depth d of a continuation whose source matched the text's last l tokens has m = l + d - 1):
    copying a passage (m of 10-30) continues correctly far more often than a 1-3 token
    coincidence. The prior rises from 0.2 (m = 1) to 0.99 (m >= 40); each new text (`new_text`)
    halves the old evidence, as prompts differ in how much they repeat.
    """

    LOOKUP_PRIOR, SUPPORT_PRIOR, LOOP_PRIOR = LOOKUP_PRIOR, SUPPORT_PRIOR, LOOP_PRIOR  # tuning.py

    def __init__(self) -> None:
        # A draft node's prior is its q: greedy, the draft's probability of its token; sampling,
        # race_estimates() below (q alone says little of a race whose noise both models share).
        self.draft = BetaBins((np.arange(Q_BINS) + 0.5) / Q_BINS)
        self.lookup = BetaBins(self._prior(self.LOOKUP_PRIOR))
        # Other texts than the current one (history.py's sources) are learned separately: a match
        # in last week's generations says less than the same match in this text.
        self.sources: dict[str, BetaBins] = {LOOKUP_NODE: self.lookup}

    @classmethod
    def _prior(cls, single: tuple[float, ...]) -> np.ndarray:
        """Bins for (support, match bin), support-major: a source's prior, then each class's."""
        rows = [single] + [prior + single[len(prior):] for prior in cls.SUPPORT_PRIOR.values()]
        return np.array(rows, dtype=np.float64).ravel()

    def bins(self, source: str) -> BetaBins:
        if source not in self.sources:
            self.sources[source] = BetaBins(self._prior(self.LOOP_PRIOR if source == LOOP_NODE else self.LOOKUP_PRIOR))
        return self.sources[source]

    @staticmethod
    def q_bin(q: float) -> int:
        return min(Q_BINS - 1, int(q * Q_BINS))

    @staticmethod
    def lookup_bin(match_len: int, depth: int, support: int = SINGLE) -> int:
        """The bin of a node at `depth` of a continuation matched on `match_len` tokens, with the
        support its n-gram's other occurrences give it."""
        length = match_len + depth - 1
        return bisect.bisect_right(MATCH_BINS, length) - 1 + support * len(MATCH_BINS)

    def draft_p(self, q: float) -> float:
        return self.draft.mean(self.q_bin(q))

    def lookup_p(self, match_len: int, depth: int, source: str = LOOKUP_NODE, support: int = SINGLE) -> float:
        return self.bins(source).mean(self.lookup_bin(match_len, depth, support))

    def lookup_evidence(self, match_len: int, depth: int, source: str = LOOKUP_NODE,
                        support: int = SINGLE) -> NodeEvidence:
        return NodeEvidence(source, self.lookup_bin(match_len, depth, support))

    def draft_evidence(self, q: float) -> NodeEvidence:
        return NodeEvidence(DRAFT_MODEL_NODE, self.q_bin(q))

    def new_text(self) -> None:
        for bins in (*self.sources.values(), self.draft):
            bins.hits *= NEW_TEXT_FADE
            bins.trials *= NEW_TEXT_FADE

    def observe(self, tree: DraftTree, evidence: Sequence[NodeEvidence | None], path: Sequence[int]) -> None:
        """Each node whose parent was accepted was tested: accepted iff it is on the path.
        `evidence[v]`: which estimate node v was planned with (None for the root)."""
        on_path = {0, *path}
        for v in range(1, len(tree)):
            if tree.parents[v] not in on_path:
                continue
            e = evidence[v]
            if e is None:
                continue
            bins = self.draft if e.source == DRAFT_MODEL_NODE else self.bins(e.source)
            bins.update(e.bin, v in on_path)


def race_estimates(scores: Sequence[float]) -> list[float]:
    """For a draft's first race finishers (their scores, best first): how likely each is the
    target's winner. The margin between the first two is how far the target's logits may differ
    from the draft's before the order changes: near 0 the runner-up wins a third of the time,
    beyond 3 (logit units) the winner nearly always (tuning.py's knots)."""
    if not scores:
        return []
    margin = scores[0] - scores[1] if len(scores) > 1 else np.inf
    first = float(np.interp(margin, RACE_MARGIN_KNOTS, RACE_FIRST))
    second = float(np.interp(margin, RACE_MARGIN_KNOTS, RACE_SECOND))
    return [first, second, *[second * RACE_LATER] * (len(scores) - 2)][:len(scores)]


# --- the draft model's first-token acceptance and cost per drafted token --------------------------

@dataclass
class DraftEstimate:
    """What auto has learned about the draft model: how often its first drafted token is accepted
    (alpha: a draft chain's tokens are planned as each accepted with probability alpha given the
    one before), and what a drafted token really costs, Python work on a vocabulary-sized row
    included (None until measured: then the curve's c_draft(1))."""

    alpha: float = ALPHA_PRIOR
    step_s: float | None = None
    # Realised over planned tokens per second of the steps that used the draft: what the model of
    # a draft step leaves out (the chain model takes every drafted token as likely as the first)
    # scales its rate, at most to 1 (usable()); it fades back ten times slower than alpha
    # (docs/auto.md, "Guards" and "Tuned constants").
    efficiency: float = 1.0

    def step_cost(self, c_draft_1: float) -> float:
        return max(c_draft_1, self.step_s or 0.0)

    def observe_first_token(self, accepted: bool) -> None:
        self.alpha = (1 - ALPHA_EMA) * self.alpha + ALPHA_EMA * accepted

    def observe_step_cost(self, per_token_s: float, c_draft_1: float) -> None:
        # One step's measurement pulls at most as one at twice the estimate would (costs.curve.OUTLIER):
        # after a hiccup the draft would otherwise sit out until RELAX brought it back.
        last = c_draft_1 if self.step_s is None else self.step_s
        self.step_s = (1 - STEP_COST_EMA) * last + STEP_COST_EMA * bounded(per_token_s, last)

    def observe_step(self, planned_tokens: float, planned_s: float, tokens: int, seconds: float) -> None:
        # Only the time is bounded (a hiccup, costs.curve.OUTLIER): the tokens are the outcome measured.
        pace = bounded(planned_s / max(seconds, 1e-9), 1.0)
        self.efficiency += (tokens / planned_tokens * pace - self.efficiency) * EFFICIENCY_EMA
        self.efficiency = min(EFFICIENCY_CREDIT, self.efficiency)

    def usable(self) -> float:
        """The factor on the draft's modelled rate: never above the model (a draft that beat its
        plan for a while is not planned as better than it)."""
        return min(1.0, self.efficiency)

    def relax(self, c_draft_1: float) -> None:
        """A step without the draft: drift back towards the priors (see RELAX)."""
        self.alpha += (ALPHA_PRIOR - self.alpha) * RELAX
        self.efficiency += (1.0 - self.efficiency) * EFFICIENCY_RELAX
        if self.step_s is not None:
            self.step_s += (c_draft_1 - self.step_s) * RELAX
