"""Drafting with a draft model: a best-first tree (a chain with branching 1) grown in the draft's
own KV cache, kept in step with the committed text, optionally with lookup drafting for it (staged)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from specgen.core.protocol import Batch, Context
from specgen.core.sampling import Sampler, SamplingParams, softmax
from specgen.core.tree import DraftTree
from specgen.core.verify import Verdict
from specgen.drafting.acceptance import race_estimates
from specgen.drafting.draft_cache import DraftCache
from specgen.drafting.lookup import LookupDrafter


class ModelDrafter:
    """The draft model grows a tree best-first by cumulative draft probability (q = draft).

    Each level is one draft `llama_decode` for the whole frontier, every frontier node in the
    sequence of its own branch. Children: the draft's own first `branching` choices at the child's
    position (Sampler.ranking): its top tokens when greedy; when sampling, the first finishers of its
    race with the noise the target will race with (core/race.py), so where q is near p the draft's
    winner is the target's. Only nodes among the best `max_nodes` so far (by cumulative q) are
    expanded, and the final tree is the best `max_nodes` nodes, ancestor-closed because a child's
    cumulative probability never exceeds its parent's. chain = branching 1 with `min_prob` (stop
    where the draft's top token is less likely than that). When sampling, a node's q is not the
    draft's probability but its estimate that the node wins the target's race, from the margin of
    the draft's own race (acceptance.race_estimates), and `leaves` more finishers join as siblings
    the draft never expands: where the margin is thin, the runner-up is the target's winner often
    enough to verify at the cost of one more row, without another draft decode.

    With `lookup` (the staged method) a second stage drafts for the draft (the index is read here,
    kept current by its owner: Staged below, or auto): the lookup
    continuation of the best frontier node rides along in the same draft decode, and each lookup
    token that equals the draft's own choice there (its argmax; when sampling, its race winner)
    joins the tree already evaluated, so one draft call can advance several levels. The draft
    still chooses every token: the stage only saves it decodes.
    """

    def __init__(self, ctx: Context, params: SamplingParams, branching: int = 1, max_nodes: int = 6,
                 max_depth: int = 8, min_prob: float = 0.0, lookup: LookupDrafter | None = None,
                 lookup_len: int = 4, lazy_prefill: bool = False, leaves: int = 0):
        self.cache = DraftCache(ctx, lazy=lazy_prefill)  # lazy: for `auto`, which may not use the draft
        self.params = params
        self.sampler = Sampler(params)  # reset() takes the run's own, whose seed the target races with
        self._n_text = 0  # tokens of the whole text (the draft's cache may hold only its end)
        self._column_of: np.ndarray | None = None  # a subset draft's column of each target id
        self.branching, self.max_nodes, self.max_depth = branching, max_nodes, max_depth
        self.leaves = leaves  # extra finishers as unexpanded siblings, when sampling
        self.min_prob = min_prob
        self.lookup = lookup
        self.lookup_len = lookup_len
        self.draft_calls = 0  # draft decodes, all proposals
        # The last proposal's work, for auto's accounting: its draft decodes, and the seconds its
        # first decode (the catch-up on committed text) took.
        self.last_calls, self.last_catch_up_s = 0, 0.0
        self._grow: _Growth | None = None  # the step's proposal, until observe(): None = a step without the draft
        self._last_tree = DraftTree.root_only(0)
        self.last_choice = "staged" if self.lookup is not None else "draft"

    def reset(self, tokens: list[int], sampler: Sampler | None = None) -> None:
        self._grow = None
        self.sampler = sampler or self.sampler
        self._n_text = len(tokens)
        self.cache.reset(tokens)

    @property
    def backlog(self) -> int:
        """Committed tokens the draft has not read yet (the root included): the next proposal's
        first decode reads them all."""
        return self.cache.behind

    def propose(self, max_depth: int, max_nodes: int | None = None) -> DraftTree:
        """The best tree of at most `max_nodes` (default: the drafter's own) drafted nodes."""
        limit = min(self.max_depth, max_depth)
        budget = self.max_nodes if max_nodes is None else max_nodes
        calls = self.draft_calls
        if limit > 0 and budget > 0:
            t0 = time.perf_counter()
            root_logits = self.cache.catch_up()  # first: it may start the draft's text over (WINDOW)
            self.last_catch_up_s = time.perf_counter() - t0
        g = self._grow = _Growth(DraftTree.root_only(self.cache.tokens[-1]), len(self.cache.tokens) - 1, budget,
                                 self._n_text - len(self.cache.tokens))
        if limit <= 0 or budget <= 0:
            self.last_calls = 0
            return self._proposed(g.tree)
        frontier = self._add_children(g, 0, root_logits)
        self.draft_calls += 1
        while expand := self._to_expand(g, frontier, limit):
            frontier = self._expand(g, expand, limit)
        self.last_calls = self.draft_calls - calls
        self._proposed(g.tree)
        return self.restrict(g.best(budget))

    @property
    def confidence(self) -> dict[int, float]:
        """Per node of the last proposal that the draft evaluated: its q row's top probability."""
        return self._grow.confidence if self._grow is not None else {}

    def restrict(self, nodes: list[int]) -> DraftTree:
        """The last proposal cut to `nodes` (ancestor-closed) and re-indexed; the draft's KV
        bookkeeping follows, so observe() keeps what it can."""
        assert self._grow is not None, "restrict() follows a propose()"
        pruned, new_index = self._last_tree.subtree([0, *nodes])
        self._grow.reindex(new_index)
        return self._proposed(pruned)

    def _proposed(self, tree: DraftTree) -> DraftTree:
        self._last_tree = tree
        return tree

    def _to_expand(self, g: "_Growth", frontier: list[int], limit: int) -> list[int]:
        """Frontier nodes worth a draft evaluation, best cumulative probability first: those among
        the best `max_nodes` so far (the final tree is pruned to those)."""
        open_ = sorted((v for v in frontier if g.depth[v] < limit and v not in g.leaf), key=lambda v: (-g.cum[v], v))
        best = set(g.best(g.budget))
        chosen = [v for v in open_ if v in best]
        return chosen[:max(0, self.cache.ctx.n_seq_max - g.next_seq)]  # sequence ids left

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        g, self._grow = self._grow, None
        node = 0
        if g is not None:
            for v in verdict.path:  # the deepest accepted node whose KV the draft already has
                if v in g.seq_of:
                    node = v
        seq = g.seq_of.get(node, 0) if g is not None else 0
        self.cache.commit(committed, seq, g.depth[node] if g is not None else 0)
        self._n_text += len(committed)

    def finish_text(self) -> None:
        """Nothing to keep: the draft model drafts from the current text alone."""

    def _add_children(self, g: "_Growth", node: int, logits: np.ndarray) -> list[int]:
        sampled = not self.sampler.params.greedy
        if sampled and self.min_prob <= 0:  # q from the race's margins: no softmax of the row needed
            picks, scores = self._choices(logits, g.pos(node) + g.offset + 1, self.branching + self.leaves)
            qs = race_estimates(scores)
            g.confidence[node] = qs[0] if qs else 0.0
        else:
            # q over the draft's columns, tempered (not truncated: it only ranks and stops branches)
            t = self.sampler.params.temperature
            q = softmax(logits) if t <= 0 else softmax(logits * np.float32(1.0 / t))
            confidence = g.confidence[node] = float(q.max())
            if confidence < self.min_prob:
                return []  # the draft is unsure here: stop this branch
            picks, scores = self._choices(logits, g.pos(node) + g.offset + 1,
                                          self.branching + (self.leaves if sampled else 0))
            qs = race_estimates(scores) if sampled else [float(q[c]) for c in picks]
        kids = [g.add(self._token(c), node, p) for c, p in zip(picks, qs)]
        g.leaf.update(kids[self.branching:])
        return kids[:self.branching]

    def _choices(self, logits: np.ndarray, position: int, k: int) -> tuple[list[int], list[float]]:
        """The draft's first k choices (columns) for the token at `position` of the text, and
        their scores (Sampler.finishers)."""
        columns = self.cache.ctx.columns
        if columns is None:
            return self.sampler.finishers(logits, position, k)
        full = np.full(self.cache.ctx.n_vocab, -np.inf, dtype=logits.dtype)  # raced by token id
        full[columns] = logits
        if self._column_of is None:  # a subset's ids need not be sorted: map them back by table
            self._column_of = np.full(self.cache.ctx.n_vocab, -1, dtype=np.int64)
            self._column_of[columns] = np.arange(len(columns))
        ids, scores = self.sampler.finishers(full, position, k)
        return [int(self._column_of[i]) for i in ids], scores

    def _token(self, column: int) -> int:
        columns = self.cache.ctx.columns
        return int(column) if columns is None else int(columns[column])

    def _expand(self, g: "_Growth", expand: list[int], limit: int) -> list[int]:
        """One draft decode for `expand` (plus a lookup run after the best node); new children."""
        batch = Batch()
        rows: list[tuple[int, int]] = []
        run: list[int] = []
        for v in sorted(expand, key=lambda v: -g.cum[v]):
            seq = g.take_seq(v, self.cache.ctx)
            rows.append((v, len(batch)))
            batch.add(g.tree.tokens[v], g.pos(v), (seq,), True)
            if self.lookup is not None and len(rows) == 1:
                room = min(self.lookup_len, limit - g.depth[v] - 1)
                context = self.cache.tokens + [g.tree.tokens[u] for u in g.tree.path_to(v)]
                run = self.lookup.continuation(context, room) if room > 0 else []
                for j, tok in enumerate(run):
                    batch.add(tok, g.pos(v) + 1 + j, (seq,), True)
        out = self.cache.ctx.decode(batch)
        self.draft_calls += 1
        new: list[int] = []
        for k, (v, b) in enumerate(rows):
            kids = self._add_children(g, v, out[b])
            if k == 0 and run:
                kids = self._stage_two(g, v, b, out, run, kids)
            new.extend(kids)
        return new

    def _stage_two(self, g: "_Growth", v: int, b: int, out: np.ndarray, run: list[int], kids: list[int]) -> list[int]:
        """Lookup tokens the draft agrees with (argmax) are evaluated nodes; drop the rest's KV."""
        node, seq, new = v, g.seq_of[v], list(kids)
        for j, tok in enumerate(run):
            row = out[b + j]
            child = next((c for c in g.tree.children()[node] if g.tree.tokens[c] == tok), None)
            if child is None or tok != self._token(self._choices(row, g.pos(node) + g.offset + 1, 1)[0][0]):
                self.cache.ctx.seq_rm(seq, g.pos(node) + 1, -1)
                break
            g.claim(node, child, seq)
            new.remove(child)
            node = child
            new.extend(self._add_children(g, node, out[b + 1 + j]))
        return new


@dataclass
class _Growth:
    """One proposal's tree under construction and its draft-KV bookkeeping.

    seq_of[v]: the draft sequence holding the path root..v for every node the draft evaluated.
    A node's sequence is handed to its first evaluated child; later children get a copy of the
    parent's path (positions up to the parent only) in a fresh sequence id.
    """

    tree: DraftTree
    root_pos: int
    budget: int  # drafted nodes the proposal may keep
    offset: int = 0  # the text's tokens before the draft cache's first: positions in the text are pos + offset
    cum: list[float] = field(default_factory=lambda: [1.0])
    confidence: dict[int, float] = field(default_factory=dict)  # per expanded node: its q row's top probability
    depth: list[int] = field(default_factory=lambda: [0])
    seq_of: dict[int, int] = field(default_factory=lambda: {0: 0})
    handed_down: set[int] = field(default_factory=set)
    leaf: set[int] = field(default_factory=set)  # siblings the draft does not expand
    next_seq: int = 1

    def add(self, token: int, parent: int, q: float) -> int:
        v = self.tree.add(token, parent, q)
        self.cum.append(self.cum[parent] * q)
        self.depth.append(self.depth[parent] + 1)
        return v

    def pos(self, v: int) -> int:
        return self.root_pos + self.depth[v]

    def best(self, n: int) -> list[int]:
        order = sorted(range(1, len(self.cum)), key=lambda v: (-self.cum[v], v))
        return sorted(order[:n])

    def claim(self, parent: int, child: int, seq: int) -> None:
        self.handed_down.add(parent)
        self.seq_of[child] = seq

    def take_seq(self, v: int, ctx: Context) -> int:
        parent = self.tree.parents[v]
        if parent not in self.handed_down:
            seq = self.seq_of[parent]
        else:
            seq = self.next_seq
            self.next_seq += 1
            ctx.seq_cp(self.seq_of[parent], seq, -1, self.pos(parent) + 1)
        self.claim(parent, v, seq)
        return seq

    def reindex(self, new_index: dict[int, int]) -> None:
        """Follow DraftTree.subtree's re-indexing; forget nodes that were pruned."""
        depth = {new: self.depth[old] for old, new in new_index.items()}
        self.seq_of = {new_index[v]: s for v, s in self.seq_of.items() if v in new_index}
        self.confidence = {new_index[v]: c for v, c in self.confidence.items() if v in new_index}
        self.leaf = {new_index[v] for v in self.leaf if v in new_index}
        self.depth = [depth[i] for i in range(len(depth))]


class Staged:
    """The `staged` method: a ModelDrafter drafting with a lookup index of its own, kept current here."""

    def __init__(self, model: ModelDrafter, lookup: LookupDrafter):
        self.model, self.lookup = model, lookup

    @classmethod
    def build(cls, ctx: Context, params: SamplingParams, **kw) -> "Staged":
        lookup = LookupDrafter()
        return cls(ModelDrafter(ctx, params, lookup=lookup, **kw), lookup)

    def __getattr__(self, name: str):  # the draft's counters and cache, for stats and tests
        return getattr(self.model, name)

    @property
    def last_choice(self) -> str:
        return self.model.last_choice

    def reset(self, tokens: list[int], sampler: Sampler | None = None) -> None:
        self.model.reset(tokens, sampler)
        self.lookup.reset(tokens)

    def propose(self, max_depth: int) -> DraftTree:
        return self.model.propose(max_depth)

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        self.model.observe(verdict, committed)
        self.lookup.observe(verdict, committed)

    def finish_text(self) -> None:
        """Nothing to keep: the staged method drafts from the current text alone."""
