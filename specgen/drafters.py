"""Drafters: propose a token tree from the committed text, learn from each verification.

One interface (reset / propose / observe); "no proposal" is a tree with only the root.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .history import Continuation
from .kv import COMMITTED_SEQ, evaluate, keep_branch, prefill
from .planner import (LOOKUP_NODE, LOOP_MIN_MATCH, LOOP_NODE, MAJORITY, MAX_MATCH, MINORITY, SINGLE,
                      UNANIMOUS)
from .protocol import Batch, Context
from .sampling import SamplingParams, distribution, draw
from .tree import DraftTree
from .verify import Verdict


class SuffixAutomaton:
    """The text's suffix automaton, built online (Blumer et al.; O(1) amortised per token): for the
    text's end, the longest suffix that also ended earlier, however long, where an n-gram index
    only knows its last few tokens. States keep the end of their first occurrence."""

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.link, self.length, self.first_end = [-1], [0], [-1]
        self.last, self.n = 0, 0

    def _state(self, length: int, first_end: int, link: int = -1, nxt: dict[int, int] | None = None) -> int:
        self.next.append(nxt if nxt is not None else {})
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def extend(self, tok: int) -> None:
        cur = self._state(self.length[self.last] + 1, self.n)
        p = self.last
        while p != -1 and tok not in self.next[p]:
            self.next[p][tok] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][tok]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:  # split q: the shorter strings it stood for now also end here
                clone = self._state(self.length[p] + 1, self.first_end[q], self.link[q], dict(self.next[q]))
                while p != -1 and self.next[p].get(tok) == q:
                    self.next[p][tok] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last, self.n = cur, self.n + 1

    def longest_earlier(self) -> tuple[int, int]:
        """(length, continuation start) of the longest suffix of the text that also ended before
        its end, at its first occurrence; (0, -1) when none did."""
        state = self.link[self.last] if self.last else -1
        if state <= 0:
            return 0, -1
        return self.length[state], self.first_end[state] + 1


class LookupDrafter:
    """Prompt lookup / n-gram drafting over the prompt and the generated text (model-free).

    The longest suffix of the text (n = max_n..1) that occurred before proposes what followed its
    latest earlier occurrence. An index of n-gram -> continuation start, updated as tokens arrive,
    makes a proposal O(max_n) regardless of text length. Single-token matches must have recurred
    (`min_count_1`), as in llama.cpp's n-gram drafting, because one shared token predicts little.
    The draft length adapts like transformers' prompt-lookup heuristic: +2 after a fully accepted
    draft, -1 otherwise.
    """

    KEEP = 4  # occurrences remembered per n-gram (alternative continuations for a lookup tree)

    def __init__(self, max_n: int = 4, min_count_1: int = 2, k_init: int = 4, k_min: int = 1, k_max: int = 12):
        self.max_n, self.min_count_1 = max_n, min_count_1
        self.k, self.k_min, self.k_max = k_init, k_min, k_max
        self.tokens: list[int] = []
        self.suffixes = SuffixAutomaton()
        # per n: n-gram -> continuation starts of its latest occurrences, newest last
        self.index: list[dict[tuple[int, ...], list[int]]] = []
        self.counts: dict[tuple[int, ...], int] = {}  # single-token n-gram occurrences
        self._last_draft = 0
        self.last_choice = "lookup"

    def reset(self, tokens: list[int]) -> None:
        self.tokens = []
        self.index = [{} for _ in range(self.max_n + 1)]
        self.counts = {}
        self.suffixes = SuffixAutomaton()
        self._extend(tokens)

    def _extend(self, new: list[int]) -> None:
        toks = self.tokens
        for tok in new:
            i = len(toks)  # the n-grams ending just before position i continue at i
            for n in range(1, self.max_n + 1):
                if i - n < 0:
                    break
                key = tuple(toks[i - n:i])
                starts = self.index[n].setdefault(key, [])
                starts.append(i)
                if len(starts) > self.KEEP:
                    del starts[0]
                if n == 1:
                    self.counts[key] = self.counts.get(key, 0) + 1
            toks.append(tok)
            self.suffixes.extend(tok)

    def lookup(self, k: int) -> list[int]:
        return self.continuation(self.tokens, k)

    def continuation(self, context: list[int], k: int) -> list[int]:
        """What followed the latest earlier occurrence of the longest indexed suffix of `context`."""
        for n, start in self.matches(context, 1):
            return self.copy(start, k) if context is self.tokens else self.tokens[start:start + k]
        return []

    def matches(self, context: list[int], limit: int) -> list[tuple[int, int]]:
        """Up to `limit` (match length n, continuation start), longest match first, then newest.
        For the text itself, a match longer than the n-gram index's max_n comes first, found by
        the suffix automaton however long it is (a quoted passage whose last 4-gram recurs often)."""
        found: list[tuple[int, int]] = []
        seen: set[int] = set()
        if context is self.tokens:
            length, start = self.suffixes.longest_earlier()
            if length > self.max_n and start < len(self.tokens):
                found.append((length, start))
                seen.add(start)
        for n in range(min(self.max_n, len(context)), 0, -1):
            key = tuple(context[-n:])
            starts = self.index[n].get(key)
            if not starts or (n == 1 and self.counts.get(key, 0) < self.min_count_1):
                continue
            for start in reversed(starts):
                if start not in seen:
                    seen.add(start)
                    found.append((n, start))
                    if len(found) == limit:
                        return found
        return found

    def match_length(self, n: int, start: int, cap: int = MAX_MATCH) -> int:
        """How far the match of the text's last `n` tokens with the tokens before `start` really
        reaches back (up to `cap`): a 20-token match means a passage is being copied, and its
        continuation is far likelier to be right than a 4-gram's."""
        toks, end = self.tokens, len(self.tokens)
        length = n
        while length < cap and start - length - 1 >= 0 and toks[start - length - 1] == toks[end - length - 1]:
            length += 1
        return length

    def continuations(self, found: list[tuple[int, int]], k: int) -> list[Continuation]:
        """The matches() `found`, as continuations of up to k tokens keyed by true match length."""
        out = []
        for n, start in found:
            length = self.match_length(n, start)
            source = LOOP_NODE if length >= max(LOOP_MIN_MATCH, len(self.tokens) - start) else LOOKUP_NODE
            out.append(Continuation(self.copy(start, k), source, length))
        return out

    def copy(self, start: int, k: int) -> list[int]:
        """The k tokens from `start` on, where a copy that reaches the text's end goes on copying
        the tokens it has just drafted: the text is repeating itself with period len - start (a base
        model in a loop), and the draft continues the loop instead of stopping at its first turn.
        (llama.cpp's ngram-mod drafts loops the same way, looking its own draft tokens up.)"""
        out = self.tokens[start:start + k]
        period = len(self.tokens) - start
        while len(out) < k and period > 0:
            out.append(out[len(out) - period])
        return out

    def support(self, before: list[int], token: int, match_len: int, source: str = LOOKUP_NODE) -> int:
        """How this text's occurrences of the n-gram that ends `before` (the text and drafted
        tokens before a node; the node's effective match, up to max_n tokens) went on, for `token`:
        SINGLE (one occurrence), UNANIMOUS (2+, all with `token`), MAJORITY (more than half),
        MINORITY. SINGLE for other sources than this text (their own text is not indexed here)."""
        n = min(self.max_n, match_len, len(before))
        if source != LOOKUP_NODE or n <= 0:
            return SINGLE
        starts = self.index[n].get(tuple(before[len(before) - n:]))
        if not starts or len(starts) < 2:
            return SINGLE
        agree = sum(self.tokens[s] == token for s in starts)
        return UNANIMOUS if agree == len(starts) else MAJORITY if 2 * agree > len(starts) else MINORITY

    def supports(self, tree: DraftTree, lengths: list[int], sources: list[str]) -> list[int]:
        """support() of each node of a trie drafted from this text (root: its last token), given
        each node's effective match length and source."""
        out = [SINGLE] * len(tree)
        before: list[list[int]] = [self.tokens[-self.max_n:]] + [[] for _ in range(1, len(tree))]
        for v in range(1, len(tree)):
            u = tree.parents[v]
            before[v] = (before[u] + [tree.tokens[u]])[-self.max_n:] if u else before[0]
            out[v] = self.support(before[v], tree.tokens[v], lengths[v], sources[v])
        return out

    def propose(self, max_depth: int) -> DraftTree:
        draft = self.lookup(min(self.k, max_depth)) if max_depth > 0 else []
        self._last_draft = len(draft)
        return DraftTree.chain(self.tokens[-1], draft)

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        if self._last_draft:
            full = len(verdict.path) == self._last_draft
            self.k = min(self.k_max, self.k + 2) if full else max(self.k_min, self.k - 1)
        self._extend(committed)


def continuation_tree(root: int, continuations: list[Continuation], max_depth: int
                      ) -> tuple[DraftTree, list[str], list[int]]:
    """A trie of continuations (first given, first placed), and per node the source and match
    length of the continuation that proposed it: its acceptance key."""
    tree = DraftTree.root_only(root)
    sources, match_len = [""], [0]
    kids: list[dict[int, int]] = [{}]
    for cont in continuations:
        node = 0
        for tok in cont.tokens[:max_depth]:
            child = kids[node].get(tok)
            if child is None:
                child = tree.add(tok, node)
                kids[node][tok] = child
                kids.append({})
                sources.append(cont.source)
                match_len.append(cont.match_len)
            node = child
    return tree, sources, match_len


class DraftCache:
    """The draft model's KV cache, kept in step with the committed text in sequence 0.

    Proposals evaluate drafted tokens in extra sequences (one per branch); after verification the
    deepest accepted node that the draft evaluated is kept, everything else is removed by sequence
    id, so the next step evaluates only the tokens the draft has not seen (usually the bonus token).
    """

    # A lazy cache further behind than this starts over from the text's last WINDOW tokens: the
    # draft proposes from recent text (lookup copies from far back), and reading a long prompt
    # cost gemma's -d self draft 0.5 ms a token, 400 ms for a RAG prompt, paid by the first step
    # that uses it: a 3-token answer ran at a third of plain's speed. Verification keeps the output
    # exact whatever the draft has read.
    WINDOW = 256

    def __init__(self, ctx: Context, lazy: bool = False):
        self.ctx = ctx
        self.lazy = lazy  # leave the prompt to the first catch-up, which never comes if the draft is unused
        self.tokens: list[int] = []  # committed text (lazy: from where the draft started reading)
        self.n_eval = 0  # committed tokens evaluated into sequence 0
        self.caught_up = False  # whether this step evaluated the root (the last committed token)

    def reset(self, tokens: list[int]) -> None:
        """Prefill the prompt but its last token (the first root), as the target does (lazy: none)."""
        if self.lazy:
            self.ctx.clear()
        else:
            prefill(self.ctx, tokens)
        self.tokens = list(tokens)
        self.n_eval = 0 if self.lazy else len(tokens) - 1
        self.caught_up = False

    @property
    def behind(self) -> int:
        """Committed tokens the next catch-up evaluates (the root included)."""
        behind = len(self.tokens) - self.n_eval
        return min(behind, self.WINDOW) if self.lazy else behind

    def catch_up(self) -> np.ndarray:
        """Evaluate the committed tokens the draft has not seen; q-logits after the last one.
        Lazy, more than WINDOW behind: start over from the last WINDOW (positions from 0)."""
        if self.lazy and len(self.tokens) - self.n_eval > self.WINDOW:
            self.ctx.seq_rm(COMMITTED_SEQ, 0, -1)  # the only sequence between steps
            self.tokens, self.n_eval = self.tokens[-self.WINDOW:], 0
        last = evaluate(self.ctx, self.tokens[self.n_eval:], self.n_eval)
        self.n_eval = len(self.tokens)
        self.caught_up = True
        assert last is not None, "catch_up needs at least one unevaluated token (the root)"
        return last

    def commit(self, committed: list[int], kept_seq: int, kept_depth: int) -> None:
        """Keep the branch `kept_seq` up to `kept_depth` tokens past the root; drop the rest.

        A step that did not use the draft only appends: the next catch-up evaluates the backlog.
        """
        root_pos = len(self.tokens) - 1
        if self.caught_up:
            keep_branch(self.ctx, kept_seq, root_pos + kept_depth)
            self.n_eval = root_pos + kept_depth + 1
        self.tokens.extend(committed)
        self.caught_up = False


class ModelDrafter:
    """The draft model grows a tree best-first by cumulative draft probability (q = draft).

    Each level is one draft `llama_decode` for the whole frontier, every frontier node in the
    sequence of its own branch. Children: the top `branching` tokens of q (greedy), or `branching`
    draws from q without replacement when sampling (the tree then keeps q for rejection sampling).
    Greedy: only nodes among the best `max_nodes` so far are expanded, and the final tree is the
    best `max_nodes` nodes, ancestor-closed because a child's cumulative probability never exceeds
    its parent's. chain = branching 1 with `min_prob` (stop where the draft's top token is less
    likely than that).

    With `lookup` (the staged method, deterministic drafts only) a second stage drafts for the
    draft: the lookup continuation of the best frontier node rides along in the same draft decode,
    and each lookup token that equals the draft's own argmax joins the tree already evaluated, so
    one draft call can advance several levels. The tree is the one the draft alone would grow.
    """

    def __init__(self, ctx: Context, params: SamplingParams, branching: int = 1, max_nodes: int = 6,
                 max_depth: int = 8, min_prob: float = 0.0, lookup: LookupDrafter | None = None,
                 lookup_len: int = 4, lazy_prefill: bool = False):
        self.cache = DraftCache(ctx, lazy=lazy_prefill)  # lazy: for `auto`, which may not use the draft
        self.params = params
        self.sampling = not params.greedy
        self.rng = np.random.default_rng(None if params.seed is None else params.seed + 1)
        self.branching, self.max_nodes, self.max_depth = branching, max_nodes, max_depth
        self.min_prob = min_prob
        self.lookup = lookup if not self.sampling else None
        self.lookup_len = lookup_len
        self.draft_calls = 0
        self.catch_up_s = 0.0  # seconds the last proposal's first decode (the catch-up) took
        self._grow: _Growth | None = None  # the step's proposal, until observe(): None = a step without the draft
        self._last_tree = DraftTree.root_only(0)
        self.last_choice = "staged" if self.lookup is not None else "draft"

    def reset(self, tokens: list[int]) -> None:
        self._grow = None
        self.cache.reset(tokens)
        if self.lookup is not None:
            self.lookup.reset(tokens)

    @property
    def backlog(self) -> int:
        """Committed tokens the draft has not read yet (the root included): the next proposal's
        first decode reads them all."""
        return self.cache.behind

    def propose(self, max_depth: int, max_nodes: int | None = None) -> DraftTree:
        """The best tree of at most `max_nodes` (default: the drafter's own) drafted nodes."""
        limit = min(self.max_depth, max_depth)
        budget = self.max_nodes if max_nodes is None else max_nodes
        if limit > 0 and budget > 0:
            t0 = time.perf_counter()
            root_logits = self.cache.catch_up()  # first: it may start the draft's text over (WINDOW)
            self.catch_up_s = time.perf_counter() - t0
        g = self._grow = _Growth(DraftTree.root_only(self.cache.tokens[-1]), len(self.cache.tokens) - 1, budget)
        if limit <= 0 or budget <= 0:
            return self._proposed(g.tree)
        frontier = self._add_children(g, 0, root_logits)
        self.draft_calls += 1
        while expand := self._to_expand(g, frontier, limit):
            frontier = self._expand(g, expand, limit)
        self._proposed(g.tree)
        if self.sampling:
            return g.tree  # every drawn child stays: see _to_expand
        return self.restrict(g.best(budget))

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
        """Frontier nodes worth a draft evaluation, best cumulative probability first.

        Greedy: those among the best `max_nodes` so far; the final tree is pruned to those.
        Sampling: rejection sampling needs each node's children to be exactly the first draws
        from q, so nothing is pruned afterwards; instead a node is expanded only while its
        `branching` children still fit in `max_nodes` (a rule that never looks at the draws).
        """
        open_ = sorted((v for v in frontier if g.depth[v] < limit), key=lambda v: (-g.cum[v], v))
        if self.sampling:
            room = (g.budget - g.tree.n_drafted) // max(1, self.branching)
            chosen = open_[:max(0, room)]
        else:
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
        if self.lookup is not None:
            self.lookup.observe(verdict, committed)

    def _add_children(self, g: "_Growth", node: int, logits: np.ndarray) -> list[int]:
        q = distribution(logits, self.params) if self.sampling else softmax(logits)  # over the draft's columns
        if q.max() < self.min_prob:
            return []  # the draft is unsure here: stop this branch (decided before any draw)
        if self.sampling:
            picks = _draw_without_replacement(q, self.branching, self.rng)
            g.tree.q_rows[node] = self._over_target_vocab(q)
        else:
            picks = _top_k(q, self.branching)
        return [g.add(self._token(c), node, float(q[c])) for c in picks]

    def _token(self, column: int) -> int:
        columns = self.cache.ctx.columns
        return int(column) if columns is None else int(columns[column])

    def _over_target_vocab(self, q: np.ndarray) -> np.ndarray:
        """q as verification reads it: indexed by token id, zero where the draft has no column."""
        columns = self.cache.ctx.columns
        if columns is None:
            return q
        full = np.zeros(self.cache.ctx.n_vocab, dtype=q.dtype)
        full[columns] = q
        return full

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
            if child is None or tok != self._token(int(np.argmax(row))):
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
    cum: list[float] = field(default_factory=lambda: [1.0])
    depth: list[int] = field(default_factory=lambda: [0])
    seq_of: dict[int, int] = field(default_factory=lambda: {0: 0})
    handed_down: set[int] = field(default_factory=set)
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
        self.depth = [depth[i] for i in range(len(depth))]


def _draw_without_replacement(q: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    """k draws from q without replacement, in draw order (inverse CDF: one uniform per draw)."""
    picks: list[int] = []
    rest = q
    for _ in range(k):
        total = float(rest.sum())
        if total <= 0:
            break
        x = draw(rest / total, rng)
        picks.append(x)
        if len(picks) < k:
            rest = rest.copy() if rest is q else rest
            rest[x] = 0.0
    return picks


def _top_k(values: np.ndarray, k: int) -> list[int]:
    """Indices of the k largest values, largest first (a full sort of 262k costs ms)."""
    k = min(k, values.shape[0])
    if k <= 4:  # a few argmax passes beat argpartition over a large vocabulary
        picks: list[int] = []
        masked = values
        for _ in range(k):
            i = int(np.argmax(masked))
            picks.append(i)
            if len(picks) < k:
                masked = masked.copy() if masked is values else masked
                masked[i] = -np.inf
        return picks
    idx = np.argpartition(-values, k - 1)[:k]
    return [int(i) for i in idx[np.argsort(-values[idx], kind="stable")]]


def softmax(logits: np.ndarray) -> np.ndarray:
    x = np.exp(logits - logits.max(), dtype=np.float32)
    x /= x.sum(dtype=np.float64)
    return x
