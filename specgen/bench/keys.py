"""Named values in results files: the key paths and small expressions prose bindings use.

A key path names one value of a JSON file, from its top:

    summary[method=auto,group=overall].speedup     the one summary row with those fields; its speedup
    drafts[name="gemma-3-270m-q2_k"].agreed        a quoted value (spaces, commas, brackets inside)
    summary.4.wall_s   rows[0].name   records[*].n_tokens   summary[row=auto,turn=null]

`[k=v,...]` keeps the elements whose fields equal those values (null, true, numbers, or text),
`[k!=v]` those whose field k is there and differs;
`[*]` keeps all; `[N]` is the Nth (from 0); `["key"]` a key that is not a plain name. Where one
value is needed, a path must name exactly one: a selection matching none or several is an error,
never a guess. A binding may combine paths: + - * / and parentheses, numbers, and sum, min, max,
mean, len (of a selection), abs, round. With several files, each path starts with its file's
name from the marker: `a:summary[...]`. A JSON-lines file (a suite) reads as {"records": its
lines}. An agent bench file also has `computed.records`, per request
what no field stores (see _computed): `sum(computed.records[row=plain,first=false].new)`; an op
profile (scripts/op_profile.py) `computed.profile`, its table's cells (see _profile):
`computed.profile[model=M,setting=specgen,op="decode, no callback"].ms.8`. An XML file (a junit report) reads as its elements (see
_xml): `testsuite[0].testcase[name="t"].properties.B2.max_rel_err`. Any other file that is not
JSON reads as {"lines": its lines, each split at white space, "names": its named numbers}:
`log:lines[3][2]` is the third word of the fourth line; `k:names.FEW_COLUMNS` a source file's
constant (`NAME = 128` in Python or shell, `A, B = 16, 256` in Python, `constexpr ... NAME = 128;` or `#define NAME 128` in
C/C++), for prose that quotes what the code fixes (a name given two values is left out, so a path
to it fails).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from xml.etree import ElementTree

from specgen.errors import ConfigError

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?![\w.\[])|(?P<func>sum|min|max|mean|len|abs|round)(?=\s*\()"
                    r"|(?P<path>(?:\w+:)?[A-Za-z_]\w*(?:\.\w+|\[(?:\"[^\"]*\"|[^\]])*\])*)|(?P<op>[-+*/(),]))")
_STEP = re.compile(r"\.(?P<key>\w+)|\[(?P<sel>(?:\"[^\"]*\"|[^\]])*)\]")
_COND = re.compile(r"\s*(?P<key>\w+)\s*(?P<op>!?=)\s*(?P<value>\"[^\"]*\"|[^,\"]*?)\s*(?:,|$)")
_FUNCS = {"sum": sum, "min": min, "max": max, "mean": statistics.fmean, "len": len, "abs": abs, "round": round}


class Many(list):
    """Several values a selection kept (navigation goes on in each)."""


def read(path: Path) -> object:
    """A file's data: JSON as parsed, any other text as {"lines": [[words...], ...]}."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return _computed(json.loads(text))
    except ValueError:
        pass
    rows = [line for line in text.splitlines() if line.strip()]
    if rows and all(r.lstrip().startswith("{") for r in rows):  # JSON lines (a suite): {"records": [...]}
        try:
            return {"records": [json.loads(r) for r in rows]}
        except ValueError:
            pass
    if text.lstrip().startswith("<?xml"):
        try:
            return _xml(ElementTree.fromstring(text.encode("utf-8")))
        except ElementTree.ParseError as e:
            raise ConfigError(f"cannot read {path}: {e}") from None
    return {"lines": [line.split() for line in text.splitlines()], "names": _names(text)}


_NAMED = re.compile(r"^[ \t]*(?:(?:static[ \t]+)?(?:constexpr|const)[ \t]+[\w:]+[ \t]+(?P<c>[A-Z][A-Z0-9_]*)[ \t]*=[ \t]*"
                    r"(?P<cv>-?\d[\d_]*(?:\.\d+)?)[ \t]*;|(?P<p>[A-Z][A-Z0-9_]*)[ \t]*=[ \t]*(?P<pv>-?\d[\d_]*(?:\.\d+)?)"
                    r"[ \t]*(?:#.*)?$|#define[ \t]+(?P<d>[A-Z][A-Z0-9_]*)[ \t]+(?P<dv>-?\d+(?:\.\d+)?)[ \t]*$)", re.M)


_NUMBER = r"-?\d[\d_]*(?:\.\d+)?"
_TUPLE = re.compile(rf"^(?P<names>[A-Z][A-Z0-9_]*(?:[ \t]*,[ \t]*[A-Z][A-Z0-9_]*)+)[ \t]*=[ \t]*"
                    rf"(?P<values>{_NUMBER}(?:[ \t]*,[ \t]*{_NUMBER})+)[ \t]*(?:#.*)?$", re.M)


def _profile(data):
    """An op-profile file (scripts/op_profile.py) gains `computed.profile`: one row per model, setting
    and category of its rendered table, {model, setting, op, ms: {B: ms}}, each ms the median over
    rounds net of the per-node overhead (specgen.llama.profile.net), and op "decode, no callback" the
    plain decode's median: the table's cells unrounded, e.g.
    `computed.profile[model=gemma-3-270m-q4_k_m,setting=specgen,op=attention].ms.8`."""
    from specgen.llama.profile import net

    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    sizes = [str(b) for b in data["settings"]["sizes"]]
    rows = []
    for model in dict.fromkeys(r["model"] for r in data["runs"]):
        for setting in dict.fromkeys(r["setting"] for r in data["runs"]):
            mine = [r for r in data["runs"] if r["model"] == model and r["setting"] == setting]
            if not mine:
                continue
            nets = [{b: net(r["sizes"][b]) for b in sizes} for r in mine]
            for op in dict.fromkeys(k for n in nets for b in sizes for k in n[b]):
                rows.append({"model": model, "setting": setting, "op": op,
                             "ms": {b: median([n[b].get(op, 0.0) for n in nets]) for b in sizes}})
            rows.append({"model": model, "setting": setting, "op": "decode, no callback",
                         "ms": {b: median([r["sizes"][b]["plain_ms"] for r in mine]) for b in sizes}})
    return {**data, "computed": {"profile": rows}}


def _computed(data):
    """An agent bench file gains `computed.records`: per request, what its stored fields give and no
    field stores (agent_summary.new_tokens, the figures its rendered line of prompt tokens sums):
    row, prompt_id, turn, kind, finish_reason as stored; `first` (the conversation's first request
    of its row), `read` (prompt_n), `new` (tokens new to it), `extra` (read less new), `after` and
    `after_finish` (the kind and finish_reason of the row's previous request of the conversation,
    null for the first)."""
    runs = data.get("runs") if isinstance(data, dict) else None
    if isinstance(runs, list) and runs and isinstance(runs[0], dict) and {"model", "setting", "sizes"} <= set(runs[0]) \
            and isinstance(data.get("settings"), dict) and "sizes" in data["settings"]:
        return _profile(data)
    records = data.get("records") if isinstance(data, dict) else None
    if not (isinstance(data.get("settings") if isinstance(data, dict) else None, dict)
            and data["settings"].get("suite") == "agent" and records and "prompt_n" in records[0]):
        return data
    from specgen.bench.agent_summary import new_tokens

    out, last = [], {}
    for r, n in zip(records, new_tokens(records)):
        before = last.get((r["row"], r["prompt_id"]))
        out.append({"row": r["row"], "prompt_id": r["prompt_id"], "turn": r["turn"], "kind": r["kind"],
                    "finish_reason": r.get("finish_reason"), "first": before is None, "read": r["prompt_n"],
                    "new": n, "extra": r["prompt_n"] - n, "after": before and before["kind"],
                    "after_finish": before and before.get("finish_reason")})
        last[(r["row"], r["prompt_id"])] = r
    return {**data, "computed": {"records": out}}


def _number(text: str):
    try:
        return int(text) if re.fullmatch(r"-?\d+", text) else float(text)
    except ValueError:
        return text


def _xml(element) -> dict:
    """An XML element (a junit report) as a dict: its attributes (numbers as numbers), each child tag
    as a list of them; a <properties> element as {name: value}, a value of `k=v` words as {k: v}."""
    out = {k: _number(v) for k, v in element.attrib.items()}
    for child in element:
        if child.tag == "properties":
            props = {}
            for p in child:
                words = p.get("value", "").split()
                pairs = [w.split("=", 1) for w in words]
                props[p.get("name")] = ({k: _number(v) for k, v in pairs} if words and all(len(x) == 2 for x in pairs)
                                        else _number(p.get("value", "")))
            out["properties"] = props
        else:
            out.setdefault(child.tag, []).append(_xml(child))
    return out


def _names(text: str) -> dict[str, float]:
    """A source file's constants, NAME -> number (a name given two values is left out)."""
    found: dict[str, set] = {}
    for m in _NAMED.finditer(text):
        name = m.group("c") or m.group("p") or m.group("d")
        value = (m.group("cv") or m.group("pv") or m.group("dv")).replace("_", "")
        found.setdefault(name, set()).add(float(value) if "." in value else int(value))
    for m in _TUPLE.finditer(text):  # Python's `A, B = 16, 256`: each name its value, in order
        names, values = re.split(r"[ \t]*,[ \t]*", m.group("names")), re.split(r"[ \t]*,[ \t]*", m.group("values"))
        if len(names) == len(values):
            for name, value in zip(names, values):
                value = value.replace("_", "")
                found.setdefault(name, set()).add(float(value) if "." in value else int(value))
    return {name: values.pop() for name, values in found.items() if len(values) == 1}


def _literal(text: str):
    text = text.strip()
    if text.startswith('"'):
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        return text


def _step(node, m: re.Match, where: str):
    if isinstance(node, Many):
        out = Many()
        for n in node:  # an element without the key adds nothing (a count absent where it is 0)
            if m.group("key") is not None and isinstance(n, dict) and m.group("key") not in n:
                continue
            got = _step(n, m, where)
            out += got if isinstance(got, Many) else [got]
        return out
    key, sel = m.group("key"), m.group("sel")
    if key is not None or (sel is not None and sel.startswith('"') and sel.endswith('"') and "=" not in sel):
        name = key if key is not None else sel[1:-1]
        if isinstance(node, dict) and name in node:
            return node[name]
        if isinstance(node, list) and name.isdigit() and int(name) < len(node):
            return node[int(name)]
        raise ConfigError(f"{where}: no key {name!r} there")
    sel = sel.strip()
    if not isinstance(node, list):
        raise ConfigError(f"{where}: [{sel}] selects from a list, found {type(node).__name__}")
    if sel == "*":
        return Many(node)
    if re.fullmatch(r"-?\d+", sel):
        if not -len(node) <= int(sel) < len(node):
            raise ConfigError(f"{where}: [{sel}] is past the list's {len(node)} elements")
        return node[int(sel)]
    conds = [(c.group("key"), c.group("op"), _literal(c.group("value"))) for c in _COND.finditer(sel)]
    if not conds:
        raise ConfigError(f"{where}: cannot read the selection [{sel}]")
    return Many(e for e in node if isinstance(e, dict) and all(
        (k in e and e[k] == v) if op == "=" else (k in e and e[k] != v) for k, op, v in conds))


def lookup(data, path: str, where: str = ""):
    """The value (or Many values) `path` names in `data`."""
    where = where or path
    first = re.match(r"\w+", path)
    node = _step(data, re.match(r"\.(?P<key>\w+)|(?P<sel>)", "." + first.group(0)), where)
    at = first.end()
    for m in _STEP.finditer(path, at):
        if m.start() != at:
            break
        node, at = _step(node, m, where), m.end()
    if at != len(path):
        raise ConfigError(f"{where}: cannot read the path from {path[at:]!r}")
    return node


def one(value, where: str):
    """A single number from what a path named."""
    if isinstance(value, Many):
        if len(value) != 1:
            raise ConfigError(f"{where} names {len(value)} values, not one: narrow its selection")
        value = value[0]
    if isinstance(value, str):
        try:
            return float(value.replace(",", "").rstrip("x%"))
        except ValueError:
            raise ConfigError(f"{where} is {value!r}, not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} is {json.dumps(value)[:60]}, not a number")
    return value


def evaluate(expr: str, files: dict[str, object]) -> float:
    """The number an expression over key paths gives; `files`: name -> data ("" for a lone file)."""
    tokens, at = [], 0
    while at < len(expr.rstrip()):
        m = _TOKEN.match(expr, at)
        if not m or m.end() == at:
            raise ConfigError(f"{expr}: cannot read it from {expr[at:].strip()!r}")
        tokens.append((m.lastgroup, m.group(m.lastgroup)))
        at = m.end()
    pos = 0

    def peek():
        return tokens[pos][1] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def value(kind, text, many=False):
        if kind == "num":
            return float(text)
        name, _, path = text.rpartition(":") if re.match(r"\w+:", text) else ("", "", text)
        if name not in files:
            raise ConfigError(f"{expr}: no file is named {name or 'without a name'!r} in the marker "
                              f"(names: {', '.join(n or '(none)' for n in files)})")
        got = lookup(files[name], path, text)
        return got if many else one(got, text)

    def atom():
        kind, text = take() if pos < len(tokens) else (None, None)
        if text == "-":
            return -atom()
        if text == "(":
            v = sum_()
            if take()[1] != ")":
                raise ConfigError(f"{expr}: a bracket is not closed")
            return v
        if kind == "func":
            take()
            args = []
            while True:
                k, t = tokens[pos] if pos < len(tokens) else (None, None)
                args.append(value(*take(), many=True) if k == "path" and peek_after() in (",", ")") else sum_())
                if take()[1] == ")":
                    break
            if text == "len" and len(args) == 1 and isinstance(args[0], list):
                return len(args[0])
            if len(args) == 1 and isinstance(args[0], (list, Many)):
                items = [one(x, expr) if not isinstance(x, bool) else x for x in args[0]]
                return _FUNCS[text](items)
            args = [one(a, expr) if isinstance(a, Many) else a for a in args]
            if text == "round" and len(args) == 2 and float(args[1]).is_integer():
                args[1] = int(args[1])  # round(x, 1): the digits are read as a number like any other
            try:
                return _FUNCS[text](args) if text in ("sum", "mean") else _FUNCS[text](*args)  # of several values
            except TypeError as e:
                raise ConfigError(f"{expr}: {text}() cannot take {len(args)} value(s) here: {e}") from None
        if kind in ("num", "path"):
            return value(kind, text)
        raise ConfigError(f"{expr}: expected a number, a path or a bracket, found {text!r}")

    def peek_after():
        return tokens[pos + 1][1] if pos + 1 < len(tokens) else None

    def product():
        v = atom()
        while peek() in ("*", "/"):
            op = take()[1]
            w = atom()
            if op == "/" and w == 0:
                raise ConfigError(f"{expr}: divides by zero")
            v = v * w if op == "*" else v / w
        return v

    def sum_():
        v = product()
        while peek() in ("+", "-"):
            op = take()[1]
            v = v + product() if op == "+" else v - product()
        return v

    result = sum_()
    if pos != len(tokens):
        raise ConfigError(f"{expr}: cannot read it from {' '.join(t for _, t in tokens[pos:])!r}")
    return result
