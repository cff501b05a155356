"""Drafting sources beyond the current text, nearest first (hierarchy drafting): earlier texts of
this process, a persistent per-tokenizer store of past generations, and a user corpus.

Each source is a `TextIndex`: its token array (texts separated by SEPARATOR, so no match spans
two texts) and, per n-gram length, every position's n-gram hash sorted, so the occurrences of the
current text's last n tokens are found by binary search in O(log N), newest first, and a long
match (a quoted passage, a recurring template) is found as such by extending backwards. Building
is a few numpy sorts: a store of a million tokens indexes in well under a second.

The store (store.py) lives in $SPECGEN_HOME/history/<tokenizer>.v2.store: one checksummed
record per text, appended under an exclusive lock (several specgen processes may write at once),
cut to its newest STORE_KEEP tokens when it passes STORE_MAX; a damaged part is skipped and said.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from specgen.drafting.sources import CORPUS, MAX_MATCH, PROCESS, STORE, Continuation
from specgen.drafting.store import SEPARATOR, Store, join, store_path

# Store and store_path are re-exported: History's callers build their store from here.
__all__ = ["History", "SEPARATOR", "Store", "TextIndex", "join", "store_path", "vocab_key"]

HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
NEWEST_MIN, PROCESS_KEEP = 4096, 1_000_000  # tokens: see History


class TextIndex:
    """n-gram lookup over a fixed token array (see the module docstring)."""

    def __init__(self, tokens: np.ndarray, min_n: int = 3, max_n: int = 6):
        self.tokens = np.asarray(tokens, dtype=np.uint32)
        self.min_n, self.max_n = min_n, max_n
        self._keys: dict[int, np.ndarray] = {}
        self._starts: dict[int, np.ndarray] = {}
        t = self.tokens.astype(np.uint64)
        h = np.zeros(len(t) + 1, dtype=np.uint64)  # h[i]: hash of the n tokens before position i
        sep = np.zeros(len(t) + 1, dtype=bool)  # a separator among them: not an n-gram of one text
        with np.errstate(over="ignore"):
            for n in range(1, max_n + 1):
                prev = np.zeros(len(t) + 1, dtype=np.uint64)
                prev[n:] = t[: len(t) - n + 1] if n <= len(t) else prev[n:]
                h = h * HASH_MUL + prev
                was = np.zeros(len(t) + 1, dtype=bool)
                was[n:] = self.tokens[: len(t) - n + 1] == SEPARATOR if n <= len(t) else was[n:]
                sep |= was
                if n >= min_n:
                    starts = np.nonzero(~sep[n:len(t)])[0] + n  # continuation starts with a whole n-gram before
                    order = np.argsort(h[starts], kind="stable")
                    self._keys[n], self._starts[n] = h[starts][order], starts[order].astype(np.uint32)

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def _hash(suffix: Sequence[int]) -> np.uint64:
        h = np.uint64(0)
        with np.errstate(over="ignore"):
            for tok in suffix:  # oldest first, as the index folds them
                h = h * HASH_MUL + np.uint64(tok)
        return h

    def matches(self, context: Sequence[int], limit: int) -> list[tuple[int, int]]:
        """Up to `limit` (match length, continuation start), longest first, then newest."""
        found: list[tuple[int, int]] = []
        seen: set[int] = set()
        # Most steps match nothing: the shortest n-gram says so with one search (each longer
        # match contains it), before the longest-first search below.
        if len(context) < self.min_n or not self._count(self.min_n, context):
            return found
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            keys = self._keys.get(n)
            if keys is None or not len(keys):
                continue
            key = self._hash(context[-n:][::-1])
            lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
            for start in self._starts[n][lo:hi][::-1]:
                start = int(start)
                if start in seen:
                    continue
                length = self.match_length(context, start)
                if length >= n:  # else a hash collision
                    seen.add(start)
                    found.append((length, start))
                    if len(found) >= limit:
                        return sorted(found, key=lambda m: (-m[0], -m[1]))
        return sorted(found, key=lambda m: (-m[0], -m[1]))

    def _count(self, n: int, context: Sequence[int]) -> int:
        keys = self._keys.get(n)
        if keys is None or not len(keys):
            return 0
        key = self._hash(context[-n:][::-1])
        return int(np.searchsorted(keys, key, "right") - np.searchsorted(keys, key, "left"))

    def match_length(self, context: Sequence[int], start: int, cap: int = MAX_MATCH) -> int:
        """How many of the context's last tokens equal those before `start` (at most `cap`)."""
        length, toks = 0, self.tokens
        while length < min(cap, len(context), start) and toks[start - length - 1] == context[-length - 1]:
            length += 1
        return length

    def continuation(self, start: int, k: int) -> list[int]:
        run = self.tokens[start:start + k]
        cut = np.nonzero(run == SEPARATOR)[0]
        return [int(t) for t in (run[: cut[0]] if len(cut) else run)]


class History:
    """The sources after the current text, nearest first; see the module docstring."""

    def __init__(self, store: "Store | None" = None, corpus: Sequence[Sequence[int]] = ()):
        self.store = store
        # This process's earlier texts, in two indexes so that adding one costs a small rebuild:
        # the newest texts (rebuilt per text) and the rest (rebuilt when the newest reach a
        # quarter of its size, keeping the newest PROCESS_KEEP tokens): amortised O(N log N).
        self._older: list[np.ndarray] = []
        self._newest: list[np.ndarray] = []
        self._process: list[TextIndex] = []  # newest first
        self.indexes: dict[str, TextIndex] = {}
        if store is not None:
            stored = store.read()
            if len(stored):
                self.indexes[STORE] = TextIndex(stored)
        if corpus:
            self.indexes[CORPUS] = TextIndex(join(corpus))

    def add_text(self, tokens: Sequence[int]) -> None:
        """A finished text (prompt and output): searched by later texts, and kept in the store."""
        if len(tokens) < 2:
            return
        self._newest.append(np.asarray(tokens, dtype=np.uint32))
        newest, older = sum(map(len, self._newest)), sum(map(len, self._older))
        if newest > max(NEWEST_MIN, older // 4):
            self._older, self._newest = _newest_tokens(self._older + self._newest, PROCESS_KEEP), []
        self._process = [TextIndex(join(texts)) for texts in (self._newest, self._older) if texts]
        if self.store is not None:
            self.store.append(tokens)

    def forget_texts(self) -> None:
        self._older, self._newest, self._process = [], [], []

    def continuations(self, context: Sequence[int], k: int, limit: int) -> list[Continuation]:
        """From the nearest source that has a match, up to `limit` continuations of up to k tokens."""
        sources = [*((PROCESS, index) for index in self._process),
                   *((name, self.indexes[name]) for name in (STORE, CORPUS) if name in self.indexes)]
        for source, index in sources:
            found = [Continuation(index.continuation(start, k), source, length)
                     for length, start in index.matches(context, limit)]
            found = [c for c in found if c.tokens]
            if found:
                return found
        return []


def _newest_tokens(texts: list[np.ndarray], keep: int) -> list[np.ndarray]:
    """The newest whole texts holding at most `keep` tokens (at least the newest one)."""
    kept, total = [], 0
    for text in reversed(texts):
        if kept and total + len(text) > keep:
            break
        kept.append(text)
        total += len(text)
    return kept[::-1]


def vocab_key(fingerprint: object) -> str:
    """A tokenizer's name in the store: models that share a tokenizer share their history."""
    return hashlib.sha256(repr(fingerprint).encode()).hexdigest()[:16]
