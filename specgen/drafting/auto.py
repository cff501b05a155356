"""`--method auto`: each step, enumerate the plans it could run, price them, run the best.

    plans = plain, lookup's best tree, the draft model's chain
    price = expected tokens / expected seconds          (plans.py, from the curves and estimates)
    pick  = the best rate among the kinds the guards allow

A plan's seconds are the cost curves' decodes plus the overhead of a step as measured (guards.py);
what a node is worth comes from the acceptance estimates (acceptance.py). Before any of it, two
steps are plain by rule: a probe, now and then, times plain decoding in this run (the guards hold
every kind of plan to it), and a step with no room left to draft. Whatever runs is lossless:
verification decides what is committed.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Protocol

from specgen.core.sampling import Sampler
from specgen.core.tree import DraftTree
from specgen.core.verify import Verdict
from specgen.costs.curve import Cost, CostCurve
from specgen.drafting.acceptance import MATCH_BIN_TOPS, AcceptanceModel, DraftEstimate, NodeEvidence
from specgen.drafting.guards import KindGuards, Overhead, PlainSpeed
from specgen.drafting.history import History
from specgen.drafting.lookup import LookupDrafter, continuation_tree
from specgen.drafting.plans import DRAFT, LOOKUP, LookupOffer, StepPlan, lookup_plan, plain_plan
from specgen.drafting.sources import LOOKUP_NODE, SINGLE
from specgen.drafting.tuning import CATCH_UP_HORIZON, HISTORY_BELOW, LONG_PROMPT, RELAX, USEFUL_DEPTH_EVERY
from specgen.drafting.value import best_chain_length, best_subtree, cap, cap_siblings, chain_expected


class DraftModel(Protocol):
    """What auto asks of the draft-model drafter (model.py's ModelDrafter)."""

    max_depth: int
    leaves: int  # sampling: race runners-up added as unexpanded siblings, per drafted node
    sampler: Sampler  # how the draft chooses (its race's seed comes with each reset)
    last_choice: str
    last_calls: int  # the last proposal's draft decodes
    last_catch_up_s: float  # and the seconds its first one (the catch-up on committed text) took

    @property
    def backlog(self) -> int:
        """Committed tokens the draft has not read yet (the next proposal's first decode reads them)."""

    def propose(self, max_depth: int, max_nodes: int | None = None) -> DraftTree: ...

    def restrict(self, nodes: list[int]) -> DraftTree:
        """The last proposal cut to `nodes` (ancestor-closed), the draft's KV bookkeeping with it."""

    def reset(self, tokens: list[int], sampler: Sampler | None = None) -> None: ...

    def observe(self, verdict: Verdict, committed: list[int]) -> None: ...


@dataclass(frozen=True)
class Situation:
    """What a step starts from."""

    root: int
    context: int  # committed tokens before the root
    depth: int  # the deepest draft this step may verify
    room: int  # tokens this text may still write (the engine's max_depth + 1)
    cost: Cost  # c_target(B) at this context, with the measured overhead of a step
    started: float


@dataclass(frozen=True)
class StepRecord:
    """A step as run, for observe(): its plan, its tree, and what the tree was planned with."""

    choice: str
    plan: StepPlan
    tree: DraftTree
    evidence: list[NodeEvidence | None]  # per node; None for the root
    context: int
    started: float  # perf_counter at propose()
    chosen: float  # and when the tree was ready: a step's own time (verification and after) starts here
    decode_mark: float  # the target curve's observed decode seconds then (the step's decode is what follows)
    draft_calls: int = 0
    read_backlog: bool = False  # the draft's first decode read committed text it had missed


class AutoDrafter:
    def __init__(self, c_target: CostCurve, lookup: LookupDrafter, model: DraftModel | None = None,
                 c_draft: CostCurve | None = None, *, max_nodes: int, max_depth: int, lookup_matches: int,
                 reproducible: bool = False, on_long_prompt: Callable[[list[int]], None] | None = None,
                 history: History | None = None):
        """Hyperparameters (max_nodes, max_depth: of a tree; lookup_matches: earlier occurrences a
        lookup trie is built from) come from methods.py's table. auto owns `lookup`: the draft
        model may draft with it (staged), never updates it."""
        self.c_target, self.c_draft = c_target, c_draft
        # Reproducible (a seed was given): plan from the cost curves alone, never from clocks, so
        # the same input gives the same trees, hence the same batches and numerics, every run.
        self.reproducible = reproducible
        self.lookup, self.model = lookup, model
        self.max_nodes, self.max_depth, self.lookup_matches = max_nodes, max_depth, lookup_matches
        self.acceptance = AcceptanceModel()
        self.draft = DraftEstimate()
        self.guards = KindGuards()
        self.plain = PlainSpeed()  # what the guards compare with (clocks only: not when reproducible)
        self.overhead = Overhead()  # clocks only
        self.choices: Counter[str] = Counter()
        self.last_choice = "plain"
        self._step: StepRecord | None = None
        self._depth_cache: dict[tuple[str, int, int], int] = {}  # per (source, support, match-length bin)
        self.on_long_prompt = on_long_prompt  # times the costs' context term after a long prompt's prefill
        self.history = history  # other texts to draft from; each finished text joins it
        self._text_kept = True

    def finish_text(self) -> None:
        """The current text is done: later texts (and, through the store, later runs) may draw on it."""
        if self.history is not None and not self._text_kept:
            self.history.add_text(self.lookup.tokens)
        self._text_kept = True

    def reset(self, tokens: list[int], sampler: Sampler | None = None) -> None:
        self.finish_text()
        self._text_kept = False
        self.acceptance.new_text()
        if self.model is not None:
            self.model.reset(tokens, sampler)
        self.lookup.reset(tokens)
        if self.on_long_prompt is not None and len(tokens) > LONG_PROMPT and not self.reproducible:
            self.on_long_prompt(tokens)

    # -- one step: enumerate, price, pick ------------------------------------------------------

    def propose(self, max_depth: int) -> DraftTree:
        started = time.perf_counter()
        context = len(self.lookup.tokens)
        cost = self.overhead.priced(self.c_target.given(context))
        s = Situation(self.lookup.tokens[-1], context, min(self.max_depth, max_depth), max_depth + 1, cost, started)
        plain = plain_plan(cost)
        if s.depth <= 0:
            return self._run(s, plain, "plain")
        if self.plain.due() and not self.reproducible:  # what plain decoding takes now, measured
            return self._run(s, plain, "probe")
        offer = self._lookup_offer(s)
        drafts = self._draft_plans(s, offer)
        plans = [plain, *lookup_plan(offer), *drafts]
        best = max(plans, key=lambda p: p.score)
        allowed = self.guards.allowed(tuple({_guard_kind(p) for p in plans[1:]}))
        plan = max((p for p in plans if p is plain or _guard_kind(p) in allowed), key=lambda p: p.score)
        if self.model is not None and self.c_draft is not None and not plan.uses_draft:
            self._relax_draft(s.context)
        return self._run(s, plan, "guard" if plan is plain and best is not plain else None, offer)

    def _lookup_offer(self, s: Situation) -> LookupOffer | None:
        """Continuations of earlier occurrences of the text's end: in this text, else (or when its
        match is short) in the nearest other source that has one (history.py); as a tree, each node
        with its estimate, cut to the nodes worth verifying. None when no match could pay."""
        found = self.lookup.continuations(self.lookup.matches(self.lookup.tokens, self.lookup_matches), s.depth)
        if self.history is not None and (not found or found[0].match_len < HISTORY_BELOW):
            found += self.history.continuations(self.lookup.tokens, s.depth, self.lookup_matches)
        # How deep a lookup draft could pay, judged by its best match before building anything:
        # on a steep cost curve most matches cannot pay, and then the step stays cheap.
        firsts = [self.lookup.support(self.lookup.tokens, c.tokens[0], c.match_len, c.source) for c in found]
        best = max(zip(found, firsts), key=lambda cs: self.acceptance.lookup_p(cs[0].match_len, 1, cs[0].source, cs[1]),
                   default=None)
        depth = self._useful_depth(best[0].match_len, s.cost, best[0].source, best[1]) if best else 0
        if depth == 0:
            return None
        tree, sources, match_len = continuation_tree(s.root, found, min(s.depth, depth))
        tdepth = tree.depths()
        support = self.lookup.supports(tree, [m + d - 1 for m, d in zip(match_len, tdepth)], sources)
        nodes = range(1, len(tree))
        accept = [1.0] + [self.acceptance.lookup_p(match_len[v], tdepth[v], sources[v], support[v]) for v in nodes]
        accept = cap_siblings(tree, accept, [1.0] + [cap(sources[v]) for v in nodes])
        evidence = [None] + [self.acceptance.lookup_evidence(match_len[v], tdepth[v], sources[v], support[v])
                             for v in nodes]
        return LookupOffer(tree, accept, evidence, best_subtree(tree.parents, accept, s.cost, 0.0, self.max_nodes))

    def _draft_plans(self, s: Situation, offer: LookupOffer | None) -> list[StepPlan]:
        """The draft model's chain at its best length (its first decode also reads the committed
        tokens the draft has not seen, one output row each: a share of it is charged to this step)."""
        if self.model is None or self.c_draft is None:
            return []
        c_draft_1 = self.c_draft(1, s.context)
        catch_up = self.c_draft.read(self.model.backlog, s.context) - c_draft_1
        max_k = min(s.depth, self.model.max_depth)
        alpha = self.draft.alpha
        step_s = self.draft.step_cost(c_draft_1)
        k, rate = best_chain_length(alpha, s.cost, step_s, max_k, catch_up, tokens_left=min(s.room, CATCH_UP_HORIZON))
        if k == 0:
            return []
        expected = chain_expected(alpha, k)
        return [StepPlan(DRAFT, expected, expected / rate, draft_len=k, trust=self.draft.usable())]

    def _useful_depth(self, match_len: int, cost: Cost, source: str = LOOKUP_NODE, support: int = SINGLE) -> int:
        """How deep a lookup chain from a match of `match_len` tokens, whose first token has
        `support`, could pay (0: not at all), taken at the top of each match-length bin and with
        every node as supported as the first, so the answer errs towards trying (each node's own
        support prices it in the plan). Recomputed every USEFUL_DEPTH_EVERY steps: it moves slowly,
        and on a small model every step's Python time is a visible share."""
        if self.choices.total() % USEFUL_DEPTH_EVERY == 0:
            self._depth_cache.clear()
        b = AcceptanceModel.lookup_bin(match_len, 1)
        key = (source, support, b)
        if key not in self._depth_cache:
            accept = [1.0] + [min(cap(source), self.acceptance.lookup_p(MATCH_BIN_TOPS[b], d, source, support))
                              for d in range(1, self.max_depth + 1)]
            chain = best_subtree(list(range(-1, self.max_depth)), accept, cost, 0.0, self.max_nodes)
            self._depth_cache[key] = len(chain.nodes)
        return self._depth_cache[key]

    def _relax_draft(self, context: int) -> None:
        """A step that could have used the draft and did not: what is known of it drifts back
        towards its priors, so one bad stretch cannot rule it out for good."""
        assert self.c_draft is not None
        self.draft.relax(self.c_draft(1, context))
        self.c_draft.follow(self.c_target, RELAX)  # how busy the machine is shows in every target decode

    # -- running the chosen plan ----------------------------------------------------------------

    def _run(self, s: Situation, plan: StepPlan, name: str | None, offer: LookupOffer | None = None) -> DraftTree:
        if plan.uses_draft:
            return self._run_draft(s, plan)
        if plan.kind == LOOKUP:
            assert offer is not None
            tree, index = offer.tree.subtree([0, *plan.lookup_nodes])
            evidence: list[NodeEvidence | None] = [None] * len(tree)
            for old, new in index.items():
                evidence[new] = offer.evidence[old]
            # Named by the source of the first drafted node: "lookup", "loop", "history", "store", "corpus".
            return self._record(StepRecord(evidence[1].source, plan, tree, evidence, s.context, s.started,
                                           *self._ready()))
        return self._record(StepRecord(name or "plain", plan, DraftTree.root_only(s.root), [None], s.context,
                                       s.started, *self._ready()))

    def _run_draft(self, s: Situation, plan: StepPlan) -> DraftTree:
        assert self.model is not None and self.c_draft is not None
        t0 = time.perf_counter()
        # At most draft_len draft decodes (the depth); sampling, room for a runner-up beside each.
        tree = self.model.propose(plan.draft_len, max_nodes=plan.draft_len * (1 + self.model.leaves))
        c_draft_1 = self.c_draft(1, s.context)
        if not self.reproducible and tree.n_drafted:
            # Per drafted token, the catch-up counted as the one-token decode it is beyond the backlog.
            spent = time.perf_counter() - t0 - self.model.last_catch_up_s + c_draft_1
            self.draft.observe_step_cost(spent / tree.n_drafted, c_draft_1)
        calls, choice = self.model.last_calls, self.model.last_choice
        accept = [1.0] + [self.acceptance.draft_p(q) for q in tree.q[1:]]
        kept = best_subtree(tree.parents, cap_siblings(tree, accept), s.cost, 0.0, self.max_nodes)  # draft time is spent
        if len(kept.nodes) < tree.n_drafted:
            tree = self.model.restrict(kept.nodes)
        evidence = [None] + [self.acceptance.draft_evidence(q) for q in tree.q[1:]]
        return self._record(StepRecord(choice, plan, tree, evidence, s.context, s.started, *self._ready(), calls))

    def _ready(self) -> tuple[float, float]:
        """When the tree is ready: the clock, and the target's decode seconds observed so far."""
        return time.perf_counter(), self.c_target.observed_s

    def _record(self, step: StepRecord) -> DraftTree:
        self.last_choice = step.choice
        self.choices[step.choice] += 1
        self._step = step
        return step.tree

    # -- learning from the verdict ---------------------------------------------------------------

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        step, self._step = self._step, None
        if self.model is not None:
            self.model.observe(verdict, committed)  # the draft's KV edits: part of the step's time
        self.lookup.observe(verdict, committed)
        if step is not None:
            self._learn(step, verdict, committed, time.perf_counter())

    def _learn(self, step: StepRecord, verdict: Verdict, committed: list[int], now: float) -> None:
        """What the step shows: acceptance, the draft's record, the overhead, plain's speed, the guards."""
        tree, plan = step.tree, step.plan
        if not self.reproducible:  # beyond the decode as timed (a timed context), else as modelled
            modelled = self.c_target(len(tree), step.context)
            decode_s = (self.c_target.observed_s - step.decode_mark) or modelled
            self.overhead.observe(tree.n_drafted, now - step.chosen - decode_s, modelled)
        if not tree.n_drafted and not plan.uses_draft:
            # A step that drafted nothing is a plain step (timed from when planning ended). More than
            # one token committed: a grammar's forced tokens rode along (forced.py), not plain.
            if not self.reproducible and len(committed) == 1:
                self.plain.observe_plain(now - step.chosen)
            return
        self.acceptance.observe(tree, step.evidence, verdict.path)
        if plan.uses_draft and tree.n_drafted:
            first_tested = [v for v in range(1, len(tree)) if tree.parents[v] == 0]
            self.draft.observe_first_token(any(v in verdict.path for v in first_tested))
        if self.reproducible:  # the step's modelled cost: what the planner expected it to take
            seconds = self.c_target(len(tree), step.context)
            if plan.uses_draft and self.c_draft is not None:
                seconds += step.draft_calls * self.c_draft(1, step.context)
            plain_rate = 1.0 / self.c_target(1, step.context)
        else:
            seconds = now - step.started
            self.plain.observe_speculative(len(committed), seconds)
            plain_rate = self.plain.rate(1.0 / self.c_target(1, step.context))
        self.guards.record(_guard_kind(plan), len(committed), seconds, plain_rate)
        # A step that read a backlog paid a cost planned by its share of later steps: it would count
        # as a miss of the per-step model (a prompt's first draft step kept the draft out for good).
        if plan.uses_draft and not self.reproducible and not step.read_backlog:
            self.draft.observe_step(plan.expected_tokens, plan.seconds, len(committed), seconds)


def _guard_kind(plan: StepPlan) -> str:
    """The guard that judges a plan: the draft model's, for any plan that runs it."""
    return DRAFT if plan.uses_draft else LOOKUP
