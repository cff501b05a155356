"""Drafters: propose a token tree from the committed text, learn from each verification.

One interface (reset / propose / observe); "no proposal" is a tree with only the root.
"""

from __future__ import annotations

from typing import Protocol

from .tree import DraftTree
from .verify import Verdict


class Drafter(Protocol):
    def reset(self, tokens: list[int]) -> None:
        """Start a new text: `tokens` is the prompt; its last token is the first root."""

    def propose(self, max_depth: int) -> DraftTree:
        """A tree rooted at the last committed token, at most `max_depth` drafted tokens deep."""

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        """Feedback after verification; `committed` are the tokens that joined the text."""


class LookupDrafter:
    """Prompt lookup / n-gram drafting over the prompt and the generated text (model-free).

    The longest suffix of the text (n = max_n..1) that occurred before proposes what followed its
    latest earlier occurrence. An index of n-gram -> continuation start, updated as tokens arrive,
    makes a proposal O(max_n) regardless of text length. Single-token matches must have recurred
    (`min_count_1`), as in llama.cpp's n-gram drafting, because one shared token predicts little.
    The draft length adapts like transformers' prompt-lookup heuristic: +2 after a fully accepted
    draft, -1 otherwise.
    """

    def __init__(self, max_n: int = 4, min_count_1: int = 2, k_init: int = 4, k_min: int = 1, k_max: int = 12):
        self.max_n, self.min_count_1 = max_n, min_count_1
        self.k, self.k_min, self.k_max = k_init, k_min, k_max
        self.tokens: list[int] = []
        self.index: list[dict[tuple[int, ...], int]] = []  # per n: n-gram -> latest continuation start
        self.counts: dict[tuple[int, ...], int] = {}  # single-token n-gram occurrences
        self._last_draft = 0

    def reset(self, tokens: list[int]) -> None:
        self.tokens = []
        self.index = [{} for _ in range(self.max_n + 1)]
        self.counts = {}
        self._extend(tokens)

    def _extend(self, new: list[int]) -> None:
        toks = self.tokens
        for tok in new:
            i = len(toks)  # the n-grams ending just before position i continue at i
            for n in range(1, self.max_n + 1):
                if i - n < 0:
                    break
                key = tuple(toks[i - n:i])
                self.index[n][key] = i
                if n == 1:
                    self.counts[key] = self.counts.get(key, 0) + 1
            toks.append(tok)

    def lookup(self, k: int) -> list[int]:
        toks = self.tokens
        for n in range(min(self.max_n, len(toks)), 0, -1):
            key = tuple(toks[-n:])
            start = self.index[n].get(key)
            if start is None or (n == 1 and self.counts.get(key, 0) < self.min_count_1):
                continue
            return toks[start:start + k]
        return []

    def propose(self, max_depth: int) -> DraftTree:
        draft = self.lookup(min(self.k, max_depth)) if max_depth > 0 else []
        self._last_draft = len(draft)
        return DraftTree.chain(self.tokens[-1], draft)

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        if self._last_draft:
            full = len(verdict.path) == self._last_draft
            self.k = min(self.k_max, self.k + 2) if full else max(self.k_min, self.k - 1)
        self._extend(committed)
