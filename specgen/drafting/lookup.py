"""Model-free drafting from the text itself: prompt lookup over an n-gram index and a suffix
automaton, and the trie auto builds from continuations of several sources."""

from __future__ import annotations

from specgen.core.sampling import Sampler
from specgen.core.tree import DraftTree
from specgen.core.verify import Verdict
from specgen.drafting.sources import (LOOKUP_NODE, LOOP_MIN_MATCH, LOOP_NODE, MAJORITY, MAX_MATCH, MINORITY, SINGLE,
                                      UNANIMOUS, Continuation)


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

    def reset(self, tokens: list[int], sampler: Sampler | None = None) -> None:
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

    def finish_text(self) -> None:
        """Nothing to keep: this drafter drafts from the current text alone."""


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
