"""A conversation with tools reads as the same prefix whatever else a request asks (issue 67): the
tools are rendered whenever the request offers them, in both tool formats, and nothing that
tool_choice says goes before the new turn; the answer a request wrote is what the next request's
history shows, so an agent's loop re-reads only the tokens new to each request."""

import json

import pytest

from specgen.app.ask import ask_for
from specgen.app.prompts import parse_prompt_file
from specgen.app.runner import encode_prompt, render_prompt
from specgen.app.structured import GENERIC, HERMES, parse_answer

HERMES_MODEL = "smollm2-135m-instruct-hermes"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather now in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
CHOICES = {"auto": "auto", "none": "none", "required": "required",
           "named": {"type": "function", "function": {"name": "get_time"}}}
ASKED = [{"role": "system", "content": "You answer questions about cities."},
         {"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
CALLED = [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(CALL["arguments"])}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
ANSWER = "It is 18 C and sunny in Paris."
NEXT = [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": "And the time there?"}]
# What the model writes under each format's grammar (compact layout): a call, and a text answer.
WRITTEN = {GENERIC: {"call": json.dumps({"tool_call": CALL}), "answer": json.dumps({"response": ANSWER})},
           HERMES: {"call": f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>", "answer": ANSWER}}


@pytest.fixture(scope="module", params=[GENERIC, HERMES])
def model(request, smollm2_path):
    """smollm2 under its own template (no tools in it: the generic format), and under the shipped
    Hermes-style one."""
    from specgen.llama.backend import LlamaModel
    from specgen.models import resolve as models

    loaded = LlamaModel(smollm2_path if request.param == GENERIC else models.resolve(HERMES_MODEL))
    return request.param, loaded


def prompt(tmp_path, messages, choice):
    """The request as a .jsonl record reads it (the server reads its body through the same checks)."""
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"messages": messages, "tools": [WEATHER, TIME], "tool_choice": choice}) + "\n")
    return parse_prompt_file(path)[0]


def tokens(model, p) -> list[int]:
    """The prompt tokens a runner reads for it (through its Ask, as the server makes it)."""
    ask = ask_for(model, p, True, "compact")
    return encode_prompt(model, ask.prompt, True)


@pytest.mark.real
@pytest.mark.parametrize("messages", [ASKED, ASKED + CALLED, ASKED + CALLED + NEXT], ids=["ask", "result", "next"])
def test_every_tool_choice_renders_the_same_tokens(model, tmp_path, messages):
    fmt, m = model
    rendered = {name: tokens(m, prompt(tmp_path, messages, choice)) for name, choice in CHOICES.items()}
    assert all(r == rendered["auto"] for r in rendered.values()), {
        name: b"".join(m.piece(t) for t in r[len(common(r, rendered["auto"])):])[:120]
        for name, r in rendered.items()}


def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


@pytest.mark.real
@pytest.mark.parametrize("before, written, after, choices", [
    (ASKED, "call", ASKED + CALLED, ("required", "none")),
    (ASKED + CALLED, "answer", ASKED + CALLED + NEXT, ("none", "named")),
    (ASKED + CALLED, "answer", ASKED + CALLED + NEXT, ("auto", "required"))], ids=["call", "answer-none", "answer-auto"])
def test_the_next_request_begins_with_this_one_and_what_it_wrote(model, tmp_path, before, written, after, choices):
    """A request's prompt and the text its answer wrote (as the grammar writes it) are the start of the
    next request's prompt, whatever tool_choice each asked for: only the tool's result or the user's
    new turn is new."""
    fmt, m = model
    first, then = (prompt(tmp_path, msgs, CHOICES[c]) for msgs, c in ((before, choices[0]), (after, choices[1])))
    text = render_prompt(m, ask_for(m, first, True, "compact").prompt, True) + WRITTEN[fmt][written]
    assert render_prompt(m, ask_for(m, then, True, "compact").prompt, True).startswith(text)


@pytest.mark.real
def test_tool_choice_none_answers_in_text(model, tmp_path):
    """none: nothing may be called. The generic format's answer is its `{"response": ...}` object
    (the system message asks for one JSON object), read back as content; hermes' is free text."""
    fmt, m = model
    ask = ask_for(m, prompt(tmp_path, ASKED + CALLED, "none"), True, "compact")
    if fmt == GENERIC:
        assert ask.constraint is not None and "tool_call" not in ask.constraint.text
        c = m.constrain(ask.constraint)
        for text, fits in ((WRITTEN[GENERIC]["answer"], True), (WRITTEN[GENERIC]["call"], False)):
            written = m.tokenize(text, add_special=False)
            assert (c.valid_prefix(written) == len(written)) is fits, text
        answer = parse_answer(WRITTEN[GENERIC]["answer"], GENERIC, ask.prompt.tools)
        assert answer.content == ANSWER and answer.calls == ()
    else:
        assert ask.constraint is None and ask.prompt.tools is None


def test_a_history_text_that_is_no_json_holds_no_call():
    """An answer written without the grammar (hermes' `none`, with the tools listed now, may write a
    `<tool_call>` block as text, cut mid-string) is history the next request's call-aware drafting
    reads: no call comes of it, and nothing raises (it was a 500: the JSON string held a newline)."""
    from specgen.app.structured import call_history, read_tools

    text = '<tool_call>\n{"name": "get_weather\n{"name": "get_time", "arguments": {"city": "Oslo\\x"}}'
    history = call_history([*ASKED, {"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}],
                           read_tools([WEATHER, TIME], "required"), HERMES)
    assert history.calls == ()
