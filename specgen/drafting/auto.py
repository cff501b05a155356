"""`--method auto`: per step, draft what maximises expected tokens per second, or nothing.

Each step compares, by expected tokens / expected seconds (planner.py):
  - plain decoding: 1 token for c_target(1);
  - the lookup trie (free to draft), pruned to its best prefix by acceptance estimates;
  - the draft model (staged: its tree, with lookup drafting for it), when one is loaded and its
    learned acceptance makes a draft chain worth its cost; its tree is then pruned the same way.
A guard backs off to plain decoding when the realised speed of speculation falls behind plain
decoding's speed measured in the same run (plain steps, and plain probes among speculative ones);
a second one benches the draft model when the steps that use it fall behind plain.

This module is the policy; what it learns lives in planner.py (AcceptanceModel, DraftEstimate,
Guard) and what decodes cost in costs/.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Protocol

from specgen.core.tree import DraftTree
from specgen.core.verify import Verdict
from specgen.costs.curve import Cost, CostCurve
from specgen.drafting.history import History
from specgen.drafting.lookup import LookupDrafter, continuation_tree
from specgen.drafting.planner import (MATCH_BIN_TOPS, RELAX, AcceptanceModel, DraftEstimate, Guard, NodeEvidence,
                                      Plan, PlainSpeed, SampledAcceptance, best_chain_length, best_subtree,
                                      chain_expected, reach_probabilities)
from specgen.drafting.sources import LOOKUP_NODE, LOOP_NODE, SINGLE

LONG_PROMPT = 512  # tokens: enough context for attention's share of a decode to be measurable
# No estimate is certainty: a node's acceptance, or its siblings' together (they are exclusive
# outcomes), is capped here, or every depth would look free. The cap bounds how deep a chain can
# pay: on gemma Q4_K_M's curve, 15 tokens at 0.95 and 31 at 0.99. Measured on 65 Spec-Bench
# prompts: loop nodes 2,726 of 2,726 accepted, copies of 40+ matched tokens 0.997, 24-39 0.98.
# So a loop node's cap is higher: at 0.99, 31 tokens were the most a loop chain could pay on
# gemma Q4_K_M's curve, where 63 at 0.998 take 2.5 ms a token against 3.1 for 31 (both accepted
# whole).
MAX_ACCEPT, MAX_ACCEPT_LOOP = 0.99, 0.998
USEFUL_DEPTH_EVERY = 16  # steps between recomputing how deep lookup chains can pay
HISTORY_BELOW = 10  # other texts are searched when this text's best match is shorter than this
# The draft's catch-up (the prompt's last 256 tokens, the first time: 0.3-0.45 s for gemma F32's
# -d self draft) serves every later step, but must be earned back within this many tokens: a
# text can end long before the budget (q305's answer was 3 tokens; catching the draft up made it
# 368 ms against plain's 126), and a draft that needs longer to pay for it gains little anyway.
CATCH_UP_HORIZON = 32


class DraftModel(Protocol):
    """What auto asks of the draft-model drafter (model.py's ModelDrafter): a tree of a given size
    and what it took, a cut of it, and how far behind the committed text the draft is."""

    max_depth: int
    sampling: bool  # children drawn from q (T > 0): verified by rejection sampling, never pruned
    last_choice: str
    last_calls: int  # the last proposal's draft decodes
    last_catch_up_s: float  # and the seconds its first one (the catch-up on committed text) took
    judge: Callable[[int, float, float], float | None] | None  # sampling: whether a node's children pay

    @property
    def backlog(self) -> int:
        """Committed tokens the draft has not read yet (the next proposal's first decode reads them)."""

    def propose(self, max_depth: int, max_nodes: int | None = None, exclude: tuple[int, ...] = ()) -> DraftTree: ...

    @property
    def confidence(self) -> dict[int, float]:
        """Per node of the last proposal that the draft evaluated: its q row's top probability."""

    def restrict(self, nodes: list[int]) -> DraftTree:
        """The last proposal cut to `nodes` (ancestor-closed), the draft's KV bookkeeping with it."""

    def reset(self, tokens: list[int]) -> None: ...

    def observe(self, verdict: Verdict, committed: list[int]) -> None: ...


@dataclass
class _Step:
    """This step's proposal, kept for observe(): what was drafted and what it was planned with."""

    choice: str
    tree: DraftTree
    evidence: list[NodeEvidence | None]  # per node; None for the root
    context: int  # committed tokens before the root
    started: float = 0.0  # perf_counter at propose()
    draft_calls: int = 0
    # A draft step as modelled (before the efficiency correction): its time and E[tokens].
    planned_s: float = 0.0
    planned_tokens: float = 1.0
    # Proposed by the draft model, even if its tree was pruned to nothing: the draft's work was
    # done and belongs to its account (a draft that keeps proposing nothing worth verifying made
    # gemma F32's plain steps 30% slower, unseen by the draft's guard).
    uses_draft: bool = False
    chosen: float = 0.0  # perf_counter when propose() returned: a plain step's own time starts here
    confidence: dict[int, float] | None = None  # sampled draft steps: the draft's confidence per node
    read_backlog: bool = False  # the draft's first decode read committed text it had missed


class AutoDrafter:
    def __init__(self, c_target: CostCurve, lookup: LookupDrafter, model: DraftModel | None = None,
                 c_draft: CostCurve | None = None, *, max_nodes: int, max_depth: int, lookup_matches: int,
                 reproducible: bool = False, on_long_prompt: Callable[[list[int]], None] | None = None,
                 history: History | None = None, model_feeds_lookup: bool = False):
        """Hyperparameters (max_nodes, max_depth: of a tree; lookup_matches: earlier occurrences a
        lookup trie is built from) come from methods.py's table. `model_feeds_lookup`: the model
        drafter (staged) drafts with the same lookup index and keeps it updated."""
        self.c_target, self.c_draft = c_target, c_draft
        # Reproducible (a seed was given): plan from the cost curves alone, never from clocks, so
        # the same input gives the same trees, hence the same batches and numerics, every run.
        self.reproducible = reproducible
        self.lookup, self.model = lookup, model
        self.max_nodes, self.max_depth, self.lookup_matches = max_nodes, max_depth, lookup_matches
        self.acceptance = AcceptanceModel()
        # T > 0 with a draft model: its tokens are drawn from q and verified by rejection sampling.
        self.sampled = model is not None and model.sampling
        self.sampled_acceptance = SampledAcceptance()
        self.draft = DraftEstimate()
        self.guard = Guard()
        # The same test for the steps that use the draft model alone: a draft whose steps are
        # realised slower than plain decoding is benched, whatever its modelled costs promised
        # (its catch-up, KV edits and tree work are only partly in the model).
        self.draft_guard = Guard()
        self.plain = PlainSpeed()  # what the guards compare with (clocks only: not when reproducible)
        self.choices: Counter[str] = Counter()
        self.last_choice = "plain"
        self._step: _Step | None = None
        self._depth_cache: dict[tuple[str, int, int], int] = {}  # per (source, support, match-length bin)
        self._model_owns_lookup = model is not None and model_feeds_lookup
        # Called with the prompt's tokens after a long prompt's prefill: times the costs' context term.
        self.on_long_prompt = on_long_prompt
        # Other texts to draft from (earlier texts of this process, the store, a corpus): each
        # finished text joins it (finish_text(), or the next reset()).
        self.history = history
        self._text_kept = True

    def finish_text(self) -> None:
        """The current text is done: later texts (and, through the store, later runs) may draw on it."""
        if self.history is not None and not self._text_kept:
            self.history.add_text(self.lookup.tokens)
        self._text_kept = True

    def reset(self, tokens: list[int]) -> None:
        self.finish_text()
        self._text_kept = False
        self.acceptance.new_text()
        self.sampled_acceptance.new_text()
        if self.model is not None:
            self.model.reset(tokens)
        if not self._model_owns_lookup:
            self.lookup.reset(tokens)
        if self.on_long_prompt is not None and len(tokens) > LONG_PROMPT and not self.reproducible:
            self.on_long_prompt(tokens)

    # -- one step ------------------------------------------------------------------------------

    def propose(self, max_depth: int) -> DraftTree:
        started = time.perf_counter()
        context = len(self.lookup.tokens)
        c_target = self.c_target.given(context)
        root = self.lookup.tokens[-1]
        depth = min(self.max_depth, max_depth)
        if depth <= 0:
            return self._choose(_Step("plain", DraftTree.root_only(root), [None], context, started))
        if not self.guard.allow_speculation():  # speculation was losing: plain for a while
            return self._choose(_Step("guard", DraftTree.root_only(root), [None], context, started))
        if self.plain.due() and not self.reproducible:  # what plain decoding takes now, measured
            return self._choose(_Step("probe", DraftTree.root_only(root), [None], context, started))

        # Continuations of earlier occurrences of the text's end: in this text, else (or when
        # its match is short) in the nearest other source that has one (history.py).
        found = self.lookup.continuations(self.lookup.matches(self.lookup.tokens, self.lookup_matches), depth)
        if self.history is not None and (not found or found[0].match_len < HISTORY_BELOW):
            found += self.history.continuations(self.lookup.tokens, depth, self.lookup_matches)
        # How deep a lookup draft could pay, judged by its best match before building anything:
        # on a steep cost curve most matches cannot pay, and then the step stays cheap.
        firsts = [self.lookup.support(self.lookup.tokens, c.tokens[0], c.match_len, c.source) for c in found]
        best = max(zip(found, firsts), key=lambda cs: self.acceptance.lookup_p(cs[0].match_len, 1, cs[0].source, cs[1]),
                   default=None)
        lookup_depth = self._useful_depth(best[0].match_len, c_target, best[0].source, best[1]) if best else 0
        if lookup_depth == 0 and self.model is None:
            return self._choose(_Step("plain", DraftTree.root_only(root), [None], context, started))
        tree, sources, match_len = continuation_tree(root, found, min(depth, lookup_depth))
        tdepth = tree.depths()
        support = self.lookup.supports(tree, [m + d - 1 for m, d in zip(match_len, tdepth)], sources)
        accept = [1.0] + [self.acceptance.lookup_p(match_len[v], tdepth[v], sources[v], support[v])
                          for v in range(1, len(tree))]
        caps = [1.0] + [_cap(sources[v]) for v in range(1, len(tree))]
        accept = _cap_siblings(tree, accept, caps)
        plan = best_subtree(tree.parents, accept, c_target, 0.0, self.max_nodes)
        evidence = [None] + [self.acceptance.lookup_evidence(match_len[v], tdepth[v], sources[v], support[v])
                             for v in range(1, len(tree))]

        if self.model is not None and self.c_draft is not None and self.draft_guard.allow_speculation():
            # A drafted token costs a draft decode plus Python work on a vocabulary-sized row:
            # planned with what drafted tokens really took, once there is a measurement. The
            # first decode also evaluates the committed tokens the draft has not seen (one output
            # row: much cheaper per token than a draft level; the prompt too, the first time).
            c_draft_1 = self.c_draft(1, context)
            catch_up = self.c_draft.read(self.model.backlog, context) - c_draft_1
            max_k = min(depth, self.model.max_depth)
            alpha = self.sampled_acceptance.by_depth(max_k) if self.sampled else self.draft.alpha
            k, draft_rate = best_chain_length(alpha, c_target, self.draft.step_cost(c_draft_1), max_k,
                                              catch_up, tokens_left=min(max_depth + 1, CATCH_UP_HORIZON))
            if k > 0:
                expected = chain_expected(alpha, k)
                graft = self._graft_plan(tree, plan, accept, expected, expected / draft_rate, c_target, k)
                if graft is not None and graft.rate * self.draft.usable() > max(plan.rate, draft_rate * self.draft.usable()):
                    return self._propose_with_model(depth, k, c_target, context, started, graft.expected_tokens,
                                                    graft.seconds, graft=(tree, plan.nodes, evidence))
                if draft_rate * self.draft.usable() > plan.rate:  # as realised so far
                    return self._propose_with_model(depth, k, c_target, context, started, expected, expected / draft_rate)
            self._relax_draft(c_draft_1)

        pruned, new_index = tree.subtree([0, *plan.nodes])
        kept = [None] * len(pruned)
        for old, new in new_index.items():
            kept[new] = evidence[old]
        # Named by the source of the first drafted node: "lookup" or "loop" (this text), "history", "store",
        # "corpus".
        return self._choose(_Step(kept[1].source if plan.nodes else "plain", pruned, kept, context, started))

    def _useful_depth(self, match_len: int, c_target: Cost, source: str = LOOKUP_NODE, support: int = SINGLE) -> int:
        """How deep a lookup chain from a match of `match_len` tokens, whose first token has
        `support`, could pay (0: not at all), from the current acceptance estimates, taken at the
        top of each match-length bin and with every node as supported as the first, so the answer
        errs towards trying (each node's own support prices it in the plan). Recomputed only every
        USEFUL_DEPTH_EVERY steps, per (source, support, match bin) as steps ask for it: it moves
        slowly, and on a small model every step's Python time is a visible share."""
        if self.choices.total() % USEFUL_DEPTH_EVERY == 0:
            self._depth_cache.clear()
        b = AcceptanceModel.lookup_bin(match_len, 1)
        key = (source, support, b)
        if key not in self._depth_cache:
            self._depth_cache[key] = self._chain_depth(MATCH_BIN_TOPS[b], c_target, source, support)
        return self._depth_cache[key]

    def _chain_depth(self, match_len: int, c_target: Cost, source: str, support: int) -> int:
        accept = [1.0] + [min(_cap(source), self.acceptance.lookup_p(match_len, d, source, support))
                          for d in range(1, self.max_depth + 1)]
        plan = best_subtree(list(range(-1, self.max_depth)), accept, c_target, 0.0, self.max_nodes)
        return len(plan.nodes)

    def _graft_plan(self, tree: DraftTree, plan: Plan, accept: list[float], draft_tokens: float,
                    draft_seconds: float, c_target: Cost, k: int) -> Plan | None:
        """A sampled draft chain with the lookup plan beside it (T > 0 only): the lookup nodes are
        verified first at the root, and the chain's first token, drawn from q without them, is
        tried only when they are rejected. None when there is nothing to put beside it."""
        if not self.sampled or not plan.nodes:
            return None
        reach = reach_probabilities(tree.parents, accept)
        first = min(1.0, sum(reach[v] for v in plan.nodes if tree.parents[v] == 0))
        expected = plan.expected_tokens + (1.0 - first) * (draft_tokens - 1.0)
        seconds = draft_seconds - c_target(k + 1) + c_target(k + 1 + len(plan.nodes))
        return Plan(plan.nodes, expected, seconds)

    def _propose_with_model(self, depth: int, k: int, c_target: Cost, context: int, started: float,
                            planned_tokens: float, planned_s: float,
                            graft: tuple[DraftTree, list[int], list[NodeEvidence | None]] | None = None) -> DraftTree:
        """The draft's chain of up to k tokens; `graft`: a lookup tree, the nodes of it to put
        beside the chain, and their evidence."""
        assert self.model is not None and self.c_draft is not None
        exclude = tuple(graft[0].tokens[v] for v in graft[1] if graft[0].parents[v] == 0) if graft else ()
        if self.sampled:  # stop the chain where the draft's confidence says a further token does not pay
            self.model.judge = self._judge(planned_tokens / planned_s, c_target, k, context)
        t0 = time.perf_counter()
        tree = self.model.propose(min(depth, k), max_nodes=k, exclude=exclude)
        c_draft_1 = self.c_draft(1, context)
        if not self.reproducible and tree.n_drafted:
            # Per drafted token, the catch-up counted as the one-token decode it is beyond the backlog.
            spent = time.perf_counter() - t0 - self.model.last_catch_up_s + c_draft_1
            self.draft.observe_step_cost(spent / tree.n_drafted, c_draft_1)
        if self.sampled:
            # Drawn children must all stay (verify.walk_rejection): nothing is pruned by its value.
            confidence = dict(self.model.confidence)
            if graft is None and tree.n_drafted < k:  # the judge stopped the chain early: plan what was drafted
                alpha = self.sampled_acceptance.by_depth(k)
                planned_s -= (k - tree.n_drafted) * self.draft.step_cost(c_draft_1) + c_target(k + 1) - c_target(len(tree))
                planned_tokens = chain_expected(alpha, tree.n_drafted)
            evidence: list[NodeEvidence | None] = [None] * len(tree)
            if graft is not None:
                tree, evidence = _grafted(tree, *graft)
            choice = self.model.last_choice + ("+lookup" if graft is not None else "")
            return self._choose(_Step(choice, tree, evidence, context, started, self.model.last_calls, planned_s,
                                      planned_tokens, uses_draft=True, confidence=confidence,
                                      read_backlog=self.model.last_catch_up_s > 2 * c_draft_1))
        accept = [1.0] + [self.acceptance.draft_p(q) for q in tree.q[1:]]
        # The draft's time is spent: prune by target cost alone.
        plan = best_subtree(tree.parents, _cap_siblings(tree, accept), c_target, 0.0, self.max_nodes)
        if len(plan.nodes) < tree.n_drafted:
            tree = self.model.restrict(plan.nodes)
        evidence = [None] + [self.acceptance.draft_evidence(q) for q in tree.q[1:]]
        return self._choose(_Step(self.model.last_choice, tree, evidence, context, started,
                                  self.model.last_calls, planned_s, planned_tokens, uses_draft=True))

    def _relax_draft(self, c_draft_1: float) -> None:
        assert self.c_draft is not None
        self.draft.relax(c_draft_1)
        self.sampled_acceptance.relax()
        # How busy the machine is shows in every target decode; the draft's scale follows it.
        self.c_draft.scale += (self.c_target.scale - self.c_draft.scale) * RELAX

    def _choose(self, step: _Step) -> DraftTree:
        step.chosen = time.perf_counter()
        self.last_choice = step.choice
        self.choices[step.choice] += 1
        self._step = step
        return step.tree

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        step, self._step = self._step, None
        if step is not None and (step.tree.n_drafted or step.uses_draft):
            tree = step.tree
            self.acceptance.observe(tree, step.evidence, verdict.path)
            if step.confidence is not None:
                self._observe_sampled(step, verdict)
            elif step.uses_draft and tree.n_drafted:
                first_tested = [v for v in range(1, len(tree)) if tree.parents[v] == 0]
                self.draft.observe_first_token(any(v in verdict.path for v in first_tested))
            if self.reproducible:  # the step's modelled cost: what the planner expected it to take
                seconds = self.c_target(len(tree), step.context)
                if step.uses_draft and self.c_draft is not None:
                    seconds += step.draft_calls * self.c_draft(1, step.context)
                plain_rate = 1.0 / self.c_target(1, step.context)
            else:
                seconds = time.perf_counter() - step.started
                self.plain.observe_speculative(len(committed), seconds)
                plain_rate = self.plain.rate(1.0 / self.c_target(1, step.context))
            self.guard.record(len(committed), seconds, plain_rate)
            if step.uses_draft:
                self.draft_guard.record(len(committed), seconds, plain_rate)
                # A step that read a backlog paid a cost planned by its share of later steps: it
                # would count as a miss of the per-step model, and with few sampled draft steps a
                # prompt's first one kept the draft out for the rest (gemma F32 -d self, T=0.8).
                if not self.reproducible and not step.read_backlog:
                    self.draft.observe_step(step.planned_tokens, step.planned_s, len(committed), seconds)
        elif step is not None and not self.reproducible and len(committed) == 1:
            # A step that drafted nothing is a plain step (timed from when planning ended): with
            # one every few steps, as on gemma Q4_K_M where half the steps draft nothing, no probe
            # is forced in place of a draft (they were, into loops the text was copying). More than
            # one token committed: a grammar's forced tokens rode along (forced.py), not plain.
            self.plain.observe_plain(time.perf_counter() - step.chosen)
        if self.model is not None:
            self.model.observe(verdict, committed)
        if not self._model_owns_lookup:
            self.lookup.observe(verdict, committed)

    def _judge(self, rate: float, c_target: Cost, k: int, context: int) -> Callable[[int, float, float], float | None]:
        """A chain token at depth d is drawn only while its expected gain, reach * acceptance (by
        depth and the draft's confidence at its parent), pays for its time at the step's planned
        rate: a draft decode and one more row in the target's batch."""
        assert self.c_draft is not None
        marginal = self.draft.step_cost(self.c_draft(1, context)) + c_target(k + 1) - c_target(k)
        floor = rate * marginal

        def judge(depth: int, confidence: float, reach: float) -> float | None:
            gain = reach * self.sampled_acceptance.p(depth, confidence)
            return gain if gain >= floor else None
        return judge

    def _observe_sampled(self, step: _Step, verdict: Verdict) -> None:
        """Learn from the exact acceptance of the first drawn child at every node verification
        tested (Verdict.overlap), by the depth of the children and the draft's confidence there."""
        assert step.confidence is not None
        depths = step.tree.depths()
        for node, overlap in verdict.overlap.items():
            confidence = step.confidence.get(node)
            if confidence is not None:
                self.sampled_acceptance.observe(depths[node] + 1, confidence, overlap)


def _grafted(tree: DraftTree, lookup: DraftTree, nodes: list[int], evidence: list[NodeEvidence | None]
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


def _cap(source: str) -> float:
    return MAX_ACCEPT_LOOP if source == LOOP_NODE else MAX_ACCEPT


def _cap_siblings(tree: DraftTree, accept: list[float], caps: list[float] | None = None) -> list[float]:
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
