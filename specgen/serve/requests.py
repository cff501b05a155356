"""OpenAI request bodies -> what the worker runs, each field checked: a wrong one is a RequestError
(an HTTP 4xx) naming the field, what was expected and what was found. Unknown fields are ignored,
as OpenAI's API does."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from specgen.app.config import SEED_MAX
from specgen.app.prompts import Prompt, message_from, split_turns
from specgen.app.structured import read_tools, response_format
from specgen.errors import SpecgenError

MAX_STOPS = 4  # OpenAI's limit


class RequestError(Exception):
    """A request the server refuses: `status` (400, 401, 404, 413, 503...) and one line saying why."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


@dataclass(frozen=True)
class Sampling:
    temperature: float | None = None  # None: the server's setting
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Request:
    """One generation: a chat (messages through the chat template) or a completion (raw text)."""

    chat: bool
    prompt: Prompt
    max_tokens: int | None
    sampling: Sampling
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    model: str | None = None


def body_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"expected a JSON object as the request body, found invalid JSON ({e})") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"expected a JSON object as the request body, found {type(body).__name__}")
    return body


def _refuse_unsupported(body: dict) -> None:
    """Fields specgen does not implement are refused by name rather than silently ignored."""
    checks = {"n": lambda v: v not in (None, 1), "functions": bool, "function_call": lambda v: v not in (None, "none"),
              "logprobs": bool, "top_logprobs": lambda v: v not in (None, 0), "echo": bool,
              "best_of": lambda v: v not in (None, 1), "suffix": bool, "logit_bias": bool}
    for name, unsupported in checks.items():
        if unsupported(body.get(name)):
            raise RequestError(400, f"{name} is not supported by specgen serve (found {json.dumps(body[name])[:60]})",
                               name)


def _number(body: dict, name: str, low: float, high: float, whole: bool = False, low_open: bool = False):
    value = body.get(name)
    if value is None:
        return None
    ok_type = isinstance(value, int) if whole else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or (not whole and not math.isfinite(value)):
        raise RequestError(400, f"{name} expects {'a whole number' if whole else 'a number'}, found "
                                f"{json.dumps(value)[:40]}", name)
    if value < low or value > high or (low_open and value == low):
        lo = "(" if low_open else "["
        raise RequestError(400, f"{name} expects a value in {lo}{low:g}, {high:g}], found {value}", name)
    return value


def _sampling(body: dict) -> Sampling:
    return Sampling(_number(body, "temperature", 0, 2), _number(body, "top_p", 0, 1, low_open=True),
                    _number(body, "top_k", 0, 1 << 20, whole=True), _number(body, "seed", 0, SEED_MAX, whole=True))


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOPS:
        raise RequestError(400, f"stop expects a string or a list of up to {MAX_STOPS} strings, found "
                                f"{json.dumps(stop)[:60]}", "stop")
    return tuple(s for s in stops if s)


def _common(body: dict) -> dict:
    _refuse_unsupported(body)
    max_tokens = _number(body, "max_completion_tokens", 1, 1 << 20, whole=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", 1, 1 << 20, whole=True)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError(400, f"stream expects true or false, found {json.dumps(stream)[:40]}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError(400, "stream_options expects an object", "stream_options")
    model = body.get("model")
    return dict(max_tokens=max_tokens, sampling=_sampling(body), stop=_stop(body), stream=stream,
                include_usage=bool(options.get("include_usage")), model=model if isinstance(model, str) else None)


def _structured(body: dict, tools: bool) -> dict:
    """response_format (and, for chats, tools with tool_choice) as the Prompt's fields."""
    where = "response_format"
    try:
        constraint = response_format(body.get("response_format"))
        where = "tools"
        chosen = read_tools(body.get("tools"), body.get("tool_choice")) if tools else None
    except SpecgenError as e:
        raise RequestError(400, str(e), where) from None
    if not tools and body.get("tools"):
        raise RequestError(400, "tools expects a chat request (/v1/chat/completions), found a completion", "tools")
    if constraint is not None and chosen is not None:
        raise RequestError(400, "expected either response_format or tools (with tool_choice other than none), "
                                "found both", "response_format")
    return dict(constraint=constraint, tools=chosen)


def chat_request(body: dict) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, f"messages expects a non-empty list, found {json.dumps(messages)[:60]}", "messages")
    turns = []
    for i, m in enumerate(messages):
        try:
            turns.append(message_from(m, f"messages[{i}]"))
        except SpecgenError as e:
            raise RequestError(400, str(e), f"messages[{i}]") from None
    try:
        text, history, after = split_turns(turns, "messages")
    except SpecgenError as e:
        raise RequestError(400, str(e), "messages") from None
    return Request(True, Prompt(0, text, history, after, **_structured(body, tools=True)), **_common(body))


def completion_request(body: dict) -> Request:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError(400, f"prompt expects a non-empty string, found {json.dumps(prompt)[:60]}", "prompt")
    return Request(False, Prompt(0, prompt, **_structured(body, tools=False)), **_common(body))
