"""The one reader of a tool answer, streamed or whole, as OpenAI and llama-server stream one: content
as text, each call as its head (index, id, name) once it is known to be a call, then its arguments'
JSON text in pieces as the model writes them.

The text is generated under the tools' grammar (structured.tool_constraint), so its layout is
known: the generic format's one object (`{"tool_call": {"name": ..., "arguments": {...}}}` or
`{"response": "..."}`), or hermes' `<tool_call>` blocks (or free text that never opens with
"<"). `CallStream.feed` takes the text as it grows and returns what may be shown of it now;
nothing is shown that a later token could take back. `finish` ends the text (whole, or cut by
max_tokens or a stop string) and `answer` is everything shown: a reply streamed and one read whole
(structured.parse_answer reads through this too) are the same answer.

What a call is, decided here only: a function the request offered (the one tool_choice named), its
arguments begun as an object, the first call unless parallel_tool_calls; a call cut before its end
is the call as written (its arguments not JSON yet). Text not read as content or a call (a call
refused, or cut before its name is whole) is content, as written.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

HERMES, GENERIC = "hermes", "generic"
OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Tools:
    """The request's functions and `tool_choice`: "auto", "required", one function's name, or
    "none" (the generic format's answer to tool_choice none: its `{"response": ...}` alone, ask.py)."""

    functions: tuple[dict, ...]  # {"name", "description", "parameters"}: all of them are rendered
    choice: str = "auto"
    only: str | None = None  # tool_choice named a function
    parallel: bool = True  # parallel_tool_calls: false allows at most one call

    def names(self) -> frozenset[str]:
        """The functions an answer may call."""
        return frozenset(f["name"] for f in self.allowed())

    @property
    def must_call(self) -> bool:
        return self.choice == "required" or self.only is not None

    def allowed(self) -> tuple[dict, ...]:
        """The functions an answer may call (the prompt lists every one of `functions`)."""
        if self.choice == "none":
            return ()
        return tuple(f for f in self.functions if self.only is None or f["name"] == self.only)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it (a cut call's: as far as it was written)

    def openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass(frozen=True)
class ToolAnswer:
    content: str | None
    calls: tuple[ToolCall, ...] = ()


_KEY = re.compile(r'\s*"((?:[^"\\]|\\.)*)"\s*:\s*')
_SPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class CallHead:
    """A call begins: OpenAI's first fragment of it (id, type, the whole name, empty arguments)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """More of a call's arguments, as JSON text."""

    index: int
    text: str


@dataclass(frozen=True)
class Delta:
    """What a step adds to the answer: content text, then call fragments."""

    content: str = ""
    calls: tuple[CallHead | CallArguments, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


def _end_of_value(text: str, start: int) -> int | None:
    """Where the JSON object or array at `start` ends (one past its closing bracket); None while
    it is not whole. Brackets inside strings do not count."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _string_prefix(text: str, start: int) -> tuple[str, int | None]:
    """The JSON string whose opening quote is at `start`, decoded as far as it can be now (never
    half an escape), and one past its closing quote (None while it is not whole)."""
    i, safe = start + 1, start + 1
    while i < len(text):
        c = text[i]
        if c == '"':
            return json.loads(text[start : i + 1]), i + 1
        if c == "\\":
            width = 6 if text[i + 1 : i + 2] == "u" else 2
            if i + width > len(text):
                break
            i += width
        else:
            i += 1
        safe = i
    decoded = json.loads(text[start:safe] + '"')
    if decoded and "\ud800" <= decoded[-1] <= "\udbff":  # half a surrogate pair: wait for the other half
        decoded = decoded[:-1]
    return decoded, None


@dataclass
class _Call:
    """One call object being read: where its name and arguments are in the text."""

    index: int
    start: int  # its "{"
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])
    name: str | None = None
    args_at: int | None = None  # where the arguments' value starts
    text: str = ""  # the arguments' text shown so far
    end: int | None = None  # one past the arguments' value, once whole


class CallStream:
    """Feed it the answer's text as it grows (`feed(whole text so far)`); it returns each step's
    Delta, then `finish(text)` the last one; `answer()` is every Delta joined."""

    def __init__(self, fmt: str, tools: Tools):
        self.fmt, self.names, self.parallel = fmt, tools.names(), tools.parallel
        self.calls: list[_Call] = []  # the calls read, the last perhaps not known to be one yet
        self.heads = 0  # calls whose head was shown
        self.refused = False  # a call was refused: no call is read from there on
        self.branch: str | None = None  # generic: the object's key; hermes: "text" or "calls"
        self.next_block = 0  # hermes: where the next `<tool_call>` may open
        self.content = ""  # the content shown (decoded, for the generic response)

    def answer(self) -> ToolAnswer:
        """What was shown: its content, and each call with its arguments as written."""
        calls = tuple(ToolCall(c.id, c.name, c.text) for c in self.calls[:self.heads])
        return ToolAnswer(self.content or None, calls)

    def feed(self, text: str) -> Delta:
        return self._generic(text) if self.fmt == GENERIC else self._hermes(text)

    def finish(self, text: str) -> Delta:
        """The text has ended, whole or cut: its last Delta. A call whose arguments never began is
        the call as written (none yet); text read as neither content nor a call is content."""
        delta = self.feed(text)
        call = self.calls[-1] if self.calls else None
        head = ()
        if call is not None and not self.refused and self.heads <= call.index and call.name is not None:
            head, self.heads = (CallHead(call.index, call.id, call.name),), call.index + 1
        rest = self._rest(text)
        self.content += rest
        return Delta(delta.content + rest, delta.calls + head)

    def _rest(self, text: str) -> str:
        """Text read as neither content nor a call: all of it where nothing was (generic), what
        follows the last whole call (hermes)."""
        if self.fmt == GENERIC:
            return "" if self.heads or self.branch == "response" else text.strip()
        last = self.calls[-1] if self.calls else None
        if self.branch == "text" or last is not None and self.heads > last.index and self.next_block <= last.start:
            return ""  # free text, shown; or cut inside a call
        return text[self.next_block:].strip()

    def _generic(self, text: str) -> Delta:
        """`{"response": "..."}` streams the string's text; `{"tool_call": {...}}` one call."""
        at = _SPACE.match(text).end()
        key = _KEY.match(text, at + 1) if text[at : at + 1] == "{" else None
        if key is None:
            return Delta()
        value, self.branch = key.end(), key.group(1)
        if value >= len(text):
            return Delta()
        if self.branch == "response" and text[value] != '"':
            self.branch = None  # not the grammar's answer: its text is content at the end
        if self.branch == "response":
            decoded, _ = _string_prefix(text, value)
            out = decoded[len(self.content):]
            self.content += out
            return Delta(content=out)
        if self.branch != "tool_call":
            return Delta()
        if not self.calls:
            self.calls.append(_Call(0, value))
        return Delta(calls=self._read_call(text, self.calls[0]))

    def _hermes(self, text: str) -> Delta:
        """Free text (content, stripped: it never opens with "<") or `<tool_call>` blocks, a line apart."""
        if self.branch is None and text:
            self.branch = "calls" if text.startswith("<") else "text"
        if self.branch == "text":
            out = text.strip()[len(self.content):]
            self.content += out
            return Delta(content=out)
        fragments: list[CallHead | CallArguments] = []
        while not self.refused:
            if not self.calls or self.calls[-1].end is not None and self.next_block > self.calls[-1].start:
                at = _SPACE.match(text, self.next_block).end()
                if not text.startswith(OPEN, at) or (start := _SPACE.match(text, at + len(OPEN)).end()) >= len(text):
                    break
                self.calls.append(_Call(len(self.calls), start))
            call = self.calls[-1]
            fragments += self._read_call(text, call)
            if call.end is None:
                break
            closing = _SPACE.match(text, _end_of_value(text, call.start) or len(text)).end()
            if not text.startswith(CLOSE, closing):
                break  # the closing tag is not whole yet
            self.next_block = closing + len(CLOSE)
        return Delta(calls=tuple(fragments))

    def _read_call(self, text: str, call: _Call) -> tuple[CallHead | CallArguments, ...]:
        """The call object at call.start: its head once it is known to be a call, its arguments as written."""
        out: list[CallHead | CallArguments] = []
        if call.name is None or call.args_at is None:
            self._keys(text, call)
        if self.heads <= call.index:
            if not self._accepts(text, call):
                return ()
            out.append(CallHead(call.index, call.id, call.name))
            self.heads = call.index + 1
        if call.end is None:
            end = _end_of_value(text, call.args_at)
            upto = len(text) if end is None else end
            if upto > call.args_at + len(call.text):
                out.append(CallArguments(call.index, text[call.args_at + len(call.text) : upto]))
                call.text = text[call.args_at : upto]
            call.end = end
        return tuple(out)

    def _accepts(self, text: str, call: _Call) -> bool:
        """Is it a call: its name whole and offered, the first call unless parallel, its arguments
        begun as an object? Once it cannot be, the stream is refused: the rest is content."""
        if call.name is not None and (call.name not in self.names or call.index > 0 and not self.parallel) or \
                call.args_at is not None and text[call.args_at] != "{":
            self.refused = True
        return not self.refused and call.name is not None and call.args_at is not None

    def _keys(self, text: str, call: _Call) -> None:
        """Find the object's "name" (whole) and where its "arguments" start, in the order written."""
        if text[call.start : call.start + 1] != "{":
            return
        pos = call.start + 1
        while (key := _KEY.match(text, pos)) is not None and key.end() < len(text):
            value = key.end()
            if key.group(1) == "name" and text[value] == '"':
                name, pos = _string_prefix(text, value)
                if pos is None:
                    return
                call.name = name
            elif key.group(1) in ("arguments", "parameters"):
                call.args_at = value
                if call.name is not None or (pos := _end_of_value(text, value)) is None:
                    return
            else:
                return
            comma = _SPACE.match(text, pos).end()
            if text[comma : comma + 1] != ",":
                return
            pos = comma + 1
