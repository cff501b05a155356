"""Drafting under a constraint: the grammar's forced tokens as a free draft, any drafter's tree
pruned to what the grammar allows, and the drafter told of its own tree's outcome.

Where the grammar allows one continuation, its mask allows one token, the canonical one that
llguidance's `compute_ff_tokens` returns (holding back the last tokens where a longer token could
still merge): the mask itself fixes the canonical tokenization, in plain decoding too. So forced
tokens cost no draft decode and are accepted at any temperature: the trunk of every step's tree,
with the drafter's own tree beside and below it. They are still verified like any draft (the row
at each is masked to that one token), and counted apart from the drafter's (core/stats.py), as
are the drafter's accepted nodes where its path ran into a forced stretch (mark_forced_on_path).
`JumpDrafter` drafts nothing else: jump-forward decoding. Given a call-aware source (calls.py),
the trunk's end, where it is a tool call's free field, also gets that source's values, each with
the next key the grammar forces after it.
"""

from __future__ import annotations

from specgen.core.constraint import Constraint, Merged, merge_forced, prune
from specgen.core.protocol import Drafter
from specgen.core.sampling import Sampler
from specgen.drafting.calls import CALL, CallSource
from specgen.core.tree import DraftTree
from specgen.core.verify import Verdict

FORCED = "forced"  # the choice named in stats when a step drafted forced tokens alone


class ConstrainedDrafter:
    """Wraps a drafter for one constrained text. `max_nodes`, `max_leaves`: the target context's
    room for one verification (logits rows, sequence ids). `calls`: a call-aware source, whose
    nodes count as drafted (stats) and name the step CALL."""

    def __init__(self, inner: Drafter, constraint: Constraint, max_nodes: int, max_leaves: int,
                 calls: CallSource | None = None):
        self.inner, self.constraint, self.calls = inner, constraint, calls
        self.max_nodes, self.max_leaves = max_nodes, max_leaves
        self.last_choice = inner.last_choice
        self._merged: Merged | None = None
        self._pruned_index: dict[int, int] | None = None  # drafter index -> pruned index
        self._tree: DraftTree | None = None  # the last proposal
        self._call_firsts: list[int | None] = []  # each call chain's first node in it

    def reset(self, tokens: list[int], sampler: Sampler | None = None) -> None:
        self.inner.reset(tokens, sampler)

    def propose(self, max_depth: int) -> DraftTree:
        tree = self.inner.propose(max_depth)
        self.last_choice = self.inner.last_choice
        self._call_firsts = []
        pruned, self._pruned_index = prune(tree, self.constraint)
        whole = self.constraint.forced()
        forced = whole[:max_depth]
        merged = merge_forced(pruned, forced, self.max_nodes, self.max_leaves) if forced else None
        # The call-aware source drafts where the drafter proposed nothing beyond the trunk: where it
        # did (lookup found the earlier call in the prompt), that draft is priced and learned, and a
        # second opinion beside it would mostly add rows.
        bare = merged.tree.n_drafted == len(forced) if merged is not None else pruned.n_drafted == 0
        chains = self.calls.chains(self.constraint, forced, max_depth - len(forced)) \
            if self.calls is not None and bare and len(forced) == len(whole) else []
        if merged is None and not chains:
            self._merged, self._tree = None, pruned
            return pruned
        self._merged = merged if merged is not None else merge_forced(pruned, [], self.max_nodes, self.max_leaves)
        if forced and bare:  # the drafter added nothing
            self.last_choice = FORCED
        if chains:
            before = len(self._merged.tree)
            self._call_firsts = graft_chains(self._merged, len(forced), chains, self.max_nodes, self.max_leaves)
            if len(self._merged.tree) > before:  # nodes of its own, not only the drafter's again
                self.last_choice = CALL
        self._tree = self._merged.tree
        return self._tree

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        if self._tree is not None:
            mark_forced_on_path(self._tree, verdict, self.constraint)
        if self.calls is not None:
            if self._call_firsts:
                self.calls.learn([f is not None and f in verdict.path for f in self._call_firsts])
                self._call_firsts = []
            self.calls.observe(committed)
        self.inner.observe(self._inner_verdict(verdict), committed)

    def finish_text(self) -> None:
        self.inner.finish_text()

    def _inner_verdict(self, verdict: Verdict) -> Verdict:
        """The verdict in the drafter's own node indices: its accepted path ends where the walk
        left its tree (the rest of `committed` is text it did not propose, as a bonus token is)."""
        path = verdict.path
        if self._merged is not None:
            path = _prefix_in(path, self._merged.origin)
        if self._pruned_index is not None:
            back = {new: old for old, new in self._pruned_index.items()}
            path = [back[v] for v in path]
        return Verdict(path, verdict.tokens)


def graft_chains(merged: Merged, at: int, chains: list[list[int]], max_nodes: int, max_leaves: int
                 ) -> list[int | None]:
    """Add `chains` below node `at` (the trunk's end: merge_forced puts the trunk at 1..n) as a
    trie, joining deterministic nodes already there; the new nodes' origin is None (no drafter's).
    Returns each chain's first node (None: no room for it)."""
    tree = merged.tree
    kids = tree.children()
    leaves = len(tree.leaves())
    firsts: list[int | None] = []
    for chain in chains:
        node = at
        firsts.append(None)
        for token in chain:
            child = next((c for c in kids[node] if tree.tokens[c] == token), None)
            if child is None:
                if len(tree) >= max_nodes or (kids[node] and leaves >= max_leaves):
                    break
                leaves += bool(kids[node])
                child = tree.add(token, node)
                kids[node].append(child)
                kids.append([])
                merged.origin.append(None)
            if firsts[-1] is None:
                firsts[-1] = child
            node = child
    return firsts


def mark_forced_on_path(tree: DraftTree, verdict: Verdict, constraint: Constraint) -> None:
    """Add to `tree.forced` the accepted drafter nodes the grammar forced: where its path ran into
    a stretch the grammar forces (a key after a value), the grammar decided those tokens, not the
    drafter (core/stats.py). Verification left the matcher after the verdict's tokens: it walks
    them again from the step's start, asking at each whether the token was forced (about 10 us a
    token on smollm2's vocabulary), and ends where it was."""
    path = verdict.path
    if all(v in tree.forced for v in path):
        return
    constraint.rollback(len(verdict.tokens))
    for i, token in enumerate(verdict.tokens):
        if i < len(path) and path[i] not in tree.forced and constraint.forced()[:1] == [token]:
            tree.forced.add(path[i])
        constraint.consume(token)


class JumpDrafter:
    """The `jump` method's drafter: no proposal of its own. Wrapped in a ConstrainedDrafter (app/
    runner.py) its trees are the grammar's forced tokens alone, batched into the next decode (what
    SGLang and vLLM call jump-forward decoding); without a constraint every step is plain decoding."""

    last_choice = "plain"

    def __init__(self) -> None:
        self._root = 0

    def reset(self, tokens: list[int], sampler: Sampler | None = None) -> None:
        self._root = tokens[-1]

    def propose(self, max_depth: int) -> DraftTree:
        return DraftTree.root_only(self._root)

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        self._root = committed[-1]

    def finish_text(self) -> None:
        pass


def _prefix_in(path: list[int], origin: list[int | None]) -> list[int]:
    out = []
    for v in path:
        if origin[v] is None:
            break
        out.append(origin[v])
    return out
