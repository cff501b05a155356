"""A conversation (`specgen chat`): the turns so far, the system message, and its replies' totals.

Each question becomes a Prompt whose history holds the earlier turns (the system message first), so
the runner renders the whole conversation through the chat template; a measured method's drafter
(auto) lives as long as the runner, so later replies draft from earlier ones."""

from __future__ import annotations

from dataclasses import dataclass, field

from specgen.app.prompts import Message, Prompt
from specgen.app.runner import Completion
from specgen.core.stats import RunStats


@dataclass
class Conversation:
    system: str | None = None
    turns: list[Message] = field(default_factory=list)  # user and assistant, alternating
    replies: int = 0  # replies so far, across resets
    totals: RunStats = field(default_factory=RunStats)  # their counters, added up

    def ask(self, question: str) -> Prompt:
        """The prompt for the next reply: the conversation so far, then `question`."""
        system = (Message("system", self.system),) if self.system else ()
        return Prompt(self.replies, question, system + tuple(self.turns))

    def answered(self, prompt: Prompt, reply: Completion) -> None:
        """`reply` (finished or interrupted: the text it has) joins the conversation."""
        self.turns += [Message("user", prompt.text), Message("assistant", reply.text)]
        self.replies += 1
        self.totals.add(reply.stats)

    def reset(self) -> None:
        """Forget the turns (the system message and the totals stay)."""
        self.turns = []

    def summary(self) -> str:
        """The totals, e.g. `3 replies · 72 tok · 95.1 tok/s · 60 target calls · τ 1.20 · ...`."""
        if not self.replies:
            return "0 replies"
        return f"{self.replies} repl{'y' if self.replies == 1 else 'ies'} · {self.totals.line()}"
