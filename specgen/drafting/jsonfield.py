"""Where a tool call's text stands: which function, which argument, and the value's text so far.

A character scanner over the output as it is written (and over a step's forced trunk, on a copy).
It reads JSON objects wherever they open at the top level, so one scanner serves both call formats
(app/structured.py): hermes' `<tool_call>\n{"name": ..., "arguments": {...}}` blocks and the generic
`{"tool_call": {"name": ..., "arguments": {...}}}`. A call is the innermost object with a string
"name" whose current key is "arguments". It never judges validity (the grammar does): text that is
not JSON gives no field, or a wrong one, and a wrong field only costs a draft that is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass

NAME, ARGUMENT = "name", "argument"
ITEM = "[]"  # an array's element in a path
_SCALAR_END = ",}] \t\r\n"


@dataclass(frozen=True)
class Field:
    """A value about to be written, or being written, in a call.

    kind: NAME (the function's name) or ARGUMENT; function: the call's name (ARGUMENT);
    path: the keys from the arguments object down to the value (ITEM for an array element);
    prefix: the value's JSON text so far ("" where it has not started; '"Sa' inside a string)."""

    kind: str
    function: str | None
    path: tuple[str, ...]
    prefix: str

    @property
    def key(self) -> str | None:
        """The nearest key above the value (an array element's key is its array's)."""
        return next((k for k in reversed(self.path) if k != ITEM), None)


class _Frame:
    __slots__ = ("array", "key", "expect", "strings")

    def __init__(self, array: bool):
        self.array = array
        self.key: str | None = None
        self.expect = "value" if array else "key"  # key | colon | value | comma
        self.strings: dict[str, str] = {}  # this object's string values by key ("name" is what counts)

    def copy(self) -> "_Frame":
        out = _Frame(self.array)
        out.key, out.expect, out.strings = self.key, self.expect, dict(self.strings)
        return out


class FieldScanner:
    """Feed it text; field() says where the text's end stands. copy() is cheap (a few frames)."""

    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.in_string = False
        self.string_is_key = False
        self.escape = False
        self.in_scalar = False
        self.value = ""  # the current scalar or string value's text so far (string: from its quote)

    def copy(self) -> "FieldScanner":
        out = FieldScanner()
        out.stack = [f.copy() for f in self.stack]
        out.in_string, out.string_is_key, out.escape = self.in_string, self.string_is_key, self.escape
        out.in_scalar, out.value = self.in_scalar, self.value
        return out

    def feed(self, text: str) -> None:
        for ch in text:
            self._char(ch)

    def _char(self, ch: str) -> None:
        if self.in_string:
            self.value += ch
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
                self._end_string()
            return
        if self.in_scalar:
            if ch not in _SCALAR_END:
                self.value += ch
                return
            self.in_scalar = False
            self._end_value()
        if not self.stack:
            if ch == "{":
                self.stack.append(_Frame(False))
            return
        top = self.stack[-1]
        if ch in "{[":
            self.stack.append(_Frame(ch == "["))
        elif ch in "}]":
            self.stack.pop()
            if self.stack:
                self._end_value()
        elif ch == '"':
            self.in_string, self.string_is_key, self.value = True, not top.array and top.expect == "key", '"'
        elif ch == ":":
            top.expect = "value"
        elif ch == ",":
            top.expect = "value" if top.array else "key"
        elif not ch.isspace():
            self.in_scalar, self.value = True, ch

    def _end_string(self) -> None:
        top = self.stack[-1]
        if self.string_is_key:
            top.key, top.expect = self.value[1:-1], "colon"
            return
        if not top.array and top.key is not None:
            top.strings[top.key] = self.value[1:-1]
        self._end_value()

    def _end_value(self) -> None:
        self.stack[-1].expect = "comma"
        self.value = ""

    def field(self) -> Field | None:
        """The value the text's end is in or before, where it belongs to a call; else None."""
        if not self.stack:
            return None
        top = self.stack[-1]
        if self.in_string and not self.string_is_key or self.in_scalar:
            prefix = self.value
        elif not self.in_string and top.expect == "value":
            prefix = ""
        else:
            return None
        for i in range(len(self.stack) - 2, -1, -1):
            frame = self.stack[i]
            if not frame.array and frame.key == "arguments" and "name" in frame.strings:
                path = tuple(ITEM if f.array else (f.key or "") for f in self.stack[i + 1:])
                return Field(ARGUMENT, frame.strings["name"], path, prefix)
        if not top.array and top.key == "name":  # outside any call's arguments: the call's own name
            return Field(NAME, None, (), prefix)
        return None
