"""OpenAI's structured-output fields as specgen constraints: `response_format` and `tools`.

Shared by `specgen serve` and `.jsonl` prompt records. Tool calls come in one of two formats:
- "hermes": the GGUF's chat template renders `tools` itself and its model writes
  `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Hermes, Qwen 2.5/3, SmolLM3 ...):
  the call is generated under a grammar whose JSON is the tools' schemas.
- "generic" (every other template): the tools and the answer's format are put in a system
  message, and the answer is one JSON object, `{"tool_call": {"name": ..., "arguments": {...}}}`
  or `{"response": "text"}` (llama.cpp's generic format), generated under its JSON Schema.
Either way the constraint is verified like any other: the text is what constrained plain decoding
writes, and the call is parsed from it into OpenAI's `tool_calls`.
"""

from __future__ import annotations

import json
import re

from specgen.app.callstream import CLOSE, GENERIC, HERMES, OPEN, CallStream, ToolAnswer, ToolCall, Tools
from specgen.app.schemas import closed, hoisted
from specgen.core.constraint import ConstraintSpec
from specgen.drafting.calls import CallHistory
from specgen.errors import ConstraintError


def response_format(value: object) -> ConstraintSpec | None:
    """OpenAI's `response_format` (llama-server's `{"type": "json_object", "schema": ...}` too)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ConstraintError(f"response_format expects an object with \"type\" (text, json_object or json_schema), "
                              f"found {json.dumps(value)[:60]}")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")
        return ConstraintSpec("json_object") if schema is None else schema_spec(schema, "response_format.schema")
    if kind == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise ConstraintError("response_format json_schema expects {\"json_schema\": {\"name\": ..., \"schema\": "
                                  f"{{...}}}}, found {json.dumps(inner)[:60]}")
        return schema_spec(inner["schema"], "response_format.json_schema.schema")
    raise ConstraintError(f"response_format.type expects text, json_object or json_schema, found {kind!r}")


def schema_spec(schema: object, where: str) -> ConstraintSpec:
    """A JSON Schema as the constraint, closed as structured output closes it; `where` names the
    flag or field it came from in a refusal (--json-schema, json_schema, response_format.schema)."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise ConstraintError(f"{where} expects a JSON Schema object, found {json.dumps(schema)[:60]}")
    return ConstraintSpec("json_schema", json.dumps(closed(schema)))


def read_tools(tools: object, tool_choice: object, parallel: object = True) -> Tools | None:
    """OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`, checked; None when no tool may be called."""
    if not isinstance(parallel, bool):
        raise ConstraintError(f"parallel_tool_calls expects true or false, found {json.dumps(parallel)[:60]}")
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise ConstraintError(f"tool_choice {json.dumps(tool_choice)[:60]} needs tools, found none")
        return None
    functions = _functions(tools)
    if tool_choice in (None, "auto"):
        return Tools(tuple(functions), parallel=parallel)
    if tool_choice == "none":
        return None
    if tool_choice == "required":
        return Tools(tuple(functions), "required", parallel=parallel)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or name not in {f["name"] for f in functions}:
        raise ConstraintError(f"tool_choice expects none, auto, required or {{\"type\": \"function\", \"function\": "
                              f"{{\"name\": one of the tools}}}}, found {json.dumps(tool_choice)[:80]}")
    return Tools(tuple(functions), "function", name, parallel)


def _functions(tools: list) -> list[dict]:
    if not isinstance(tools, list):
        raise ConstraintError(f"tools expects a list of {{\"type\": \"function\", \"function\": {{...}}}}, found "
                              f"{json.dumps(tools)[:60]}")
    functions = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ConstraintError(f"tools[{i}] expects {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                  f"\"parameters\": {{...}}}}}}, found {json.dumps(tool)[:60]}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ConstraintError(f"tools[{i}].function.parameters expects a JSON Schema object, found "
                                  f"{json.dumps(params)[:60]}")
        functions.append({"name": fn["name"], "description": fn.get("description", ""), "parameters": params})
    return functions


def offered_tools(tools: object, tool_choice: object) -> tuple[dict, ...]:
    """The functions a `tool_choice: none` request names (read_tools has checked them; () otherwise):
    the prompt lists them still, in either format, so it reads as the loop's other requests do
    (the prompt cache keeps the conversation across a switch of tool_choice)."""
    return tuple(_functions(tools)) if tool_choice == "none" and isinstance(tools, list) and tools else ()


def tool_format(chat_template: str | None) -> str:
    """HERMES where the template itself renders tools and their `<tool_call>` blocks, else GENERIC."""
    return HERMES if chat_template and OPEN in chat_template and "tools" in chat_template else GENERIC


def _call_schema(tools: Tools) -> dict:
    """One call to one of the allowed functions; each function's `$defs` hoisted to the root."""
    calls, defs = [], {}
    for f in tools.allowed():
        params, own = hoisted(closed(f["parameters"]), f["name"])
        defs.update(own)
        calls.append({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params},
                      "required": ["name", "arguments"], "additionalProperties": False})
    root = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**root, "$defs": defs} if defs else root


def tool_constraint(tools: Tools, fmt: str) -> ConstraintSpec:
    """The grammar the answer is generated under. The hermes tags are matched as text: where a
    vocabulary makes `<tool_call>` a control token, the grammar writes it in its ordinary tokens."""
    if fmt == GENERIC:
        return ConstraintSpec("json_schema", json.dumps(_generic_schema(tools)))
    # Free text that does not open with "<" and never holds the opener (a call in it would be one
    # the schemas never checked), or calls: a call is chosen by its first character.
    text = f"TEXT: /[^<](?s:.*)/ & ~/(?s:.*){re.escape(OPEN)}(?s:.*)/"
    if not tools.allowed():
        return ConstraintSpec("lark", "\n".join(["start: TEXT", text]))
    call = _call_schema(tools)
    opener, closer = json.dumps(OPEN), json.dumps(CLOSE)
    lines = ["calls: call (\"\\n\" call)*" if tools.parallel else "calls: call",
             f"call: {opener} \"\\n\" args \"\\n\" {closer}",
             "args: %json " + json.dumps(call)]
    if tools.must_call:
        return ConstraintSpec("lark", "\n".join(["start: calls", *lines]))
    return ConstraintSpec("lark", "\n".join(["start: TEXT | calls", text, *lines]))


def _generic_schema(tools: Tools) -> dict:
    """One object: `{"tool_call": ...}` (at most one call, whatever parallel_tool_calls says) where a
    call is allowed, `{"response": "text"}` unless one must be made."""
    options, defs = [], None
    if tools.allowed():
        call = _call_schema(tools)
        defs = call.pop("$defs", None)
        options.append({"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"],
                        "additionalProperties": False})
    if not tools.must_call:
        options.append({"type": "object", "properties": {"response": {"type": "string"}},
                        "required": ["response"], "additionalProperties": False})
    root = options[0] if len(options) == 1 else {"anyOf": options}
    return {**root, "$defs": defs} if defs else root


def generic_system_prompt(functions: tuple[dict, ...]) -> str:
    """The system message of the generic format: every tool offered and how to answer, the same
    whatever tool_choice says (the answer's grammar enforces `required`, a named function or `none`:
    the response alone), so a conversation that switches tool_choice keeps its prompt cache."""
    listed = json.dumps([{"name": f["name"], "description": f["description"], "parameters": f["parameters"]}
                         for f in functions], ensure_ascii=False)
    how = ('Answer with one JSON object: {"tool_call": {"name": <tool name>, "arguments": {...}}} to call a tool, '
           'or {"response": <your answer as text>}.')
    return f"You can call these tools:\n{listed}\n{how}"


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_answer(text: str, fmt: str, tools: Tools) -> ToolAnswer:
    """The generated text (whole, or cut by max_tokens or a stop string) as content and/or tool
    calls, read as a stream of it reads it (callstream.py: the one reader): calls only where the
    grammar's call branch wrote them, each to one of `tools`; a cut call as written."""
    stream = CallStream(fmt, tools)
    stream.finish(text)
    return stream.answer()


def _arguments(fn: dict) -> object:
    """A history call's arguments as the object the model would have written (text kept if not JSON)."""
    args = fn.get("arguments", "{}")
    parsed = _json(args) if isinstance(args, str) else args
    return args if parsed is None else parsed


def generic_messages(messages: list[dict], tools_listed: bool = False) -> list[dict]:
    """A history as the generic format's model reads it: an assistant's tool calls as the JSON it
    would have written (one object a line), the tools' results as one user message, a line each
    naming the function called (one message: templates that want roles to alternate refuse two
    user turns in a row). Names, not call ids: ids are random, and the same conversation must read
    the same every run. With `tools_listed` (the system message asks for one JSON object), an
    assistant's text answer is the `{"response": ...}` it was written as (the next request then
    begins with all the last one read and wrote), but a last one, which the answer continues."""
    names = {c.get("id"): c.get("function", {}).get("name")
             for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or ()}
    out: list[dict] = []
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and m.get("tool_calls"):
            lines = [json.dumps({"response": m["content"]}, ensure_ascii=False)] if m.get("content") else []
            lines += [json.dumps({"tool_call": {"name": c.get("function", {}).get("name"),
                                                "arguments": _arguments(c.get("function", {}))}}, ensure_ascii=False)
                      for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(lines)})
        elif m.get("role") == "assistant" and tools_listed and i < len(messages) - 1:
            out.append({**m, "content": json.dumps({"response": m.get("content") or ""}, ensure_ascii=False)})
        elif m.get("role") == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id")) or "a tool"
            line = f"Result of {name}: {m.get('content') or ''}"
            if i and messages[i - 1].get("role") == "tool":
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + line}
            else:
                out.append({"role": "user", "content": line})
        else:
            out.append(m)
    return out


def call_history(messages: list[dict], tools: Tools, fmt: str) -> CallHistory:
    """What call-aware drafting (drafting/calls.py) draws on: the conversation's earlier calls,
    from assistants' `tool_calls` and from calls written in their text (a multi-turn run keeps the
    model's own answers as text), and its user and tool messages."""
    calls: list[tuple[str, dict]] = []
    texts, results = [], []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role == "assistant":
            for c in m.get("tool_calls") or ():
                fn = c.get("function", {})
                if isinstance(args := _arguments(fn), dict) and isinstance(fn.get("name"), str):
                    calls.append((fn["name"], args))
            if isinstance(content, str) and content:
                named = Tools(tools.functions)  # any function this request knows, offered now or not
                calls += [(c.name, args) for c in _written_calls(content, fmt, named)
                          if isinstance(args := _json(c.arguments), dict)]  # a cut call's are not JSON
        elif role in ("user", "tool") and isinstance(content, str):
            texts.append(content)
            if role == "tool":
                results.append(content)
    return CallHistory(tuple(calls), tuple(texts), tuple(results))


def _written_calls(text: str, fmt: str, tools: Tools) -> tuple[ToolCall, ...]:
    """The calls a history's text holds, read as an answer is read; none where the text is not
    what the grammar writes (an answer written without it, say hermes' `none`: a string the reader
    cannot decode as JSON)."""
    try:
        return parse_answer(text, fmt, tools).calls
    except ValueError:
        return ()
