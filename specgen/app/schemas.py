"""A user's JSON Schema closed as a strict object: `additionalProperties: false` on each object
that lists its properties, as llama.cpp's converter reads a schema (and OpenAI's strict mode asks),
so that a small model does not pad its objects with keys nobody asked for. llguidance reads a
schema literally, and there an object that says nothing of other keys is open.

Closing must not change which of the keys the schema names an object admits. In JSON Schema
`additionalProperties` sees only the properties beside it, so a closed branch of a combinator
forbids its siblings' keys (allOf of two closed objects admits only `{}`, or nothing where both
require a key). Hence:
- `allOf` (and a `$ref` with object keywords beside it) is merged into one object first, as
  llama.cpp's converter does, wherever the merge is exact;
- an object is closed on every key it names: its own properties and required keys, and those of
  the branches it combines (allOf left unmerged, anyOf, oneOf, if/then/else, dependentSchemas,
  its `$ref`), and those branches are not closed on their own;
- a branch of anyOf/oneOf with nothing of an object beside it is a standalone alternative
  (Optional[Model], Union[A, B]) and is closed like any value;
- nothing under not/if/contains/propertyNames changes: closing there would change what they test;
- a `$defs` entry is closed only where every reference uses it as a standalone value; one
  referenced as a branch stays open at its top, one referenced under `not`/`if` stays as written.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

STANDALONE, BRANCH, FROZEN = 0, 1, 2  # how a schema is used: a value, a refinement of its siblings, a test
# Keywords about the object at their own level: beside a combinator they make the branches refinements.
OBJECT_WORDS = frozenset({"properties", "required", "patternProperties", "additionalProperties",
                          "unevaluatedProperties", "dependentRequired", "dependentSchemas", "dependencies",
                          "minProperties", "maxProperties", "propertyNames"})
COMBINATORS = ("allOf", "anyOf", "oneOf", "if", "then", "else", "dependentSchemas")
VALUE_WORDS = ("items", "prefixItems", "additionalItems", "additionalProperties", "unevaluatedItems",
               "unevaluatedProperties")  # a schema (or list of them) for values: standalone
TEST_WORDS = ("not", "if", "contains", "propertyNames")
OPENERS = ("additionalProperties", "patternProperties", "unevaluatedProperties")  # the user said which other keys
LITERALS = ("const", "enum", "default", "examples")  # data, never schemas
ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples", "deprecated", "readOnly",
                         "writeOnly"})
DEFS = ("$defs", "definitions")
MAX_DEPTH = 16  # allOf/$ref chains followed while merging


def closed(schema: object) -> object:
    """The schema closed as a strict object (see the module's docstring); never mutates its input."""
    if not isinstance(schema, dict):
        return schema
    names = [(word, name) for word in DEFS if isinstance(schema.get(word), dict) for name in schema[word]]
    body = {k: v for k, v in schema.items() if not (k in DEFS and isinstance(v, dict))}
    modes: dict[tuple, int] = {}
    while True:  # a def's use decides how it is walked, and its walk records its own refs' uses
        walk = _Walk(schema)
        out = walk.schema(body, STANDALONE)
        defs = {key: walk.schema(schema[key[0]][key[1]], modes.get(key, STANDALONE)) for key in names}
        grown = {key: max(modes.get(key, STANDALONE), walk.uses.get(key, STANDALONE)) for key in names}
        if grown == {key: modes.get(key, STANDALONE) for key in names}:
            break
        modes = grown
    for word in DEFS:
        if isinstance(schema.get(word), dict):
            out[word] = {name: defs[(word, name)] for name in schema[word]}
    return out


@dataclass
class _Walk:
    root: dict
    uses: dict[tuple, int] = field(default_factory=dict)  # ("$defs", name) -> the most cautious use
    inlined: frozenset = frozenset()  # refs merged into the nodes above this one

    def schema(self, node: object, mode: int) -> object:
        if mode == FROZEN:
            self._freeze(node)
            return node
        if not isinstance(node, dict):
            return node
        node, refs = _merged(node, self.root, self.inlined)
        compound = any(k in node for k in OBJECT_WORDS) or "$ref" in node or "allOf" in node \
            or ("anyOf" in node and "oneOf" in node)
        choice = BRANCH if mode == BRANCH or compound else STANDALONE
        above, self.inlined = self.inlined, self.inlined | refs
        try:
            out = {k: self._keyword(k, v, choice) for k, v in node.items()}
        finally:
            self.inlined = above
        if "$ref" in node:
            alone = mode == STANDALONE and not any(k in node for k in (*OBJECT_WORDS, *COMBINATORS))
            self._use(node["$ref"], STANDALONE if alone else BRANCH)
        return _close(out, node, self.root) if mode == STANDALONE else out

    def _keyword(self, word: str, value: object, choice: int) -> object:
        if word in ("properties", "patternProperties", *DEFS) and isinstance(value, dict):
            return {k: self.schema(v, STANDALONE) for k, v in value.items()}
        if word in VALUE_WORDS:
            return [self.schema(v, STANDALONE) for v in value] if isinstance(value, list) \
                else self.schema(value, STANDALONE)
        if word in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
            return [self.schema(v, BRANCH if word == "allOf" else choice) for v in value]
        if word in ("then", "else"):
            return self.schema(value, BRANCH)
        if word in ("dependentSchemas", "dependencies") and isinstance(value, dict):
            return {k: self.schema(v, BRANCH) if isinstance(v, dict) else v for k, v in value.items()}
        if word in TEST_WORDS:
            return self.schema(value, FROZEN)
        return value

    def _use(self, ref: object, mode: int) -> None:
        key = _def_key(ref)
        if key is not None:
            self.uses[key] = max(self.uses.get(key, STANDALONE), mode)

    def _freeze(self, node: object) -> None:
        """Every def a test reaches is left as written."""
        if isinstance(node, list):
            for item in node:
                self._freeze(item)
        elif isinstance(node, dict):
            if "$ref" in node:
                self._use(node["$ref"], FROZEN)
            for k, v in node.items():
                if k not in LITERALS:
                    self._freeze(v)


def _close(out: dict, node: dict, root: dict) -> dict:
    """`out` closed on every key `node` and its branches name; as it is where it lists no
    properties, where the user said what other keys may be, or where a branch did."""
    if not isinstance(node.get("properties"), dict) or any(k in node for k in OPENERS):
        return out
    keys = _keys(node, root, frozenset())
    if keys is None:
        return out
    props = dict(out["properties"])
    props.update({k: {} for k in keys if k not in props})  # named by a branch or `required`: any value there
    return {**out, "properties": props, "additionalProperties": False}


def _keys(node: object, root: dict, seen: frozenset) -> list[str] | None:
    """The keys a schema names for its object, in order; None where it admits others itself."""
    if not isinstance(node, dict):
        return []
    if "patternProperties" in node or node.get("additionalProperties", False) is not False \
            or node.get("unevaluatedProperties", False) is not False:
        return None
    keys = [*_dict(node.get("properties")), *(k for k in _list(node.get("required")) if isinstance(k, str))]
    branches = [b for word in ("allOf", "anyOf", "oneOf") for b in _list(node.get(word))]
    branches += [node[word] for word in ("if", "then", "else") if word in node]
    branches += list(_dict(node.get("dependentSchemas")).values())
    for k, v in [*_dict(node.get("dependentRequired")).items(), *_dict(node.get("dependencies")).items()]:
        keys.append(k)
        if isinstance(v, list):  # keys it requires
            keys += [x for x in v if isinstance(x, str)]
        else:  # draft 7's dependent schema
            branches.append(v)
    ref = node.get("$ref")
    if ref is not None and (not isinstance(ref, str) or ref not in seen):
        target = _resolve(root, ref)
        if target is None:
            return None  # a key it names may be out of reach
        branches.append(target)
        seen = seen | {ref}
    for branch in branches:
        more = _keys(branch, root, seen)
        if more is None:
            return None
        keys += more
    return list(dict.fromkeys(keys))


def _merged(node: dict, root: dict, inlined: frozenset) -> tuple[dict, frozenset]:
    """`node` with its allOf (or its `$ref` beside object keywords) merged into one object where
    the merge admits exactly what the parts admit together, and the refs it inlined; else `node`
    as it is. A ref already being inlined above is not inlined again (a recursive def)."""
    rest = {k: v for k, v in node.items() if k != "allOf"}
    wrapped = node.get("allOf")
    # An annotated reference, as older generators write one: a reference, not a merge.
    if isinstance(wrapped, list) and len(wrapped) == 1 and isinstance(wrapped[0], dict) \
            and set(wrapped[0]) == {"$ref"} and all(k in ANNOTATIONS for k in rest):
        return {**rest, "$ref": wrapped[0]["$ref"]}, frozenset()
    if "allOf" not in node and not ("$ref" in node and any(k in node for k in (*OBJECT_WORDS, *COMBINATORS))):
        return node, frozenset()
    refs: list = []
    parts = _parts(node, root, 0, refs)
    merged = _merge(parts) if parts is not None and not inlined.intersection(refs) else None
    return (node, frozenset()) if merged is None else (merged, frozenset(refs))


def _parts(node: object, root: dict, depth: int, refs: list) -> list[dict] | None:
    """The schemas `node` is the intersection of, with allOf and local `$ref`s followed (into
    `refs`); None where one cannot be followed."""
    if node is True:
        return []
    if not isinstance(node, dict) or depth > MAX_DEPTH or not isinstance(node.get("allOf", []), list):
        return None
    rest = {k: v for k, v in node.items() if k not in ("allOf", "$ref")}
    if "$ref" not in node and "allOf" not in node:
        return [rest]
    if "$ref" in node:
        refs.append(node["$ref"] if isinstance(node["$ref"], str) else None)
    # A $ref's keys first (what its siblings extend), then the node's own, then allOf's, as llama.cpp orders them.
    items = ([_resolve(root, node["$ref"])] if "$ref" in node else []) + [rest] + node.get("allOf", [])
    parts: list[dict] = []
    for item in items:
        more = _parts(item, root, depth + 1, refs)
        if more is None:
            return None
        parts += more
    return parts


LOWER, UPPER = ("minimum", "minLength", "minItems", "minProperties"), ("maximum", "maxLength", "maxItems",
                                                                      "maxProperties")


def _merge(parts: list[dict]) -> dict | None:
    """One schema admitting exactly what all `parts` admit; None where this merge cannot say so
    (a part says what other keys may be, or two parts disagree on a keyword it does not combine)."""
    out: dict = {}
    for part in parts:
        if any(k in part for k in (*OPENERS, "$id", "$anchor", "$dynamicRef", "$recursiveRef")):
            return None
        for k, v in part.items():
            if k not in out or out[k] == v or k in ANNOTATIONS:
                out.setdefault(k, v)
            elif k == "properties" and isinstance(v, dict) and isinstance(out[k], dict):
                props = dict(out[k])
                for name, sub in v.items():
                    props[name] = sub if name not in props or props[name] == sub else {"allOf": [props[name], sub]}
                out[k] = props
            elif k == "required" and isinstance(v, list) and isinstance(out[k], list):
                out[k] = out[k] + [r for r in v if r not in out[k]]
            elif k == "type" and (types := _types(out[k], v)):
                out[k] = types
            elif k in LOWER + UPPER and _number(out[k]) and _number(v):
                out[k] = max(out[k], v) if k in LOWER else min(out[k], v)
            else:
                return None
    return out


def _types(a: object, b: object) -> str | list[str] | None:
    """The types both admit ("integer" is a "number"); None where none or unreadable."""
    ta, tb = ([t] if isinstance(t, str) else t for t in (a, b))
    if not isinstance(ta, list) or not isinstance(tb, list):
        return None
    both = [t for t in ta if t in tb or (t == "integer" and "number" in tb)]
    both += [t for t in tb if t == "integer" and "number" in ta and t not in both]
    return (both[0] if len(both) == 1 else both) or None


def _dict(v: object) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v: object) -> list:
    return v if isinstance(v, list) else []


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _resolve(root: dict, ref: object) -> object:
    """The target of a local JSON pointer (`#`, `#/$defs/Name`), or None."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    node: object = root
    for raw in ref[2:].split("/") if ref != "#" else []:
        key = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _def_key(ref: object) -> tuple | None:
    """("$defs", name) for a reference to an entry of the root's $defs (or definitions)."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    path = [urllib.parse.unquote(p).replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")]
    return tuple(path) if len(path) == 2 and path[0] in DEFS else None


def hoisted(schema: object, prefix: str) -> tuple[object, dict]:
    """`schema` without its `$defs` (or `definitions`), and those definitions renamed `prefix__NAME`
    with every `#/$defs/NAME` reference in it rewritten to match: a schema nested under another
    (a tool's parameters under a call's `arguments`) keeps reaching its definitions once they sit at
    the outer root, and two schemas' same-named definitions stay apart."""
    if not isinstance(schema, dict) or not any(isinstance(schema.get(k), dict) for k in DEFS):
        return schema, {}
    defs = {f"{prefix}__{name}": body for k in DEFS if isinstance(schema.get(k), dict)
            for name, body in schema[k].items()}
    body = {k: v for k, v in schema.items() if k not in DEFS}
    return _renamed(body, prefix), {name: _renamed(d, prefix) for name, d in defs.items()}


def _renamed(node: object, prefix: str) -> object:
    if isinstance(node, list):
        return [_renamed(v, prefix) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "$ref" and isinstance(v, str):
            for word in DEFS:
                if v.startswith(f"#/{word}/"):
                    v = f"#/$defs/{prefix}__" + v[len(word) + 3:]
                    break
            out[k] = v
        else:
            out[k] = v if k in LITERALS else _renamed(v, prefix)
    return out
