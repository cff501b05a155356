"""Where each streamed piece of text came from: the text split by the source of its tokens (the
target's own, a lookup, the history, the draft model, a grammar's forced token), and the run's
tokens/s and τ so far. Streamed chunks carry it as a `specgen` object (docs/serve.md); the page at
/ colours the text by it."""

from __future__ import annotations

import bisect

from dataclasses import dataclass

from specgen.app.callstream import CallArguments, CallHead
from specgen.core.stats import RunStats
from specgen.serve.logprob_shapes import EmittedLogprob


@dataclass(frozen=True)
class Mark:
    text: str
    source: str  # "target", "forced", or the drafter's choice of the step ("lookup", "history", "draft", ...)


@dataclass(frozen=True)
class Live:
    """The run's numbers when a piece was shown."""

    tokens: int
    tokens_per_s: float
    mean_accepted: float  # τ: tokens committed per target call

    @staticmethod
    def of(stats: RunStats) -> "Live":
        return Live(stats.n_tokens, stats.tokens_per_s, stats.mean_accepted)


@dataclass(frozen=True)
class Piece:
    """Text that may be shown now, split into marks by source."""

    text: str
    marks: tuple[Mark, ...]
    live: Live
    tokens: tuple[int, ...] = ()  # the ids of the tokens whose text starts in this piece
    logprobs: tuple["EmittedLogprob", ...] = ()  # those tokens' log-probabilities, when the request asked for them
    calls: tuple[CallHead | CallArguments, ...] = ()  # with tools: the calls' fragments written meanwhile

    def extension(self) -> dict:
        """The `specgen` object of a streamed chunk."""
        return {"sources": [[m.text, m.source] for m in self.marks], "tokens": self.live.tokens,
                "tokens_per_s": round(self.live.tokens_per_s, 2), "mean_accepted": round(self.live.mean_accepted, 3)}


class Sources:
    """Each token's source by where its text starts in the generated text; `cut` splits a stretch
    of that text by them. A token whose text is empty (half a UTF-8 character) gives its source to
    nothing: the character is shown with the token that completes it."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._sources: list[str] = []
        self._ids: list[tuple[int, int]] = []  # (where its text starts, token id), every token

    def add(self, at: int, source: str, token: int = -1) -> None:
        self._ids.append((at, token))
        if self._starts and self._starts[-1] == at:
            self._sources[-1] = source  # the previous token's text was empty
        else:
            self._starts.append(at)
            self._sources.append(source)

    def tokens(self, start: int, end: int) -> tuple[int, ...]:
        """The ids of the tokens whose text starts in [start, end) (an empty one: where the next starts)."""
        first = bisect.bisect_left(self._ids, (start, -1 << 62))
        last = bisect.bisect_left(self._ids, (end, -1 << 62))
        return tuple(t for _, t in self._ids[first:last])

    def cut(self, text: str, start: int, end: int) -> tuple[Mark, ...]:
        """`text[start:end]` as marks, neighbours of one source merged."""
        marks: list[Mark] = []
        for i in range(max(0, bisect.bisect_right(self._starts, start) - 1), len(self._starts)):
            at, source = self._starts[i], self._sources[i]
            if at >= end:
                break
            stop = self._starts[i + 1] if i + 1 < len(self._starts) else len(text)
            a, b = max(at, start), min(stop, end)
            if a >= b:
                continue
            if marks and marks[-1].source == source:
                marks[-1] = Mark(marks[-1].text + text[a:b], source)
            else:
                marks.append(Mark(text[a:b], source))
        return tuple(marks)
