"""Call-aware drafting: at a free field of a tool call, the values the conversation suggests.

Agent loops repeat argument values: the same cities, attendees, paths and customers come back in
later calls, and most first appear in the user's words or a tool's result. Where the grammar has
forced a call's trunk up to a free field (`{"name": "get_weather", "arguments": {"city":`),
this source proposes, best first:
  1. the values earlier calls of the same function gave the same argument (newest first);
  2. values any earlier call gave an argument of that key;
  3. values a tool's JSON result gave that key (or a key ending in it: `customer_id` <- `id`);
  4. from the conversation's user and tool messages: once the value has begun, what followed the
     same text there (up to a phrase's end); before it has, the entity-like spans of the latest
     messages (quoted text, e-mails, paths, dates, codes, numbers, capitalised names) not yet used
     in this answer.
Each value is tokenized with the text the grammar forces after it (the next key), checked against
the grammar, and placed below the forced trunk (forced.py): one verification covers the trunk,
the value and the next key; a value an earlier call of the function gave runs on into the next
fields' such values. How a value was found is its tier (SAME: 1; KEY: 2-3; TEXT: 4): a tier is
drafted while its values are taken often enough to pay for their rows (CallRecord), a second
branch only for an earlier call's value. Only proposals: verification decides what is committed.
"""

from __future__ import annotations

import codecs
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Callable

from specgen.core.constraint import Constraint
from specgen.drafting.jsonfield import ITEM, NAME, Field, FieldScanner

CALL = "call"  # the choice named in stats for a step whose tree holds this source's values
BRANCHES = 2  # values side by side at one field (a second only where earlier calls of the function differ)
TRIES = 4  # candidates checked against the grammar per step, at most (each walk is ~10 us a token)
TOKENIZED = 4096  # value texts whose tokens a runner keeps
FIELDS = 3  # fields one chain may run through (the best value of each next free field)
_SPAN_END = re.compile(r"[\"\n?!;,)\]]|[.:](?=\s|$)")
_ENTITIES = re.compile(
    r"'([^'\n]{1,60})'|\"([^\"\n]{1,60})\"|“([^”\n]{1,60})”"  # quoted
    r"|([\w.+-]+@[\w-]+(?:\.[\w-]+)+)"  # e-mail
    r"|((?:https?://|~/|\.{0,2}/)[\w./%?=&#~-]*[\w/])"  # URL or path
    r"|(\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?)"  # date
    r"|((?<![\w.])-?\d+(?:\.\d+)?(?!\w|\.\d))"  # number
    r"|(\b[\w-]*\d[\w-]*\b|\b[A-Z]{2,}\b)"  # code
    r"|((?<![.?!]\s)(?<!^)\b[A-Z][\w-]+(?: (?:[A-Z][\w-]+|de|of|la|van|von|the))*(?: [A-Z][\w-]+)?)"  # name
)


@dataclass(frozen=True)
class CallHistory:
    """What a request's conversation holds before its answer: earlier calls, oldest first, as
    (function name, arguments object); and the user's and tools' messages, oldest first."""

    calls: tuple[tuple[str, dict], ...] = ()
    texts: tuple[str, ...] = ()
    tool_results: tuple[str, ...] = field(default=())  # tool messages (also in texts): read as JSON where they are

    @functools.cached_property
    def _results(self) -> tuple[object, ...]:
        return tuple(r for r in map(_parsed, reversed(self.tool_results)) if r is not None)

    @functools.cached_property
    def _entities(self) -> tuple[object, ...]:
        return tuple(v for text in reversed(self.texts) for v in _leaves_or_entities(text))

    def results(self) -> tuple[object, ...]:
        """The tool results that are JSON, parsed, newest first."""
        return self._results

    def entities(self) -> tuple[object, ...]:
        """Every message's entities (a JSON message's values), newest message first."""
        return self._entities


def values_at(obj: object, path: tuple[str, ...]) -> list[object]:
    """The values at `path` in `obj` (ITEM: each element of an array)."""
    if not path:
        return [obj]
    head, rest = path[0], path[1:]
    if head == ITEM:
        return [v for item in obj for v in values_at(item, rest)] if isinstance(obj, list) else []
    return values_at(obj[head], rest) if isinstance(obj, dict) and head in obj else []


def values_by_key(obj: object, key: str, loose: bool = False) -> list[object]:
    """Every value under `key` anywhere in `obj` (array elements for an array's key); `loose`:
    keys that end in `_key`, or that `key` ends in (`id` for `customer_id`), count too."""
    out: list[object] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key or loose and (k.endswith("_" + key) or key.endswith("_" + k)):
                out.extend(v if isinstance(v, list) else [v])
            out.extend(values_by_key(v, key, loose))
    elif isinstance(obj, list):
        for v in obj:
            out.extend(values_by_key(v, key, loose))
    return out


def _json_text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)  # the compact layout's separators (constraint.py)


def _parsed(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def spans_after(texts: tuple[str, ...], begun: str) -> list[str]:
    """What followed `begun` in the texts (newest first), each up to a phrase's end."""
    out = []
    for text in reversed(texts):
        start = text.find(begun)
        while start >= 0:
            rest = text[start + len(begun):]
            end = _SPAN_END.search(rest)
            out.append(begun + (rest[:end.start()] if end else rest))
            start = text.find(begun, start + 1)
    return out


def entities(text: str) -> list[object]:
    """The entity-like spans of a message, in order: strings, and numbers as numbers."""
    out: list[object] = []
    for m in _ENTITIES.finditer(text):
        span = next(g for g in m.groups() if g is not None)
        if m.group(7) is not None:
            out.append(float(span) if "." in span else int(span))
        out.append(span)
    return out


def _leaves_or_entities(text: str) -> list[object]:
    """A JSON message's scalar values (its keys are no values), else the text's entities."""
    parsed = _parsed(text)
    if not isinstance(parsed, (dict, list)):
        return entities(text)
    out: list[object] = []
    stack = [parsed]
    while stack:
        v = stack.pop(0)
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, (str, int, float)) and not isinstance(v, bool):
            out.append(v)
    return out


@dataclass(frozen=True)
class Candidate:
    """A value's JSON text, and how it was found: SAME (an earlier call of the same function gave
    the same argument; or a function's name), KEY (the key elsewhere), TEXT (the conversation's words)."""

    text: str
    tier: int


SAME, KEY, TEXT = range(3)


def candidates(history: CallHistory, where: Field, answer: str) -> list[Candidate]:
    """The values the field at `where` may take, best first, each starting with its prefix and
    longer than it. `answer`: the text written so far (spans it already holds come last)."""
    if where.kind == NAME:
        found = [Candidate(_json_text(name), SAME) for name, _ in reversed(history.calls)]
    else:
        key = where.key
        found = [Candidate(_json_text(v), SAME) for name, args in reversed(history.calls) if name == where.function
                 for v in values_at(args, where.path)]
        if key is not None:
            found += [Candidate(_json_text(v), KEY) for _, args in reversed(history.calls)
                      for v in values_by_key(args, key)]
            found += [Candidate(_json_text(v), KEY) for r in history.results()
                      for v in values_by_key(r, key, loose=True)]
        found += [Candidate(t, TEXT) for t in _from_texts(history, where.prefix, answer)]
    out, seen = [], set()
    for c in found:
        if c.text not in seen and len(c.text) > len(where.prefix) and c.text.startswith(where.prefix):
            seen.add(c.text)
            out.append(c)
    return out


def _from_texts(history: CallHistory, prefix: str, answer: str) -> list[str]:
    """Once a string has begun: the conversation's entities that begin so, then what followed the
    same words; before: the latest two messages' entities, those this answer holds last."""
    if prefix.startswith('"') and len(prefix) > 1:
        begun = _parsed(prefix + '"')
        if not isinstance(begun, str):
            return []
        spans = [v for v in history.entities() if isinstance(v, str) and v.startswith(begun)]
        return [_json_text(v) for v in spans + spans_after(history.texts, begun)]
    if prefix not in ("", '"'):
        return []
    spans = [v for text in reversed(history.texts[-2:]) for v in _leaves_or_entities(text)]
    return sorted((_json_text(v) for v in spans), key=lambda t: t in answer)  # stable: order kept


class CallRecord:
    """How often each tier's values were taken (their first token accepted), across a runner's
    answers, and whether a chain of k tokens of a tier pays: its first token's acceptance at least
    what each drafted token costs, as a share of a plain step, on the target's cost curve `cost`
    (c(B) seconds; None: always drafted). Priors: an earlier call's value is likely, words less."""

    PRIOR = {SAME: 0.75, KEY: 0.5, TEXT: 0.5}
    WEIGHT = 2.0  # the prior counts as this many observations

    def __init__(self, cost: Callable[[int], float] | None = None):
        self.cost = cost
        self.tried = {t: 0 for t in self.PRIOR}
        self.tokenized: dict[str, list[int]] = {}  # value texts as the target's tokens (CallSource._tokens)
        self.taken = {t: 0 for t in self.PRIOR}

    def rate(self, tier: int) -> float:
        return (self.taken[tier] + self.WEIGHT * self.PRIOR[tier]) / (self.tried[tier] + self.WEIGHT)

    def pays(self, tier: int, k: int) -> bool:
        if self.cost is None or k <= 0:
            return k > 0
        c1 = self.cost(1)
        return self.rate(tier) * k * c1 >= self.cost(1 + k) - c1

    def observe(self, tier: int, taken: bool) -> None:
        self.tried[tier] += 1
        self.taken[tier] += taken


class CallSource:
    """This source for one constrained answer: follows the committed text, and proposes chains of
    tokens that continue a step's forced trunk (`tokenize`, `piece`: the target's); `record`
    (shared by a runner's answers) learns which tiers pay."""

    def __init__(self, history: CallHistory, tokenize: Callable[[str], list[int]], piece: Callable[[int], bytes],
                 record: CallRecord | None = None):
        self.history, self.tokenize, self.piece = history, tokenize, piece
        self.record = record if record is not None else CallRecord()
        self.scanner = FieldScanner()
        self.answer = ""
        self.tiers: list[int] = []  # of the last chains() answer, per chain
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def learn(self, taken: list[bool]) -> None:
        """Whether each chain of the last proposal had its first token accepted (None: not placed)."""
        for tier, ok in zip(self.tiers, taken):
            self.record.observe(tier, ok)

    def observe(self, committed: list[int]) -> None:
        text = self._utf8.decode(b"".join(self.piece(t) for t in committed))
        self.scanner.feed(text)
        self.answer += text

    def _text(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def chains(self, constraint: Constraint, forced: list[int], room: int) -> list[list[int]]:
        """Up to BRANCHES chains of at most `room` tokens that follow `forced` (the step's trunk,
        whole), best first; [] where the trunk does not end at a call's field or nothing fits."""
        self.tiers = []
        if room <= 0:
            return []
        scanner = self.scanner.copy()
        scanner.feed(self._text(forced))
        where = scanner.field()
        if where is None:
            return []
        for t in forced:
            constraint.consume(t)
        try:
            out: list[list[int]] = []
            first = None
            for c in candidates(self.history, where, self.answer)[:TRIES]:
                if out and c.tier != SAME:  # beside a likelier value, a weaker one rarely pays for its rows
                    break
                rest = c.text[len(where.prefix):]
                if not self.record.pays(c.tier, min(room, 1 + len(rest) // 4)):  # before any walk (~4 chars a token)
                    continue
                chain = self._value(constraint, rest, where.prefix == "")[:room]
                if chain and chain not in out:
                    out.append(chain)
                    self.tiers.append(c.tier)
                    first = first or c
                    if len(out) == BRANCHES:
                        break
            if first is not None and first.tier == SAME:
                out[0] = self._onwards(constraint, scanner, out[0], room)
            return out
        finally:
            constraint.rollback(len(forced))

    def _value(self, constraint: Constraint, rest: str, may_space: bool) -> list[int]:
        """`rest` of a value as tokens the grammar allows (a space before it where the layout wants
        one), with what the grammar forces after it, tokenized together (`",` is one token)."""
        best: list[int] = []
        for text in (rest, " " + rest) if may_space else (rest,):
            tokens = self._tokens(text)
            n = constraint.valid_prefix(tokens)
            if n == len(tokens):
                for t in tokens:
                    constraint.consume(t)
                after = constraint.forced()
                constraint.rollback(len(tokens))
                if after:
                    joined = self._tokens(text + self._text(after))
                    m = constraint.valid_prefix(joined)
                    tokens = joined[:m] if m > n else tokens + after
                return tokens
            if n > len(best):
                best = tokens[:n]
            if n:  # the layout took this spacing
                break
        return best

    def _tokens(self, text: str) -> list[int]:
        """The target's tokens for `text`, each text tokenized once per runner (llama.cpp's
        tokenizer takes most of a millisecond a call: the same values come back every turn)."""
        known = self.record.tokenized
        tokens = known.get(text)
        if tokens is None:
            if len(known) >= TOKENIZED:
                known.clear()
            tokens = known[text] = self.tokenize(text)
        return tokens

    def _onwards(self, constraint: Constraint, scanner: FieldScanner, chain: list[int], room: int) -> list[int]:
        """`chain` run on through the next free fields while an earlier call of the function gave
        each its value (the conversation's words alone are too weak to run on)."""
        scanner = scanner.copy()
        consumed = 0
        try:
            for _ in range(FIELDS - 1):
                if len(chain) >= room:
                    break
                for t in chain[consumed:]:
                    constraint.consume(t)
                scanner.feed(self._text(chain[consumed:]))
                consumed = len(chain)
                where = scanner.field()
                found = candidates(self.history, where, self.answer + self._text(chain)) if where else []
                if not found or found[0].tier != SAME:
                    break
                more = self._value(constraint, found[0].text[len(where.prefix):], where.prefix == "")
                if not more:
                    break
                chain = chain + more[:room - len(chain)]
            return chain
        finally:
            constraint.rollback(consumed)
