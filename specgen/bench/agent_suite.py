"""The agent suite (suites/agent.jsonl): multi-turn tool conversations, each with its tools, a system
prompt, the user's turns and the tools' canned results, so that the simulated tool answers every
engine alike; and a check of a call against its tool's schema.

A record: {"id": "agent-01", "category": ..., "system": ..., "tools": [OpenAI tools], "turns":
[user text, ...], "results": {function name: JSON value}}. A result's strings may name the call's
arguments: "$city" alone is replaced by the argument's value (any JSON), "$city" inside a longer
string by its text; an argument the call did not give stays as written.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from importlib import resources

from specgen.app.prompts import jsonl_records
from specgen.app.schemas import closed
from specgen.app.structured import read_tools
from specgen.bench.suites import half_of, SPLITS
from specgen.errors import ConfigError, ConstraintError, PromptError

SUITE = "agent"


@dataclass(frozen=True)
class AgentConversation:
    prompt_id: str
    group: str
    system: str
    tools: tuple[dict, ...]  # OpenAI's {"type": "function", "function": {...}}, sent as given
    turns: tuple[str, ...]
    results: dict  # function name -> its canned result (a JSON value)

    def schema_of(self, name: str) -> dict | None:
        """The closed parameters schema of function `name` (None: no such tool), as the grammar reads it."""
        for t in self.tools:
            if t["function"]["name"] == name:
                return closed(t["function"].get("parameters", {"type": "object", "properties": {}}))
        return None


def parse_agent_file(text: str, origin: str) -> list[AgentConversation]:
    out = []
    for lineno, rec in jsonl_records(text, origin):
        where = f"{origin} line {lineno}"
        ok = (isinstance(rec, dict) and isinstance(rec.get("id"), str) and isinstance(rec.get("system"), str)
              and isinstance(rec.get("turns"), list) and rec["turns"]
              and all(isinstance(t, str) and t.strip() for t in rec["turns"])
              and isinstance(rec.get("results"), dict) and isinstance(rec.get("tools"), list))
        if not ok:
            raise PromptError(f"{where}: expected an agent conversation {{\"id\", \"system\", \"tools\": [...], "
                              f"\"turns\": [text, ...], \"results\": {{name: value}}}}, found {json.dumps(rec)[:80]}")
        try:
            tools = read_tools(rec["tools"], "required")
        except ConstraintError as e:
            raise PromptError(f"{where}: {e}") from None
        missing = sorted(tools.names() - set(rec["results"]))
        if missing:
            raise PromptError(f"{where}: expected a result for every tool, found none for {', '.join(missing)}")
        out.append(AgentConversation(rec["id"], str(rec.get("category", "agent")), rec["system"],
                                     tuple(rec["tools"]), tuple(rec["turns"]), rec["results"]))
    if not out:
        raise PromptError(f"{origin}: no conversations found")
    return out


def load_agent_suite(split: str = "all") -> list[AgentConversation]:
    """The shipped suite, or one of its halves (suites.split_half's rule: even ids report, odd tune)."""
    if split not in SPLITS:
        raise ConfigError(f"--split expects {', '.join(SPLITS)}, found {split!r}")
    text = resources.files("specgen").joinpath(f"suites/{SUITE}.jsonl").read_text(encoding="utf-8")
    convs = parse_agent_file(text, f"{SUITE} suite")
    return convs if split == "all" else [c for c in convs if half_of(c.prompt_id) == split]


def tool_result(conv: AgentConversation, name: str, arguments: str) -> str:
    """The canned result of calling `name` with `arguments` (JSON text), as the tool message's content."""
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {}
    args = args if isinstance(args, dict) else {}
    if name not in conv.results:
        return json.dumps({"error": f"no tool named {name}"})
    return json.dumps(_filled(conv.results[name], args), ensure_ascii=False)


def _filled(value, args: dict):
    if isinstance(value, str):
        if value.startswith("$") and value[1:] in args:
            return args[value[1:]]
        return string.Template(value).safe_substitute({k: v if isinstance(v, str) else json.dumps(v)
                                                       for k, v in args.items()})
    if isinstance(value, list):
        return [_filled(v, args) for v in value]
    if isinstance(value, dict):
        return {k: _filled(v, args) for k, v in value.items()}
    return value


def call_valid(conv: AgentConversation, name: str, arguments: str) -> bool:
    """Does the call name one of the tools, with arguments that are JSON and fit its closed schema?"""
    schema = conv.schema_of(name)
    try:
        args = json.loads(arguments)
    except ValueError:
        return False
    return schema is not None and fits(schema, args)


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def fits(schema: dict, value) -> bool:
    """`value` under the JSON Schema words the suite's tools use (type, enum, const, properties,
    required, additionalProperties, items, minimum, maximum, anyOf); other words are not checked."""
    if not isinstance(schema, dict):
        return True
    if "anyOf" in schema and not any(fits(s, value) for s in schema["anyOf"]):
        return False
    if "enum" in schema and value not in schema["enum"] or "const" in schema and value != schema["const"]:
        return False
    kind = schema.get("type")
    if kind is not None and not any(_is(k, value) for k in (kind if isinstance(kind, list) else [kind])):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"] or "maximum" in schema and value > schema["maximum"]:
            return False
    if isinstance(value, list):
        return all(fits(schema.get("items", {}), v) for v in value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if any(k not in value for k in schema.get("required", [])):
            return False
        extra = schema.get("additionalProperties", True)
        for k, v in value.items():
            if k in props:
                if not fits(props[k], v):
                    return False
            elif extra is False or isinstance(extra, dict) and not fits(extra, v):
                return False
    return True


def _is(kind: str, value) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES.get(kind, object))
