"""Prompt input: an argument, stdin, a .txt file (one prompt per line) or a .jsonl file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, TextIO

from specgen.app.stops import stops_of
from specgen.app.structured import Tools, offered_tools, read_tools, response_format
from specgen.core.constraint import ConstraintSpec
from specgen.errors import ConfigError, ConstraintError, PromptError


ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Message:
    role: str  # system | user | assistant | tool
    content: str
    tool_calls: tuple[dict, ...] = ()  # an assistant's calls, OpenAI's shape
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None

    def as_dict(self) -> dict:
        out: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class Prompt:
    index: int
    text: str  # the (last) user message the model answers
    history: tuple[Message, ...] = ()  # earlier turns of a conversation, oldest first
    # Messages after that user message: an assistant's tool calls and their results, a system
    # nudge, or a last assistant message that the answer continues (prefill).
    after: tuple[Message, ...] = ()
    constraint: ConstraintSpec | None = None  # the answer must match it (response_format, --json-schema)
    tools: Tools | None = None  # functions the answer may call
    offered: tuple[dict, ...] = ()  # functions named but not callable (tool_choice none): listed still
    stop: tuple[str, ...] | None = None  # a record's own stop strings (None: the command's; app/stops.py)
    # Variables for the chat template beside the messages (llama-server's chat_template_kwargs, e.g.
    # enable_thinking), as (name, JSON text) pairs.
    template_vars: tuple[tuple[str, str], ...] = ()
    # A raw prompt's special-token text (`<|im_start|>`) read as those tokens, as llama-server's
    # completion routes read it; False: as plain text. A chat template's text is always parsed.
    parse_special: bool = False

    @property
    def listed(self) -> tuple[dict, ...]:
        """Every function the request offers, whatever tool_choice says: the prompt lists them all."""
        return self.tools.functions if self.tools is not None else self.offered

    @property
    def constrained(self) -> bool:
        """The answer must match something: a response format, or the tools' grammar."""
        return self.constraint is not None or self.tools is not None

    def messages(self, system: str | None = None) -> list[dict]:
        """The conversation as chat-template messages; `system` applies unless the history has one."""
        turns = [m.as_dict() for m in self.history]
        if system and not (turns and turns[0]["role"] == "system"):
            turns.insert(0, {"role": "system", "content": system})
        return turns + [{"role": "user", "content": self.text}] + [m.as_dict() for m in self.after]

    def followed_by(self, answer: str, question: str) -> "Prompt":
        """The next turn: this prompt, the model's answer, then a new question, asked under the same
        constraint, tools and stop strings (a multi-turn suite under --json-schema constrains every turn)."""
        return Prompt(self.index, question, self.history + (Message("user", self.text), *self.after,
                                                            Message("assistant", answer)),
                      constraint=self.constraint, tools=self.tools, offered=self.offered, stop=self.stop)


def decode_utf8(data: bytes, origin: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise PromptError(f"{origin}: expected UTF-8 text, found byte 0x{data[e.start]:02x} on line {line}") from None


def message_from(m: object, where: str) -> Message:
    """One OpenAI chat message: a role, text content (a string, text parts, or null beside an
    assistant's tool calls), and the tool fields."""
    role = m.get("role") if isinstance(m, dict) else None
    role = "system" if role == "developer" else role
    if role not in ROLES:
        raise PromptError(f"{where}.role expects one of {', '.join(ROLES)}, found {json.dumps(role)[:40]}")
    content = m.get("content")
    calls = m.get("tool_calls") or ()
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    if content is None and (calls or role in ("assistant", "tool")):
        content = ""
    if not isinstance(content, str):
        raise PromptError(f"{where}.content expects text (a string or text parts), found {json.dumps(content)[:60]}")
    if not (isinstance(calls, (list, tuple)) and all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                    for c in calls)):
        raise PromptError(f"{where}.tool_calls expects a list of {{\"id\", \"type\": \"function\", \"function\": "
                          f"{{\"name\", \"arguments\"}}}}, found {json.dumps(calls)[:60]}")
    call_id, name = m.get("tool_call_id"), m.get("name")
    return Message(role, content, tuple(calls), call_id if isinstance(call_id, str) else None,
                   name if isinstance(name, str) else None)


def split_turns(turns: list[Message], where: str) -> tuple[str, tuple[Message, ...], tuple[Message, ...]]:
    """(the last user message, the turns before it, the turns after it). After it may come an
    assistant's tool calls with their results, system messages, and a last assistant message
    that the answer continues; not tool calls still waiting for their results."""
    users = [i for i, m in enumerate(turns) if m.role == "user"]
    if not users:
        raise PromptError(f"{where}: expected at least one user message, found roles "
                          f"{', '.join(m.role for m in turns) or 'none'}")
    k = users[-1]
    after = tuple(turns[k + 1:])
    if after and after[-1].role == "assistant" and after[-1].tool_calls:
        raise PromptError(f"{where}: the conversation ends with an assistant's tool calls: expected their results "
                          "(role tool) after them")
    return turns[k].content, tuple(turns[:k]), after


def _conversation(messages: object, where: str) -> tuple[str, tuple[Message, ...], tuple[Message, ...]]:
    """{"messages": [{"role": ..., "content": ...}, ...]} with at least one user message."""
    if not isinstance(messages, list) or not messages:
        raise PromptError(f"{where}: \"messages\" must be a non-empty list, found {json.dumps(messages)[:60]}")
    return split_turns([message_from(m, f"{where}: message {i}") for i, m in enumerate(messages, 1)], where)


def _structured(record: dict, where: str) -> dict:
    """A record's response_format, tools, tool_choice, parallel_tool_calls and stop (OpenAI's
    fields), as Prompt fields."""
    try:
        return dict(constraint=response_format(record.get("response_format")),
                    tools=read_tools(record.get("tools"), record.get("tool_choice"),
                                     record.get("parallel_tool_calls", True)),
                    offered=offered_tools(record.get("tools"), record.get("tool_choice")),
                    stop=None if record.get("stop") is None else stops_of(record["stop"], '"stop"'))
    except (ConstraintError, ConfigError) as e:
        raise PromptError(f"{where}: {e}") from None


def _jsonl_prompt(record: object, origin: str, lineno: int, index: int) -> Prompt:
    where = f"{origin} line {lineno}"
    if isinstance(record, dict):
        if isinstance(record.get("prompt"), str):
            return Prompt(index, record["prompt"], **_structured(record, where))
        if "messages" in record:
            text, history, after = _conversation(record["messages"], where)
            return Prompt(index, text, history, after, **_structured(record, where))
        turns = record.get("turns")
        if isinstance(turns, list) and turns and isinstance(turns[0], str):
            return Prompt(index, turns[0])  # Spec-Bench record: the first turn is the prompt
    raise PromptError(f"{where}: expected an object with \"prompt\" (text), \"messages\" (chat turns) or "
                      f"\"turns\" (list of text), found {json.dumps(record)[:80]}")


def jsonl_records(text: str, origin: str) -> Iterator[tuple[int, object]]:
    """(line number, parsed JSON) for each non-blank line; a bad line is one error naming it."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptError(f"{origin} line {lineno}: not valid JSON ({e.msg})") from None


def parse_prompt_file(path: Path) -> list[Prompt]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PromptError(f"prompt file not found: {path}") from None
    except IsADirectoryError:
        raise PromptError(f"expected a prompt file, got a directory: {path}") from None
    except OSError as e:
        raise PromptError(f"cannot read prompt file {path}: {e.strerror}") from None
    text = decode_utf8(data, str(path))
    if path.suffix.lower() == ".jsonl":
        prompts = [_jsonl_prompt(record, str(path), lineno, i)
                   for i, (lineno, record) in enumerate(jsonl_records(text, str(path)))]
    else:
        prompts = [Prompt(i, line) for i, line in enumerate(line for line in text.splitlines() if line.strip())]
    if not prompts:
        raise PromptError(f"prompt file {path} has no prompts (expected one per line)")
    for p in prompts:
        if not p.text.strip():
            raise PromptError(f"{path}: prompt {p.index + 1} is empty")
    return prompts


def collect_prompts(argument: str | None, prompts_file: Path | None, stdin: TextIO | None) -> list[Prompt]:
    """PROMPT text; "-" (or no PROMPT with stdin piped) reads stdin as one prompt; -f reads a file."""
    if prompts_file is not None:
        if argument is not None:
            raise PromptError("give either PROMPT or -f/--prompts FILE, not both")
        return parse_prompt_file(prompts_file)
    if argument is None or argument == "-":
        if stdin is None or (argument is None and stdin.isatty()):
            raise PromptError("no prompt: expected PROMPT, text piped on stdin, or -f FILE")
        raw = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode("utf-8")
        text = decode_utf8(raw, "stdin").rstrip("\n")
        origin = "stdin"
    else:
        text, origin = argument, "PROMPT"
    if not text.strip():
        raise PromptError(f"empty prompt on {origin}: expected some text")
    return [Prompt(0, text)]
