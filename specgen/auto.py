"""`--method auto`: per step, draft what maximises expected tokens per second, or nothing.

Each step compares, by expected tokens / expected seconds (planner.py):
  - plain decoding: 1 token for c_target(1);
  - the lookup trie (free to draft), pruned to its best prefix by acceptance estimates;
  - the draft model (staged: its tree, with lookup drafting for it), when one is loaded and its
    learned acceptance makes a draft chain worth its cost; its tree is then pruned the same way.
A guard backs off to plain decoding when the realised speed of speculation falls behind plain.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable

from .costs import CostCurve
from .drafters import LookupDrafter, ModelDrafter
from .planner import MATCH_BIN_TOPS, AcceptanceModel, Guard, best_chain_length, best_subtree
from .tree import DraftTree
from .verify import Verdict

ALPHA_EMA = 0.1
ALPHA_PRIOR = 0.7  # optimistic on purpose: an option the planner never tries is never learned
# What is known of the draft is learned only from the steps that use it. Per step without it, each
# estimate (acceptance, cost per drafted token, the machine's speed for it) drifts back by this
# much towards its prior, so one bad stretch (or a cold first decode) cannot rule it out for good.
RELAX = 0.02
LONG_PROMPT = 512  # tokens: enough context for attention's share of a decode to be measurable


class AutoDrafter:
    def __init__(self, c_target: CostCurve, lookup: LookupDrafter, model: ModelDrafter | None = None,
                 c_draft: CostCurve | None = None, max_nodes: int = 24, max_depth: int = 16,
                 lookup_matches: int = 4, reproducible: bool = False):
        self.c_target, self.c_draft = c_target, c_draft
        # Reproducible (a seed was given): plan from the cost curves alone, never from clocks, so
        # the same input gives the same trees, hence the same batches and numerics, every run.
        self.reproducible = reproducible
        self.lookup, self.model = lookup, model
        self.max_nodes, self.max_depth, self.lookup_matches = max_nodes, max_depth, lookup_matches
        self.acceptance = AcceptanceModel()
        self.guard = Guard()
        # Acceptance of the draft's first token, learned online; a wrong guess costs a few steps.
        self.alpha_draft = ALPHA_PRIOR
        self.draft_step_s: float | None = None  # measured seconds per drafted token, Python included
        self.choices: Counter[str] = Counter()
        self.last_choice = "plain"
        self._kinds: list[str] = []
        self._keys: list[object] = []
        self._tree: DraftTree | None = None
        self._t_start = 0.0
        self._depth_cache: list[int] | None = None
        self._draft_calls = 0
        # The staged model drafter may share our lookup index; then it keeps the index updated.
        self._model_owns_lookup = model is not None and model.lookup is lookup
        # Called with the prompt's tokens after a long prompt's prefill (see runner.py).
        self.on_long_prompt: Callable[[list[int]], None] | None = None

    def reset(self, tokens: list[int]) -> None:
        self.acceptance.new_text()
        if self.model is not None:
            self.model.reset(tokens)
        if not self._model_owns_lookup:
            self.lookup.reset(tokens)
        if self.on_long_prompt is not None and len(tokens) > LONG_PROMPT and not self.reproducible:
            self.on_long_prompt(tokens)  # measures the costs' context term once

    # -- one step ------------------------------------------------------------------------------

    def propose(self, max_depth: int) -> DraftTree:
        self._t_start = time.perf_counter()
        root = self.lookup.tokens[-1]
        self.c_target.context = len(self.lookup.tokens)
        if self.c_draft is not None:
            self.c_draft.context = self.c_target.context
        depth = min(self.max_depth, max_depth)
        if self.model is not None:
            self.model.skip()
        if depth <= 0:
            return self._choose("plain", DraftTree.root_only(root), ["root"], [None])
        if not self.guard.allow_speculation():  # speculation was losing: plain for a while
            return self._choose("guard", DraftTree.root_only(root), ["root"], [None])

        found = self.lookup.matches(self.lookup.tokens, self.lookup_matches)
        # How deep a lookup draft could pay, judged by its best match before building anything:
        # on a steep cost curve most matches cannot pay, and then the step stays cheap.
        lookup_depth = self._useful_depth(self.lookup.match_length(*found[0])) if found else 0
        if lookup_depth == 0 and self.model is None:
            return self._choose("plain", DraftTree.root_only(root), ["root"], [None])
        tree, match_len = self.lookup.candidates(min(depth, lookup_depth), found)
        tdepth = tree.depths()
        accept = [1.0] + [self.acceptance.lookup_p(match_len[v], tdepth[v]) for v in range(1, len(tree))]
        accept = _cap_siblings(tree, accept)
        plan = best_subtree(tree.parents, accept, self.c_target, 0.0, self.max_nodes)
        choice = "lookup" if plan.nodes else "plain"

        if self.model is not None and self.c_draft is not None:
            # A drafted token costs a draft decode plus Python work on a vocabulary-sized row:
            # planned with what drafted tokens really took, once there is a measurement. The
            # first decode also evaluates the committed tokens the draft has not seen (one output
            # row: much cheaper per token than a draft level; the prompt too, the first time).
            step = max(self.c_draft(1), self.draft_step_s or 0.0)
            catch_up = self.c_draft.read(self.model.cache.behind) - self.c_draft(1)
            k, draft_rate = best_chain_length(self.alpha_draft, self.c_target, step, depth, catch_up)
            if k > 0 and draft_rate > plan.rate:
                return self._propose_with_model(depth, k)
            self._relax_draft_estimates()

        kinds = ["root"] + ["lookup"] * (len(tree) - 1)
        keys = [None] + [self.acceptance.lookup_bin(match_len[v], tdepth[v]) for v in range(1, len(tree))]
        tree, kinds, keys, _ = self._prune(tree, plan.nodes, kinds, keys)
        return self._choose(choice, tree, kinds, keys)

    def _useful_depth(self, match_len: int) -> int:
        """How deep a lookup chain from a match of `match_len` tokens could pay (0: not at all),
        from the current acceptance estimates, taken at the top of each match-length bin so
        the answer errs towards trying. Computed for every bin again only every 16 steps: it
        moves slowly, and on a small model every step's Python time is a visible share."""
        if self._depth_cache is None or self.choices.total() % 16 == 0:
            self._depth_cache = [self._chain_depth(top) for top in MATCH_BIN_TOPS]
        return self._depth_cache[AcceptanceModel.lookup_bin(match_len, 1)]

    def _chain_depth(self, match_len: int) -> int:
        accept = [1.0] + [min(0.97, self.acceptance.lookup_p(match_len, d)) for d in range(1, self.max_depth + 1)]
        plan = best_subtree(list(range(-1, self.max_depth)), accept, self.c_target, 0.0, self.max_nodes)
        return len(plan.nodes)

    def _propose_with_model(self, depth: int, k: int) -> DraftTree:
        assert self.model is not None
        self.model.max_nodes = k
        calls, t0 = self.model.draft_calls, time.perf_counter()
        tree = self.model.propose(min(depth, k))
        self._draft_calls = self.model.draft_calls - calls
        if not self.reproducible and tree.n_drafted:
            # Per drafted token, the catch-up counted as the one-token decode it is beyond the backlog.
            spent = time.perf_counter() - t0 - self.model.catch_up_s + self.c_draft(1)
            per_token = spent / tree.n_drafted
            last = self.c_draft(1) if self.draft_step_s is None else self.draft_step_s
            self.draft_step_s = 0.8 * last + 0.2 * per_token
        accept = [1.0] + [self.acceptance.draft_p(q) for q in tree.q[1:]]
        accept = _cap_siblings(tree, accept)
        # The draft's time is spent: prune by target cost alone.
        plan = best_subtree(tree.parents, accept, self.c_target, 0.0, self.max_nodes)
        kinds = ["root"] + ["draft"] * (len(tree) - 1)
        keys = [None] + [self.acceptance.q_bin(q) for q in tree.q[1:]]
        if len(plan.nodes) < tree.n_drafted and not tree.sampled:  # sampled children must all stay
            tree, kinds, keys, new_index = self._prune(tree, plan.nodes, kinds, keys)
            self.model.reindex(new_index)
        return self._choose(self.model.last_choice, tree, kinds, keys)

    def _relax_draft_estimates(self) -> None:
        assert self.c_draft is not None
        self.alpha_draft += (ALPHA_PRIOR - self.alpha_draft) * RELAX
        if self.draft_step_s is not None:
            self.draft_step_s += (self.c_draft(1) - self.draft_step_s) * RELAX
        # How busy the machine is shows in every target decode; the draft's scale follows it.
        self.c_draft.scale += (self.c_target.scale - self.c_draft.scale) * RELAX

    @staticmethod
    def _prune(tree: DraftTree, nodes: list[int], kinds: list[str], keys: list[object]):
        """The tree restricted to `nodes`, with per-node kinds/keys following the new indices."""
        pruned, new_index = tree.subtree([0, *nodes])
        order = sorted(new_index, key=new_index.get)
        return pruned, [kinds[o] for o in order], [keys[o] for o in order], new_index

    def _choose(self, choice: str, tree: DraftTree, kinds: list[str], keys: list[object]) -> DraftTree:
        self.last_choice = choice
        self.choices[choice] += 1
        self._tree, self._kinds, self._keys = tree, kinds, keys
        return tree

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        tree = self._tree
        if tree is not None and tree.n_drafted:
            self.acceptance.observe(tree, self._kinds, self._keys, verdict.path)
            if self._kinds[1] == "draft":
                first_tested = [v for v in range(1, len(tree)) if tree.parents[v] == 0]
                hit = any(v in verdict.path for v in first_tested)
                self.alpha_draft = (1 - ALPHA_EMA) * self.alpha_draft + ALPHA_EMA * hit
            if self.reproducible:  # the step's modelled cost: what the planner expected it to take
                seconds = self.c_target(len(tree))
                if self._kinds[1] == "draft" and self.c_draft is not None:
                    seconds += self._draft_calls * self.c_draft(1)
            else:
                seconds = time.perf_counter() - self._t_start
            self.guard.record(len(committed), seconds, 1.0 / self.c_target(1))
        if self.model is not None:
            self.model.observe(verdict, committed)
        if not self._model_owns_lookup:
            self.lookup.observe(verdict, committed)


def _cap_siblings(tree: DraftTree, accept: list[float]) -> list[float]:
    """Siblings are exclusive: scale their acceptance estimates so they sum to at most 0.95."""
    out = list(accept)
    for kids in tree.children():
        total = sum(out[c] for c in kids)
        if total > 0.95:
            for c in kids:
                out[c] *= 0.95 / total
    return out
