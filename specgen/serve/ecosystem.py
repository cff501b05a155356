"""Each client's body read as its own ecosystem reads it (docs/serve.md, "Whose rules a body follows").

- OpenAI's routes (/v1/..., and the same routes without /v1) answer a field they do not know as
  OpenAI does: a 400 naming it (body.body_json), so that a misspelt "temprature" is never a
  request sampled at the default.
- llama-server's own routes (NATIVE) take what llama-server takes and ignore what it ignores: a key
  the route does not know (another backend's setting that SillyTavern sends, `model` to /tokenize)
  is dropped and named in the X-Specgen-Ignored-Fields header and in one line of the server's log.
- Fields that can act, act: `chat_template_kwargs` become variables of the chat template (as
  llama-server passes them); a request for reasoning on a model whose template writes none
  (reasoning_format, reasoning_control, reasoning_effort, thinking_budget_tokens, enable_thinking)
  asks for nothing there, so it is answered, and the X-Specgen-Notes header and the log say so.
"""

from __future__ import annotations

import json
import logging

log = logging.getLogger("specgen.serve")

# llama-server's native routes that specgen serves (its /infill is not served: a 404).
NATIVE = frozenset(("/completion", "/tokenize", "/detokenize", "/apply-template", "/embedding", "/embeddings"))
IGNORED_HEADER = "X-Specgen-Ignored-Fields"
NOTES_HEADER = "X-Specgen-Notes"

# Template variables the renderer sets itself (llama-cpp-python's Jinja2ChatFormatter): a
# chat_template_kwargs key of these names would replace the conversation or the tools.
RESERVED = frozenset(("messages", "tools", "tool_choice", "functions", "function_call", "bos_token", "eos_token",
                      "add_generation_prompt", "raise_exception", "strftime_now"))
# The fields by which a request asks for reasoning (llama-server's and OpenAI's), with the value of
# each that asks for none.
REASONING = {"reasoning_format": ("none",), "reasoning_control": (False,), "reasoning_effort": ("", "none"),
             "thinking_budget_tokens": (-1,)}


def known_beside(known: frozenset[str]) -> frozenset[str]:
    """Fields a generation route knows beside fields.ROUTES' (llama-server's newer reasoning budget,
    which its web UI sends): read by requests.py."""
    return frozenset(("thinking_budget_tokens",)) if "max_tokens" in known else frozenset()


def writes_reasoning(chat_template: str | None) -> bool:
    """Whether the model's chat template has a reasoning block to write (the <think> that
    llama-server's reasoning parsers separate)."""
    return "<think>" in (chat_template or "")


def asks_reasoning(name: str, value: object) -> bool:
    return value is not None and not any(value == v and type(value) is type(v) for v in REASONING[name])


def template_kwargs(given: object) -> tuple[tuple[str, str], ...]:
    """chat_template_kwargs as (name, JSON value) pairs for the chat template; raises ValueError
    with one line naming what was expected and found."""
    if given is None:
        return ()
    if not isinstance(given, dict):
        raise ValueError(f"chat_template_kwargs expects an object of template variables, found "
                         f"{json.dumps(given)[:60]}")
    taken = sorted(k for k in given if k in RESERVED)
    if taken:
        raise ValueError(f"chat_template_kwargs expects variables of its own, found {taken[0]!r}, which the "
                         "server sets from the request itself")
    return tuple((k, json.dumps(v)) for k, v in given.items())


def with_effort(kwargs: tuple[tuple[str, str], ...], effort: object) -> tuple[tuple[str, str], ...]:
    """The template's variables with OpenAI's reasoning_effort among them, as llama-server puts it
    there: "none" is enable_thinking false (unless chat_template_kwargs give enable_thinking: those
    reach the template last there), any other level the template's reasoning_effort (gpt-oss's reads it)."""
    if not isinstance(effort, str) or not effort:
        return kwargs
    variables = dict(kwargs)
    if effort == "none":
        variables.pop("reasoning_effort", None)
        variables.setdefault("enable_thinking", "false")
    else:
        variables["reasoning_effort"] = json.dumps(effort)
    return tuple(variables.items())


def reasoning_notes(body: dict, chat_template: str | None, kwargs: tuple[tuple[str, str], ...]) -> list[str]:
    """What a request asked for that its model's template cannot act on, said plainly (the request
    is answered as if it had not asked)."""
    notes, template = [], chat_template or ""
    effort = body.get("reasoning_effort")
    if not writes_reasoning(chat_template):
        asked = [n for n in REASONING if asks_reasoning(n, body.get(n))
                 and not (n == "reasoning_effort" and n in template)]  # a template that reads it acts on it
        if dict(kwargs).get("enable_thinking") == "true":
            asked.append("chat_template_kwargs.enable_thinking")
        if asked:
            notes.append(f"the model's chat template writes no reasoning: {', '.join(asked)} changed nothing")
    else:
        if body.get("reasoning_control") is True:
            notes.append("reasoning_control: no endpoint ends reasoning early here; the reasoning is written whole")
        read = "enable_thinking" if effort == "none" else "reasoning_effort"
        if isinstance(effort, str) and effort and read not in template:
            notes.append(f"the chat template reads no {read}: reasoning_effort {effort} changed nothing")
    unread = [k for k, _ in kwargs if k not in (chat_template or "")]
    if unread and chat_template:
        notes.append(f"the chat template reads no {', '.join(unread)} (chat_template_kwargs)")
    return notes


def say(method: str, path: str, ignored: list[str], notes: list[str]) -> dict[str, str]:
    """The response headers that name what a request sent and did not get, and its one log line."""
    headers = {}
    if ignored:
        headers[IGNORED_HEADER] = _header(", ".join(ignored))
    if notes:
        headers[NOTES_HEADER] = _header("; ".join(notes))
    if headers:
        parts = ([f"ignored {', '.join(ignored)}"] if ignored else []) + notes
        log.warning("specgen serve: %s %s: %s", method, path, "; ".join(parts).replace("\n", " ")[:1000])
    return headers


def _header(text: str) -> str:
    """A header value: printable ASCII (a key named in another script is escaped), one line."""
    return json.dumps(text)[1:-1][:2000]
