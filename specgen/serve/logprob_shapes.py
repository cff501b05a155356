"""Token log-probabilities as the server answers them (core/logprobs.py computes them): which tokens
go with which piece of shown text, and OpenAI's chat and completions shapes and llama-server's
`completion_probabilities`.

A token goes out with the first piece of text that shows its start; tokens that begin inside a stop
string (never shown) are never sent. A log-probability of -inf (a token banned by logit_bias yet
forced by a grammar) is written as -9999.0, as OpenAI writes the unlikeliest, since JSON has no -inf."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specgen.core.logprobs import TokenLogprob
from specgen.core.protocol import Model

FLOOR = -9999.0


@dataclass(frozen=True)
class LogprobEntry:
    """A token as the logprobs answers write it, the chosen one or a top alternative."""

    token: int
    piece: bytes  # the token's bytes (a piece of a multi-byte character is not text on its own)
    logprob: float

    @property
    def text(self) -> str:
        return self.piece.decode("utf-8", "replace")


@dataclass(frozen=True)
class EmittedLogprob:
    """One emitted token: its own LogprobEntry, where its text starts in the answer (characters), the
    alternatives most likely first."""

    chosen: LogprobEntry
    offset: int
    top: tuple[LogprobEntry, ...]


def emitted_logprob(model: Model, lp: TokenLogprob, offset: int) -> EmittedLogprob:
    def entry(token: int, logprob: float) -> LogprobEntry:
        return LogprobEntry(token, model.piece(token), max(logprob, FLOOR) if not math.isnan(logprob) else FLOOR)

    return EmittedLogprob(entry(lp.token, lp.logprob), offset, tuple(entry(a.token, a.logprob) for a in lp.top))


class Pending:
    """Emitted tokens' log-probabilities waiting for the text that shows them (a stop string may hold text back)."""

    def __init__(self) -> None:
        self.waiting: list[EmittedLogprob] = []
        self.sent: list[EmittedLogprob] = []

    def add(self, item: EmittedLogprob) -> None:
        self.waiting.append(item)

    def release(self, upto: int, inclusive: bool = False) -> list[EmittedLogprob]:
        """Those whose text starts before character `upto` of the answer (`inclusive`: at it too,
        the answer's end, where a token may have brought no text of its own)."""
        n = 0
        while n < len(self.waiting) and (self.waiting[n].offset < upto or inclusive and self.waiting[n].offset <= upto):
            n += 1
        out, self.waiting = self.waiting[:n], self.waiting[n:]
        self.sent.extend(out)
        return out


def chat_content(items: list[EmittedLogprob]) -> dict:
    """OpenAI chat: choices[i].logprobs = {"content": [...]}."""
    return {"content": [{"token": s.chosen.text, "logprob": s.chosen.logprob, "bytes": list(s.chosen.piece),
                         "top_logprobs": [{"token": c.text, "logprob": c.logprob, "bytes": list(c.piece)}
                                          for c in s.top]} for s in items]}


def completion_logprobs(items: list[EmittedLogprob]) -> dict:
    """OpenAI completions (legacy): parallel lists; top_logprobs one {token text: logprob} per token."""
    return {"tokens": [s.chosen.text for s in items], "token_logprobs": [s.chosen.logprob for s in items],
            "top_logprobs": [{c.text: c.logprob for c in s.top} for s in items],
            "text_offset": [s.offset for s in items]}


def native_probabilities(items: list[EmittedLogprob]) -> list[dict]:
    """llama-server's completion_probabilities (n_probs, post_sampling_probs false)."""
    return [{"id": s.chosen.token, "token": s.chosen.text, "logprob": s.chosen.logprob, "bytes": list(s.chosen.piece),
             "top_logprobs": [{"id": c.token, "token": c.text, "logprob": c.logprob, "bytes": list(c.piece)}
                              for c in s.top]} for s in items]
