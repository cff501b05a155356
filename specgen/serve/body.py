"""A request body as JSON: parsed, its nesting bounded, its every field one its route knows
(fields.ROUTES): an unknown one refused by name on OpenAI's routes, dropped and named on
llama-server's (ecosystem.py). A refusal is a RequestError: an HTTP 4xx with one line saying why."""

from __future__ import annotations

import difflib
import json

from specgen.serve import ecosystem

# Levels of JSON nesting a body may hold: llguidance's JSON reader refuses a schema deeper than 128
# anyway, and every reader after the parse (schemas, templates) then stays far from Python's recursion limit.
MAX_DEPTH = 128


class RequestError(Exception):
    """A request the server refuses: `status` (400, 401, 404, 413, 503...) and one line saying why."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code


class Body(dict):
    """A request body whose fields its route knows (fields.ROUTES). Reading a field the route does not
    declare is specgen's bug (that field, sent, would be refused as unknown), so it raises: every
    request a test sends walks the readers, so an undeclared read fails the tests."""

    def __init__(self, given: dict, known: frozenset[str], ignored: list[str] | None = None):
        super().__init__(given)
        self.known = known
        # llama-server's routes: the keys dropped unread, as llama-server ignores them (ecosystem.py);
        # None on OpenAI's routes, which refuse them.
        self.ignored = ignored
        self.notes: list[str] = []  # what the reader found asked for and not acted on (ecosystem.py)

    def _declared(self, name: str) -> str:
        if name not in self.known:
            raise LookupError(f"the request reader reads {name!r}, which its route's table (fields.ROUTES) "
                              "does not declare")
        return name

    def get(self, name: str, default: object = None) -> object:
        return super().get(self._declared(name), default)

    def __getitem__(self, name: str) -> object:
        return super().__getitem__(self._declared(name))


def body_json(raw: bytes, known: frozenset[str], native: bool = False) -> Body:
    """The body as a JSON object whose every field is one of `known` (its route's, fields.ROUTES):
    another is a 400 naming it, as OpenAI answers; on llama-server's own routes (`native`) it is
    dropped and named in Body.ignored, as llama-server ignores it."""
    deep = RequestError(400, f"expected a JSON body nested at most {MAX_DEPTH} levels deep, found deeper nesting")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"expected a JSON object as the request body, found invalid JSON ({e})") from None
    except RecursionError:
        raise deep from None
    if not isinstance(body, dict):
        raise RequestError(400, f"expected a JSON object as the request body, found {type(body).__name__}")
    if _deeper(body, MAX_DEPTH):
        raise deep
    known = known | ecosystem.known_beside(known)
    unknown = [name for name in body if name not in known]
    if native:
        return Body({k: v for k, v in body.items() if k in known}, known, unknown)
    if unknown:
        raise RequestError(400, _unrecognized(unknown, known), unknown[0], code="unknown_parameter")
    return Body(body, known)


def _deeper(value: object, limit: int) -> bool:
    """Whether `value` nests objects and arrays more than `limit` levels deep (read level by level:
    no recursion)."""
    level, depth = [value], 0
    while level := [v for v in level if isinstance(v, (dict, list))]:
        depth += 1
        if depth > limit:
            return True
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x)]
    return False


def _unrecognized(names: list[str], known: frozenset[str]) -> str:
    """OpenAI's words for a field it does not know, with the likeliest field meant."""
    meant = [(n, difflib.get_close_matches(n, sorted(known), n=1, cutoff=0.75)) for n in names]
    shown = [n if n.isprintable() else json.dumps(n) for n in names]  # a name with a newline stays one line
    hints = [f"{s} (did you mean {close[0]}?)" if close else s for s, (_, close) in zip(shown, meant)]
    many = "s" if len(names) > 1 else ""
    return f"Unrecognized request argument{many} supplied: {', '.join(hints)}"[:300]
