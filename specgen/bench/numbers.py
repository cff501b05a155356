"""Figures in prose: where they are, how they are written, and the same value written the same way.

A figure is a number as prose writes it: a sign (+3%, −0.4), thousands separators (1,553), decimals
(0.971), a unit (1.47x, 78%), a range (1.47-2.25x, 2.06x-2.09x, 0.56–0.61x) or a fraction (1,553/1,600). Each of
its numbers is a part; format_like() writes values with the parts' decimals, separators, sign and
unit, so a bound value is compared with the prose exactly, as text.

What is not a figure (exempt, by rule, wherever it stands; see mask()):
- code: fenced blocks and inline `code` (commands, options, file names);
- HTML comments (the bindings themselves) and link targets `](...)`;
- blocks rendered from files, between `<!-- NAME-table: FILES -->` and `<!-- NAME-table:end -->`
  (bench-table blocks are compared with what their files render; the scripts' tables by the tests);
- dates and times (2026-11-27, 18:29), versions (0.3.36), numbers that are part of a name
  (gemma-3-270m, Q4_K_M, smollm2, 8B, H100, a 2-core machine), settings written NAME=VALUE (T=0.7), the level of an
  interval (90% interval), issue references (issue 67) and ordered-list markers ("1. " at a line's start);
- everything under a heading that says History (and its subsections): dated, not re-measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
FIGURE = re.compile(
    rf"(?:(?<![^\s(\[])[+\-−](?=\d)|(?<![\w.,/=#@:$&+\-−])){_NUM}(?:[x×%]?(?:-|–){_NUM}|/{_NUM})?[x×%]?"
    r"(?![\w.,:/\-–]\d|\w|-[A-Za-z])")
_PART = re.compile(_NUM)
_FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$", re.S | re.M)
_TABLE = re.compile(r"^<!-- ([\w-]*table): .*?^<!-- \1:end -->", re.S | re.M)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"\]\([^)\s]*\)")
_WORDS = re.compile(r"\b\d{4}-\d\d-\d\d(?:T[\d:.+]+)?\b|\b\d\d?:\d\d(?::\d\d)?\b|\b\d+% (?:confidence )?intervals?\b"
                    r"|\bissues? \d+(?:(?:, | and )\d+)*\b|^[ \t]*\d+\. ", re.M)
_HEADING = re.compile(r"^(#{1,6}) .*$", re.M)


def blank(text: str, pattern: re.Pattern) -> str:
    """`text` with each match of `pattern` turned to spaces (same length, same lines)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def history_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each section whose heading says History, to the next heading as high."""
    spans, heads = [], list(_HEADING.finditer(text))
    for i, h in enumerate(heads):
        if "history" not in h.group(0).lower():
            continue
        level = len(h.group(1))
        end = next((g.start() for g in heads[i + 1:] if len(g.group(1)) <= level), len(text))
        if not spans or h.start() >= spans[-1][1]:
            spans.append((h.start(), end))
    return spans


def mask(text: str) -> str:
    """`text` with everything exempt blanked (see the module's note), History sections included."""
    text = blank(text, _FENCE)
    text = blank(text, _TABLE)
    text = blank(text, _COMMENT)
    text = blank(text, _CODE)
    text = blank(text, _LINK)
    text = blank(text, _WORDS)
    for start, end in history_spans(text):
        text = text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]
    return text


def find(text: str) -> list[re.Match]:
    """The figures of an already masked text, in order."""
    return list(FIGURE.finditer(text))


@dataclass(frozen=True)
class Shape:
    """How a figure is written: its sign, its parts (numbers as written), what joins them, its unit."""
    sign: str
    parts: tuple[str, ...]
    joins: tuple[str, ...]
    unit: str

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(float(p.replace(",", "")) for p in self.parts)


def shape(figure: str) -> Shape:
    sign = figure[0] if figure[0] in "+-−" else ""
    body = figure[len(sign):]
    unit = body[-1] if body[-1] in "x×%" else ""
    body = body[:len(body) - len(unit)]
    parts = _PART.findall(body)
    joins, at = [], 0
    for p in parts:
        i = body.index(p, at)
        if at:
            joins.append(body[at:i])
        at = i + len(p)
    return Shape(sign, tuple(parts), tuple(joins), unit)


def _part(value: float, like: str) -> str:
    decimals = len(like.split(".")[1]) if "." in like else 0
    comma = "," if "," in like else ""
    return f"{value:{comma}.{decimals}f}"


def format_like(figure: str, values: list[float]) -> str:
    """`values` written as `figure` is written (one value per part)."""
    s = shape(figure)
    if len(values) != len(s.parts):
        raise ValueError(f"{figure} has {len(s.parts)} number(s), the binding gives {len(values)}")
    texts = [_part(v, p) for v, p in zip(values, s.parts)]
    first = texts[0]
    if s.sign == "+" and not first.startswith("-"):
        first = "+" + first
    elif s.sign in "-−" and s.sign and first.startswith("-"):
        first = s.sign + first[1:]
    elif s.sign in "-−" and s.sign:
        first = "+" + first  # the prose says negative, the value is not: shown so, it cannot match
    texts[0] = first
    out = texts[0] + "".join(j + t for j, t in zip(s.joins, texts[1:]))
    return out + s.unit


def mutated(figure: str) -> str:
    """`figure` with its last digit one higher (9 becomes 0): a figure that must no longer check."""
    i = max(i for i, c in enumerate(figure) if c.isdigit())
    return figure[:i] + str((int(figure[i]) + 1) % 10) + figure[i + 1:]
