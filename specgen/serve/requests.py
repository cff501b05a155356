"""OpenAI and llama-server request bodies -> what the worker runs, each field checked: a wrong one is
a RequestError (an HTTP 4xx) naming the field, what was expected and what was found. A documented
field specgen does not act on is refused unless its value changes nothing (fields.py); the body's
JSON and the fields its route knows are read first (body.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from specgen.app import ask, samplers
from specgen.app.ask import BIAS_MAX, BY_NAME, Bound, Overrides
from specgen.app.prompts import Message, Prompt, message_from, split_turns
from specgen.app.stops import stops_of
from specgen.app.structured import offered_tools, read_tools, response_format, schema_spec
from specgen.core.constraint import ConstraintSpec
from specgen.core.logprobs import MAX_TOP
from specgen.errors import ConfigError, SpecgenError
from specgen.serve import ecosystem, fields
from specgen.serve.body import Body, RequestError

MAX_TOKENS = 2**31 - 1  # a larger max_tokens is a mistake; any below is capped at the context's room
# A temperature above 0 and below this is read as 0, greedy: logits divided by it leave float32's
# range, and the choice it samples is the most likely token anyway (T times any noise is far below
# the gap between two float32 logits).
GREEDY_BELOW = 1e-30


@dataclass(frozen=True)
class Request:
    """One generation: a chat (messages through the chat template) or a completion (raw text)."""

    chat: bool
    prompt: Prompt
    max_tokens: int | None  # None: the server's default (-n), else until the context ends
    # The sampling values the request gives, typed by ask.BOUNDS' names (and logit_bias as (token,
    # added logit) pairs, -inf banning): they replace the server's own (worker.py makes the Ask).
    sampling: Overrides
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    # Log-probabilities of each token and of that many alternatives (OpenAI's logprobs with
    # top_logprobs, the completions API's logprobs, llama-server's n_probs); None: not asked.
    logprobs: int | None = None
    cache_prompt: bool = True  # llama-server's: false reads the whole prompt, whatever the cache holds
    notes: tuple[str, ...] = ()  # what the request asked for and its model cannot act on (ecosystem.py)


def _refuse_unsupported(body: dict, chat_template: str | None, chat: bool) -> list[str]:
    """Fields specgen does not act on are refused by name unless their value changes nothing. A
    request for reasoning where the template writes none asks for nothing: answered, with a note
    (returned); so does the setting of a sampler specgen lacks that the request's `samplers` leaves out."""
    reasons = ecosystem.writes_reasoning(chat_template)
    for name, kind in _REASONING_TYPES.items():
        value = body.get(name)
        if value is not None and (not isinstance(value, kind) or kind is int and isinstance(value, bool)):
            raise RequestError(400, f"{name} expects {_KIND_NAMES[kind]}, found {json.dumps(value)[:40]}", name)
    budget = body.get("thinking_budget_tokens")
    if reasons and ecosystem.asks_reasoning("thinking_budget_tokens", budget):
        raise RequestError(400, f"thinking_budget_tokens is not supported at {budget}: reasoning is not cut short "
                                "(send -1)", "thinking_budget_tokens")
    # A chat's reasoning_effort reaches its template (ecosystem.with_effort); no template renders a
    # completion's prompt, so there it changes nothing (_common says so).
    handled = {"chat_template_kwargs", "reasoning_control", "thinking_budget_tokens", "reasoning_effort",
               *(() if reasons else ("reasoning_format",))}
    notes = []
    if body.get("samplers") is not None:  # a sampler the chain leaves out does not act (samplers.py)
        names = _samplers(body)[0]
        for name, settings in samplers.OTHERS.items():
            for field in settings:
                if name not in names and field in body and not fields.REFUSED[field][0](body[field]):
                    handled.add(field)
                    notes.append(f"{field} {json.dumps(body[field])[:20]} changed nothing: samplers leaves out {name}")
    checked = {k: v for k, v in body.items() if k not in handled}
    try:
        fields.check(checked, chat_template)
    except fields.Refusal as e:
        raise RequestError(400, e.message, e.name) from None
    return notes


def _samplers(body: dict) -> tuple[tuple[str, ...], list[str]]:
    """The request's `samplers` as llama.cpp's names in order, and the names llama-server skips."""
    try:
        return samplers.parse(body.get("samplers"))
    except ConfigError as e:
        raise RequestError(400, str(e), "samplers") from None


_REASONING_TYPES = {"reasoning_format": str, "reasoning_control": bool, "reasoning_effort": str,
                    "thinking_budget_tokens": int}
_KIND_NAMES = {str: "a string", bool: "true or false", int: "a whole number"}


def _number(body: dict, name: str, low: float, high: float, whole: bool = False, low_open: bool = False):
    return _bounded(body, name, Bound(name, low, high, low_open, whole))


def _bounded(body: dict, name: str, bound: Bound):
    """The field `name`, of bound's type and in its range (None: not given)."""
    value = body.get(name)
    if value is None:
        return None
    ok_type = isinstance(value, int) if bound.whole else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or (not bound.whole and not math.isfinite(value)):
        raise RequestError(400, f"{name} expects {'a whole number' if bound.whole else 'a number'}, found "
                                f"{json.dumps(value)[:40]}", name)
    if not bound.holds(value):
        raise RequestError(400, f"{name} expects a value {bound.range_text}, found {value}", name)
    return value if bound.whole else float(value)


# llama-server's other names for a sampling field (the first given wins).
ALIASES = {"repeat_last_n": ("repeat_last_n", "penalty_last_n")}


def _sampling(body: dict) -> Overrides:
    """The sampling fields given, each checked against the one table (ask.BOUNDS)."""
    given: dict[str, object] = {}
    for name, bound in BY_NAME.items():
        if name == "seed" and body.get("seed") == -1:
            continue  # llama-server's "random": the server's own seed
        for field in ALIASES.get(name, (name,)):
            value = _bounded(body, field, bound)
            if value is not None:
                given.setdefault(name, value)
    if 0 < given.get("temperature", 0) < GREEDY_BELOW:
        given["temperature"] = 0.0
    bias = _logit_bias(body.get("logit_bias"))
    if bias is not None:
        given["logit_bias"] = bias
    if body.get("samplers") is not None:
        given["samplers"] = _samplers(body)[0]  # followed over the server's settings (Overrides.over)
    return Overrides(**given)


def _logit_bias(given: object) -> tuple[tuple[int, float], ...] | None:
    """OpenAI's {"token id": bias} or llama-server's [[token id, bias], ...]; a bias in [-100, 100]
    is added to the token's logit, false bans the token."""
    if given is None:
        return None
    pairs = list(given.items()) if isinstance(given, dict) else given
    if not isinstance(pairs, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise RequestError(400, f"logit_bias expects an object of token ids to biases, found {json.dumps(given)[:60]}",
                           "logit_bias")
    out: dict[int, float] = {}
    for token, bias in pairs:
        tid = _token_id(token)
        if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
            raise RequestError(400, f"logit_bias expects token ids (\"50256\") as keys, found "
                                    f"{json.dumps(token, ensure_ascii=False)[:40]}", "logit_bias")
        if bias is False:
            out[tid] = -math.inf
        elif (isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias)
              or abs(bias) > BIAS_MAX):
            raise RequestError(400, f"logit_bias expects biases in [-{BIAS_MAX:g}, {BIAS_MAX:g}] (or false: never "
                                    f"this token), found {json.dumps(bias)[:40]} for token {tid}", "logit_bias")
        else:
            out[tid] = float(bias)
    return tuple(out.items())


def _token_id(token: object) -> object:
    """A key of OpenAI's logit_bias as the id it names: ASCII digits ("²" and "١" are digits to
    str.isdigit, not to int), no more than any vocabulary's ids need; anything else as it came."""
    if isinstance(token, str) and token.isascii() and token.isdigit() and len(token) <= 12:
        return int(token)
    return token


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives to list beside each token's log-probability; None: none asked. Chat:
    logprobs true with top_logprobs; completions: logprobs is the number; n_probs: llama-server's."""
    given = body.get("logprobs")
    if chat:
        if given not in (None, False, True):
            raise RequestError(400, f"logprobs expects true or false, found {json.dumps(given)[:40]}", "logprobs")
        top = _number(body, "top_logprobs", 0, MAX_TOP, whole=True)
        if top not in (None, 0) and given is not True:
            raise RequestError(400, f"top_logprobs expects logprobs: true beside it, found logprobs: "
                                    f"{json.dumps(given)}", "top_logprobs")
        count = (top or 0) if given is True else None
    else:
        count = None if given in (None, False) else _number(body, "logprobs", 0, MAX_TOP, whole=True)
    n_probs = _number(body, "n_probs", 0, MAX_TOP, whole=True)
    return count if count is not None or not n_probs else n_probs


def _stop(body: dict) -> tuple[str, ...]:
    """The request's stop strings, under the command line's rule (app/stops.py: non-empty text, as
    many and as long as --stop takes)."""
    try:
        return stops_of(body.get("stop"), "stop")
    except ConfigError as e:
        raise RequestError(400, str(e), "stop") from None


def _max_tokens(body: dict) -> int | None:
    """max_completion_tokens, max_tokens or llama-server's n_predict (the first given); -1: until
    the context ends or the model stops (a number past the context's room is capped there)."""
    for name, low in (("max_completion_tokens", 1), ("max_tokens", 1), ("n_predict", 0)):
        if body.get(name) == -1 and not isinstance(body.get(name), bool):
            return -1
        value = _number(body, name, low, MAX_TOKENS, whole=True)
        if value is not None:
            return value
    return None


def _common(body: dict, chat_template: str | None, chat: bool, kwargs: tuple = ()) -> dict:
    notes = _refuse_unsupported(body, chat_template, chat)
    if body.get("samplers") is not None and (skipped := _samplers(body)[1]):
        notes.append(f"samplers: llama-server knows no sampler {', '.join(map(json.dumps, skipped))[:200]}: skipped")
    if chat:
        notes += ecosystem.reasoning_notes(body, chat_template, kwargs)
    else:
        unread = {k: v for k, v in body.items() if k != "reasoning_effort"}
        notes += ecosystem.reasoning_notes(unread, chat_template, kwargs)
        if ecosystem.asks_reasoning("reasoning_effort", body.get("reasoning_effort")):
            notes.append("reasoning_effort changed nothing: a completion's prompt is raw text, which no chat "
                         "template renders")
    if isinstance(body, Body):
        body.notes.extend(notes)
    max_tokens = _max_tokens(body)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError(400, f"stream expects true or false, found {json.dumps(stream)[:40]}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError(400, "stream_options expects an object", "stream_options")
    model = body.get("model")
    cache_prompt = body.get("cache_prompt", True)
    if not isinstance(cache_prompt, bool):
        raise RequestError(400, f"cache_prompt expects true or false, found {json.dumps(cache_prompt)[:40]}",
                           "cache_prompt")
    return dict(cache_prompt=cache_prompt, max_tokens=max_tokens, sampling=_sampling(body), stop=_stop(body), stream=stream,
                include_usage=bool(options.get("include_usage")), model=model if isinstance(model, str) else None,
                logprobs=_logprobs(body, chat), notes=tuple(notes))


def _constraint(body: dict) -> ConstraintSpec | None:
    """response_format, or llama-server's top-level json_schema or grammar (GBNF): at most one."""
    given = [name for name in ("response_format", "json_schema", "grammar") if body.get(name) not in (None, "")]
    if len(given) > 1:
        raise RequestError(400, f"expected one of response_format, json_schema, grammar, found {' and '.join(given)}",
                           given[1])
    where = given[0] if given else "response_format"
    try:
        if where == "json_schema":
            return schema_spec(body["json_schema"], "json_schema")
        if where == "grammar":
            if not isinstance(body["grammar"], str):
                raise RequestError(400, f"grammar expects GBNF text, found {json.dumps(body['grammar'])[:60]}",
                                   "grammar")
            return ConstraintSpec("gbnf", body["grammar"])
        return response_format(body.get("response_format"))
    except SpecgenError as e:
        raise RequestError(400, str(e), where) from None


def _structured(body: dict, tools: bool) -> dict:
    """response_format, json_schema or grammar (and, for chats, tools with tool_choice) as the
    Prompt's fields."""
    constraint = _constraint(body)
    try:
        chosen = read_tools(body.get("tools"), body.get("tool_choice"), parallel=_parallel(body)) if tools else None
        offered = offered_tools(body.get("tools"), body.get("tool_choice")) if tools else ()
    except SpecgenError as e:
        raise RequestError(400, str(e), "tools") from None
    if not tools and body.get("tools"):
        raise RequestError(400, "tools expects a chat request (/v1/chat/completions), found a completion", "tools")
    if constraint is not None and chosen is not None:
        raise RequestError(400, "expected either response_format or tools (with tool_choice other than none), "
                                "found both", "response_format")
    return dict(constraint=constraint, tools=chosen, offered=offered)


def _parallel(body: dict) -> bool:
    """parallel_tool_calls: may one answer hold several calls (OpenAI's default, true)."""
    given = body.get("parallel_tool_calls")
    if given is not None and not isinstance(given, bool):
        raise RequestError(400, f"parallel_tool_calls expects true or false, found {json.dumps(given)[:40]}",
                           "parallel_tool_calls")
    return given is not False


def chat_request(body: dict, chat_template: str | None = None) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, f"messages expects a non-empty list, found {json.dumps(messages)[:60]}", "messages")
    turns = []
    for i, m in enumerate(messages):
        try:
            turns.append(message_from(m, f"messages[{i}]"))
        except SpecgenError as e:
            raise RequestError(400, str(e), f"messages[{i}]") from None
    _check_calls(turns)
    try:
        text, history, after = split_turns(turns, "messages")
    except SpecgenError as e:
        raise RequestError(400, str(e), "messages") from None
    try:
        kwargs = ecosystem.template_kwargs(body.get("chat_template_kwargs"))
    except ValueError as e:
        raise RequestError(400, str(e), "chat_template_kwargs") from None
    variables = ecosystem.with_effort(kwargs, body.get("reasoning_effort"))  # a wrong type: _common's 400
    return Request(True, Prompt(0, text, history, after, **_structured(body, tools=True), template_vars=variables),
                   **_common(body, chat_template, chat=True, kwargs=kwargs))


def _check_calls(turns: list[Message]) -> None:
    """Each call an assistant made (its tool_calls) names itself with a string id and its function
    with a string name, as OpenAI's API requires (either may be left out)."""
    for i, turn in enumerate(turns):
        for j, call in enumerate(turn.tool_calls):
            for key, value in (("id", call.get("id")), ("function.name", call["function"].get("name"))):
                if value is not None and not isinstance(value, str):
                    raise RequestError(400, f"messages[{i}].tool_calls[{j}].{key} expects a string, found "
                                            f"{json.dumps(value)[:40]}", f"messages[{i}]")


def completion_request(body: dict, chat_template: str | None = None) -> Request:
    """/v1/completions, and llama-server's /completion (the same fields, n_predict among them); the
    prompt's special-token text is read as those tokens, as llama-server tokenizes both routes' prompts."""
    if getattr(body, "ignored", None) is not None and "reasoning_effort" in body:
        body.ignored.append("reasoning_effort")  # llama-server's /completion reads no reasoning_effort
        body.pop("reasoning_effort")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError(400, f"prompt expects a non-empty string (token ids and several prompts are not "
                                f"supported), found {json.dumps(prompt)[:60]}", "prompt")
    return Request(False, Prompt(0, prompt, **_structured(body, tools=False), parse_special=True),
                   **_common(body, chat_template, chat=False))


def check_vocabulary(request: Request, n_vocab: int) -> None:
    """logit_bias names tokens of the served model's vocabulary, and leaves at least one unbanned
    (ask.check_vocabulary, the rule the runner applies to every Ask), checked before the request
    waits in line."""
    try:
        ask.check_vocabulary(request.sampling.logit_bias or (), n_vocab)
    except ConfigError as e:
        raise RequestError(400, str(e), "logit_bias") from None
