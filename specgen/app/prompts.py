"""Prompt input: an argument, stdin, a .txt file (one prompt per line) or a .jsonl file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, TextIO

from specgen.errors import PromptError


ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Message:
    role: str  # system | user | assistant
    content: str


@dataclass(frozen=True)
class Prompt:
    index: int
    text: str  # the user message the model answers
    history: tuple[Message, ...] = ()  # earlier turns of a conversation, oldest first

    def messages(self, system: str | None = None) -> list[dict[str, str]]:
        """The conversation as chat-template messages; `system` applies unless the history has one."""
        turns = [{"role": m.role, "content": m.content} for m in self.history]
        if system and not (turns and turns[0]["role"] == "system"):
            turns.insert(0, {"role": "system", "content": system})
        return turns + [{"role": "user", "content": self.text}]

    def followed_by(self, answer: str, question: str) -> "Prompt":
        """The next turn: this prompt, the model's answer, then a new question."""
        return Prompt(self.index, question, self.history + (Message("user", self.text), Message("assistant", answer)))


def decode_utf8(data: bytes, origin: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise PromptError(f"{origin}: expected UTF-8 text, found byte 0x{data[e.start]:02x} on line {line}") from None


def _conversation(messages: object, where: str) -> tuple[str, tuple[Message, ...]]:
    """{"messages": [{"role": ..., "content": ...}, ...]} ending in a user message."""
    if not isinstance(messages, list) or not messages:
        raise PromptError(f"{where}: \"messages\" must be a non-empty list, found {json.dumps(messages)[:60]}")
    parsed = []
    for i, m in enumerate(messages, 1):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise PromptError(f"{where}: message {i} must be {{\"role\": system|user|assistant, "
                              f"\"content\": text}}, found {json.dumps(m)[:60]}")
        parsed.append(Message(m["role"], m["content"]))
    if parsed[-1].role != "user":
        raise PromptError(f"{where}: the last message must be from the user (it is what the model answers), "
                          f"found role {parsed[-1].role!r}")
    return parsed[-1].content, tuple(parsed[:-1])


def _jsonl_prompt(record: object, origin: str, lineno: int) -> tuple[str, tuple[Message, ...]]:
    where = f"{origin} line {lineno}"
    if isinstance(record, dict):
        if isinstance(record.get("prompt"), str):
            return record["prompt"], ()
        if "messages" in record:
            return _conversation(record["messages"], where)
        turns = record.get("turns")
        if isinstance(turns, list) and turns and isinstance(turns[0], str):
            return turns[0], ()  # Spec-Bench record: the first turn is the prompt
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
    texts: list[tuple[str, tuple[Message, ...]]] = []
    if path.suffix.lower() == ".jsonl":
        for lineno, record in jsonl_records(text, str(path)):
            texts.append(_jsonl_prompt(record, str(path), lineno))
    else:
        texts = [(line, ()) for line in text.splitlines() if line.strip()]
    prompts = [Prompt(i, t, h) for i, (t, h) in enumerate(texts)]
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
