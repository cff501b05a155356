"""Choosing what to draft from measured costs and learned acceptance (the `auto` method).

Pure functions and small classes over numbers: the value of a draft tree is the expected number of
tokens a step commits, E = 1 + sum over drafted nodes of P(node accepted); its cost is the draft
work plus c_target(tree size). A node is worth verifying only while it raises E / cost.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specgen.costs.curve import Cost, bounded
from specgen.core.tree import DraftTree
from specgen.drafting.sources import (DRAFT_MODEL_NODE, LOOKUP_NODE, LOOP_NODE, MAJORITY, MAX_MATCH, MINORITY, SINGLE,
                                      UNANIMOUS)


# --- value of a tree -----------------------------------------------------------------------------


def reach_probabilities(parents: Sequence[int], accept: Sequence[float]) -> list[float]:
    """P(node accepted) = P(parent accepted) * P(node accepted | parent accepted); root = 1."""
    reach = [1.0] * len(parents)
    for i in range(1, len(parents)):
        reach[i] = reach[parents[i]] * accept[i]
    return reach


@dataclass(frozen=True)
class Plan:
    nodes: list[int]  # drafted nodes to verify (ancestor-closed, parents first)
    expected_tokens: float  # E[tokens committed by the step], bonus included
    seconds: float  # expected step time: draft cost + c_target(len(nodes) + 1)

    @property
    def rate(self) -> float:
        return self.expected_tokens / self.seconds if self.seconds > 0 else 0.0


def best_subtree(parents: Sequence[int], accept: Sequence[float], c_target: Cost,
                 draft_seconds: float = 0.0, max_nodes: int = 64) -> Plan:
    """The prefix of nodes (by reach probability, which keeps it ancestor-closed) that maximises
    expected tokens per second. Plain decoding is the empty prefix: E = 1, cost c_target(1)."""
    reach = reach_probabilities(parents, accept)
    order = sorted(range(1, len(parents)), key=lambda v: (-reach[v], v))[:max_nodes]
    best = Plan([], 1.0, draft_seconds + c_target(1))
    expected = 1.0
    for k, v in enumerate(order, 1):
        expected += reach[v]
        plan_s = draft_seconds + c_target(k + 1)
        if expected / plan_s > best.rate:
            best = Plan(sorted(order[:k]), expected, plan_s)
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


# --- acceptance model ----------------------------------------------------------------------------


@dataclass
class BetaBins:
    """P(accept | bin) as Beta posteriors; the prior mean per bin and its weight in pseudo-counts.

    Old evidence fades (`decay` per update of a bin), so the estimate follows the text at hand: a
    prompt full of copied passages and a page of arithmetic accept lookup drafts very differently.
    """

    prior: np.ndarray
    weight: float = 3.0
    decay: float = 0.97
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


Q_BINS = 10
# Lookup nodes are keyed by their effective match length: the source occurrence's match length
# plus the drafted tokens before the node (an accepted parent extends the match by one).
# Lower edges. A continuation of a 40-token match is a passage being copied: llama.cpp's ngram-mod
# drafts only those (24-token matches, 48-64 tokens at once), and they are accepted nearly always.
MATCH_BINS = (1, 2, 3, 4, 5, 7, 10, 15, 24, 40)
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

    # Per MATCH_BINS. A copy of 24+ matched tokens (a passage quoted from the prompt) goes on
    # correctly: 24-39 tokens 122 of 124 nodes on gemma F32 (30 Spec-Bench prompts), 0.98 on gemma
    # Q4_K_M (65); 40+ 58 of 59 and 0.997. At the 0.95 and 0.97 these were first given, a fresh
    # planner on gemma F32's curve drafted 19-23 tokens of q257's 39-token quote, then the rest in a
    # second verification, where llama.cpp's ngram modes verified it all at once (0.8x them).
    LOOKUP_PRIOR = (0.2, 0.3, 0.45, 0.6, 0.7, 0.8, 0.87, 0.92, 0.98, 0.99)
    # Per support class (SINGLE's is the source's own prior), a little below the measurement (see
    # SINGLE); where a class's tuple ends, the source's own prior goes on.
    # A split n-gram under a long match (MAJORITY, MINORITY) is where copies part: it keeps the
    # lower estimates.
    SUPPORT_PRIOR = {UNANIMOUS: (0.6, 0.8, 0.88, 0.88, 0.92, 0.94),
                     MAJORITY: (0.5, 0.5, 0.5, 0.55, 0.6, 0.75, 0.87, 0.92, 0.95, 0.97),
                     MINORITY: (0.15, 0.25, 0.15, 0.3, 0.3, 0.5, 0.7, 0.8, 0.85, 0.9)}
    # Loops (LOOP_NODE): gemma 270M Q4_K_M on 65 Spec-Bench prompts accepted 2,726 of 2,726 loop
    # nodes, against 0.98 for copies of 24-39 matched tokens.
    LOOP_PRIOR = (0.2, 0.3, 0.45, 0.6, 0.7, 0.99, 0.99, 0.99, 0.995, 0.995)  # (below 7: never a loop)

    def __init__(self) -> None:
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
            bins.hits *= 0.5
            bins.trials *= 0.5

    def observe(self, tree: DraftTree, evidence: Sequence[NodeEvidence | None], path: Sequence[int]) -> None:
        """Each node whose parent was accepted was tested: accepted iff it is on the path.
        `evidence[v]`: which estimate node v was planned with (None for the root)."""
        on_path = {0, *path}
        for v in range(1, len(tree)):
            if tree.parents[v] not in on_path:
                continue
            e = evidence[v]
            if e is None:  # learned elsewhere (a sampled draft node: SampledAcceptance)
                continue
            bins = self.draft if e.source == DRAFT_MODEL_NODE else self.bins(e.source)
            bins.update(e.bin, v in on_path)


# --- the draft model's first-token acceptance and cost per drafted token --------------------------

ALPHA_PRIOR = 0.7  # optimistic on purpose: an option the planner never tries is never learned
ALPHA_EMA = 0.1  # weight of one step's outcome in the first-token acceptance
STEP_COST_EMA = 0.2  # weight of one proposal's measured cost per drafted token
EFFICIENCY_EMA = 0.1  # weight of one draft step's realised rate over its planned rate
# The estimate may sit above 1 (steps around a mean of 1 must be able to), but only this far: a
# long lucky stretch must not bank credit that keeps a draft going once its text turns hard.
EFFICIENCY_CREDIT = 1.5
# What is known of the draft is learned only from the steps that use it. Per step without it, each
# estimate (acceptance, cost per drafted token, the machine's speed for it) drifts back by this
# much towards its prior, so one bad stretch (or a cold first decode) cannot rule it out for good.
RELAX = 0.02
# Except the draft's efficiency (DraftEstimate): what a draft step's model leaves out belongs to
# the pair and the machine more than to the text. Relaxed at RELAX, it was back near 1 by each new
# text (~100 steps without the draft on pair A) and the draft was tried again at its plan's rate:
# 92 draft steps on 30 pair A prompts ran at 20 tok/s where plain steps ran at 26.
EFFICIENCY_RELAX = RELAX / 10


@dataclass
class DraftEstimate:
    """What auto has learned about the draft model: how often its first drafted token is accepted
    (alpha: a draft chain's tokens are planned as each accepted with probability alpha given the
    one before), and what a drafted token really costs, Python work on a vocabulary-sized row
    included (None until measured: then the curve's c_draft(1))."""

    alpha: float = ALPHA_PRIOR
    step_s: float | None = None
    # Realised over planned tokens per second of the steps that used the draft: what the model of
    # a draft step leaves out scales its rate. Time: catch-up, KV edits, tree work, a bigger
    # verified tree. Tokens: the chain model takes every drafted token as likely as the first;
    # on q81's creative text (gemma F32, -d self) first tokens were accepted 65-80% of the time,
    # the steps planned 2.24 tokens and committed 1.59, in the time planned (66 ms): 24 tok/s
    # where plain steps made 28, and auto kept drafting. An EMA of each step's ratio (unbiased:
    # a step commits 1 to k+1 tokens around its mean); the plan uses at most 1 (usable()). It
    # fades back towards 1 ten times slower than alpha (EFFICIENCY_RELAX).
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


# --- sampled drafts: acceptance learned from the overlap of p and q --------------------------------

# Depth bins (lower edges) and confidence bins (the draft's top probability at the parent) of a
# sampled draft node.
SAMPLED_DEPTHS = (1, 2, 3, 4, 6, 9)
CONF_BINS = 5
OVERLAP_DECAY = 0.98  # per update of a bin: the estimate follows the text at hand
OVERLAP_WEIGHT = 4.0  # the prior's weight, in observations (one first token's overlap varies widely)
# Optimistic on purpose, as ALPHA_PRIOR: at 0.7 a fresh planner on gemma F32's curve (-d self, T=0.8)
# seldom tried the draft, so never learned its real overlap: 0.87 at depth 1, 0.96-1.0 below.
OVERLAP_PRIOR = 0.85


class SampledAcceptance:
    """How likely a token drawn from q is accepted by rejection sampling, learned online.

    A q-sampled child of a node is accepted with probability sum_x min(p(x), q(x)) = 1 - TV(p, q),
    which verification computes exactly at every node whose drawn children it tested
    (Verdict.overlap): learning from that expectation instead of a 0/1 outcome needs fewer steps
    for the same precision. Kept by depth and by the draft's confidence at the parent (its q row's
    top probability: a flat q beside a flat p still overlaps, a sure q that is wrong does not),
    and by depth alone, for planning a chain before any row is seen.
    """

    def __init__(self, prior: float = OVERLAP_PRIOR):
        shape = (len(SAMPLED_DEPTHS), CONF_BINS)
        conf = (np.arange(CONF_BINS) + 0.5) / CONF_BINS
        # Prior: the draft's confidence nudges it; the weight lets a few steps overrule it.
        self.prior = np.broadcast_to(np.clip(prior - 0.2 + 0.4 * conf, 0.05, 0.95), shape).copy()
        self.sums = np.zeros(shape)
        self.counts = np.zeros(shape)
        self.depth_prior = np.full(len(SAMPLED_DEPTHS), prior)
        self.depth_sums = np.zeros(len(SAMPLED_DEPTHS))
        self.depth_counts = np.zeros(len(SAMPLED_DEPTHS))

    @staticmethod
    def depth_bin(depth: int) -> int:
        return max(0, bisect.bisect_right(SAMPLED_DEPTHS, depth) - 1)

    @staticmethod
    def conf_bin(confidence: float) -> int:
        return min(CONF_BINS - 1, max(0, int(confidence * CONF_BINS)))

    def p(self, depth: int, confidence: float) -> float:
        return float(self._means()[self.depth_bin(depth), self.conf_bin(confidence)])

    def by_depth(self, max_depth: int) -> list[float]:
        """The acceptance at depths 1..max_depth, whatever the confidence (for planning a chain)."""
        means = self._depth_means()
        return [float(means[self.depth_bin(d)]) for d in range(1, max_depth + 1)]

    # A depth not drafted yet starts from the depth above it (its prior is that depth's estimate):
    # drawn tokens are accepted about as often deep as shallow, and a fixed prior below what the
    # first depths have shown would keep chains from ever growing to learn otherwise.
    def _means(self) -> np.ndarray:
        return _chained(self.prior[0], self.sums, self.counts)

    def _depth_means(self) -> np.ndarray:
        return _chained(self.depth_prior[0], self.depth_sums, self.depth_counts)

    def observe(self, depth: int, confidence: float, overlap: float) -> None:
        d, c = self.depth_bin(depth), self.conf_bin(confidence)
        self.sums[d, c] = self.sums[d, c] * OVERLAP_DECAY + overlap
        self.counts[d, c] = self.counts[d, c] * OVERLAP_DECAY + 1
        self.depth_sums[d] = self.depth_sums[d] * OVERLAP_DECAY + overlap
        self.depth_counts[d] = self.depth_counts[d] * OVERLAP_DECAY + 1

    def new_text(self) -> None:
        self._fade(0.5)

    def relax(self) -> None:
        """A step without the draft: drift back towards the prior (see RELAX)."""
        self._fade(1.0 - RELAX)

    def _fade(self, factor: float) -> None:
        for a in (self.sums, self.counts, self.depth_sums, self.depth_counts):
            a *= factor


def _chained(first_prior, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per depth bin (axis 0), the mean of its observations with the bin above as the prior."""
    means = np.empty_like(sums, dtype=np.float64)
    for d in range(sums.shape[0]):
        prior = first_prior if d == 0 else means[d - 1]
        means[d] = (prior * OVERLAP_WEIGHT + sums[d]) / (OVERLAP_WEIGHT + counts[d])
    return means


# --- no-regret guard -----------------------------------------------------------------------------

PROBE_EVERY, MAX_PROBE_EVERY = 16, 256  # speculative steps between plain probes (see PlainSpeed)
PROBE_CLEAR_WIN = 1.3  # speculation this much faster than plain: probe half as often
PLAIN_EMA = 0.3  # weight of one plain step in plain decoding's measured time


@dataclass
class PlainSpeed:
    """Plain decoding's speed, measured in this run: the guard holds speculation to it, not to the
    cost model, so a wrong curve (a poisoned cache, a machine that got busy) cannot hide a loss.

    Steps that draft nothing are plain steps; when speculation keeps choosing to draft, every
    `interval` speculative steps one step is a plain probe. A probe costs a step's worth of
    speedup, so the interval doubles (up to MAX_PROBE_EVERY) while speculation since the last
    plain step clearly wins (PROBE_CLEAR_WIN), and falls back to PROBE_EVERY when it does not.
    """

    seconds: float | None = None  # a plain step, EMA; None until one is measured
    interval: int = PROBE_EVERY
    since: int = 0  # speculative steps since the last plain one
    _tokens: int = 0  # committed by those speculative steps
    _spec_s: float = 0.0  # and their seconds

    def due(self) -> bool:
        return self.since >= self.interval

    def rate(self, modelled: float) -> float:
        """Plain tokens per second: measured, or `modelled` until a plain step has been timed."""
        return 1.0 / self.seconds if self.seconds else modelled

    def observe_plain(self, seconds: float) -> None:
        if self._spec_s > 0 and self.seconds:
            wins = self._tokens / self._spec_s > PROBE_CLEAR_WIN / self.seconds
            self.interval = min(MAX_PROBE_EVERY, self.interval * 2) if wins else PROBE_EVERY
        if self.seconds is None:
            self.seconds = seconds
        else:  # one hiccup (a 586 ms step among 32 ms ones) must not make speculation look like a win for long
            self.seconds += (bounded(seconds, self.seconds) - self.seconds) * PLAIN_EMA
        self.since, self._tokens, self._spec_s = 0, 0, 0.0

    def observe_speculative(self, tokens: int, seconds: float) -> None:
        self.since += 1
        self._tokens += tokens
        self._spec_s += seconds


class Guard:
    """Back off to plain decoding when speculation is realised slower than plain; probe later.

    Keeps the realised tokens/second of the last `window` speculative steps and compares it with
    plain decoding's measured speed; after a loss, plain for `backoff` steps (doubling on repeated
    losses, reset after a win), then speculation gets another chance. Long steps are judged sooner:
    once at least `min_steps` of them committed `window_tokens` (32 steps of 64-token chains would
    be 2,000 tokens of losing).
    """

    def __init__(self, window: int = 32, margin: float = 0.95, backoff: int = 16, max_backoff: int = 256,
                 min_steps: int = 4, window_tokens: int = 128):
        self.window, self.margin = window, margin
        self.min_steps, self.window_tokens = min_steps, window_tokens
        self.base_backoff, self.backoff, self.max_backoff = backoff, backoff, max_backoff
        self.steps: deque[tuple[int, float]] = deque(maxlen=window)
        self.plain_left = 0

    def allow_speculation(self) -> bool:
        if self.plain_left > 0:
            self.plain_left -= 1
            return False
        return True

    def record(self, tokens: int, seconds: float, plain_rate: float) -> None:
        self.steps.append((tokens, seconds))
        committed = sum(t for t, _ in self.steps)
        if len(self.steps) < self.window and (len(self.steps) < self.min_steps or committed < self.window_tokens):
            return
        rate = committed / max(1e-9, sum(s for _, s in self.steps))
        if rate < self.margin * plain_rate:
            self.plain_left = self.backoff
            self.backoff = min(self.max_backoff, self.backoff * 2)
            self.steps.clear()
        elif rate > plain_rate:
            self.backoff = self.base_backoff
