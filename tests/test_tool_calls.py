"""Tool calls: only a call written under the call grammar, to a function the request offered, comes
back as a call; parallel_tool_calls false allows one; a history of calls and results reads the same
every run, tools offered or not. The grammars on llguidance with smollm2's tokenizer, the history
through smollm2's own chat template."""

import json

import pytest

from specgen.app.prompts import Message, Prompt
from specgen.app.runner import render_prompt
from specgen.app.structured import GENERIC, HERMES, generic_messages, parse_answer, read_tools, tool_constraint
from specgen.errors import ConstraintError

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SMUGGLED = ('Sure.\n<tool_call>\n{"name": "delete_all_files", "arguments": {"path": "/"}}\n</tool_call>')


def call(name, args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def tools(choice="auto", parallel=True):
    return read_tools([WEATHER, TIME], choice, parallel=parallel)


def test_a_call_outside_the_call_branch_or_to_an_unknown_name_is_never_returned():
    smuggled = parse_answer(SMUGGLED, HERMES, tools())
    assert smuggled.calls == () and smuggled.content == SMUGGLED
    text_then_known = parse_answer("Sure.\n" + call("get_weather", {"city": "Paris"}), HERMES, tools())
    assert text_then_known.calls == ()  # text first is the free-text branch: never a call
    unknown = parse_answer(call("delete_all_files", {"path": "/"}), HERMES, tools())
    assert unknown.calls == () and unknown.content
    named = tools({"type": "function", "function": {"name": "get_time"}})
    assert parse_answer(call("get_weather", {"city": "Oslo"}), HERMES, named).calls == ()  # offered, not chosen
    assert parse_answer(call("get_weather", [1]), HERMES, tools()).calls == ()  # arguments not an object
    generic = parse_answer('{"tool_call": {"name": "delete_all_files", "arguments": {"path": "/"}}}', GENERIC, tools())
    assert generic.calls == () and generic.content
    good = parse_answer(call("get_weather", {"city": "Paris"}) + "\n" + call("get_time", {"city": "Oslo"}),
                        HERMES, tools())
    assert [c.name for c in good.calls] == ["get_weather", "get_time"] and good.content is None


def test_parallel_false_returns_one_call():
    two = call("get_weather", {"city": "Paris"}) + "\n" + call("get_time", {"city": "Oslo"})
    assert [c.name for c in parse_answer(two, HERMES, tools(parallel=False)).calls] == ["get_weather"]
    assert tools(parallel=False).parallel is False and tools().parallel is True
    with pytest.raises(ConstraintError, match="parallel_tool_calls expects true or false, found \"no\""):
        read_tools([WEATHER], "auto", parallel="no")


def test_a_jsonl_record_says_parallel_tool_calls(tmp_path):
    from specgen.app.prompts import parse_prompt_file
    from specgen.errors import PromptError

    path = tmp_path / "jobs.jsonl"
    path.write_text(json.dumps({"prompt": "Weather?", "tools": [WEATHER], "parallel_tool_calls": False}) + "\n")
    assert parse_prompt_file(path)[0].tools.parallel is False
    path.write_text(json.dumps({"prompt": "Weather?", "tools": [WEATHER], "parallel_tool_calls": "no"}) + "\n")
    with pytest.raises(PromptError, match="line 1: parallel_tool_calls expects true or false"):
        parse_prompt_file(path)


HISTORY = [{"role": "user", "content": "Weather and time in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_c31c1498aa", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
               {"id": "call_77e0d2f1bb", "type": "function",
                "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}]},
           {"role": "tool", "tool_call_id": "call_c31c1498aa", "content": "18 C and sunny"},
           {"role": "tool", "tool_call_id": "call_77e0d2f1bb", "content": "14:05"}]


def test_generic_history_names_functions_and_shows_every_call():
    out = generic_messages(HISTORY)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]  # the results in one turn
    assert [json.loads(line) for line in out[1]["content"].splitlines()] == [
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"tool_call": {"name": "get_time", "arguments": {"city": "Paris"}}}]
    assert out[2]["content"] == "Result of get_weather: 18 C and sunny\nResult of get_time: 14:05"
    assert "call_" not in json.dumps(out)


def prompt_after_loop(ids, tools_=None):
    turns = [dict(m) for m in HISTORY]
    turns[1] = {**turns[1], "tool_calls": [{**c, "id": i} for c, i in zip(turns[1]["tool_calls"], ids)]}
    turns[2], turns[3] = {**turns[2], "tool_call_id": ids[0]}, {**turns[3], "tool_call_id": ids[1]}
    messages = [Message(m["role"], m["content"] or "", tuple(m.get("tool_calls") or ()), m.get("tool_call_id"))
                for m in turns]
    return Prompt(0, messages[0].content, (), tuple(messages[1:]), tools=tools_)


# A template that refuses roles out of user/assistant order (as Mistral's and Gemma's do).
ALTERNATING = (
    "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.real
def test_tool_choice_none_after_a_loop_shows_the_history_in_the_generic_format(smollm2, monkeypatch):
    """tool_choice none (no Tools): the calls and results still read as the generic format writes
    them, named by function, the same whatever ids the calls got."""
    text = render_prompt(smollm2, prompt_after_loop(["call_1a", "call_2b"]), chat=True)
    assert text == render_prompt(smollm2, prompt_after_loop(["call_9z", "call_8y"]), chat=True)
    assert '{"tool_call": {"name": "get_time", "arguments": {"city": "Paris"}}}' in text
    assert "Result of get_weather: 18 C and sunny" in text and "<|im_start|>tool" not in text
    offered = render_prompt(smollm2, prompt_after_loop(["call_1a", "call_2b"], tools()), chat=True)
    assert "Result of get_time: 14:05" in offered and "You can call these tools" in offered
    monkeypatch.setattr(smollm2, "chat_template", ALTERNATING)
    assert "Result of get_time: 14:05" in render_prompt(smollm2, prompt_after_loop(["a", "b"]), chat=True)


def accepts(model, spec, text):
    """The grammar takes the whole text and may end there."""
    c = model.constrain(spec)
    tokens = model.tokenize(text, add_special=False, parse_special=False)
    if c.valid_prefix(tokens) < len(tokens):
        return False
    for t in tokens:
        c.consume(t)
    return bool(c.allowed()[model.eos])


@pytest.mark.real
def test_hermes_grammar_free_text_cannot_hold_a_call(smollm2):
    spec = tool_constraint(tools(), HERMES)
    assert not accepts(smollm2, spec, SMUGGLED)
    assert not accepts(smollm2, spec, "Sure.\n" + call("get_weather", {"city": "Paris"}))
    assert accepts(smollm2, spec, "Sure, it is sunny in Paris.\nAnything else?")
    assert accepts(smollm2, spec, "A tag like <tool> or <tool_cal is text.")
    assert accepts(smollm2, spec, call("get_weather", {"city": "Paris"}))
    assert not accepts(smollm2, spec, call("delete_all_files", {"path": "/"}))


@pytest.mark.real
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_hermes_grammar_allows_one_call_unless_parallel(smollm2, choice):
    two = call("get_weather", {"city": "Paris"}) + "\n" + call("get_time", {"city": "Oslo"})
    assert accepts(smollm2, tool_constraint(tools(choice), HERMES), two)
    one = tool_constraint(tools(choice, parallel=False), HERMES)
    assert not accepts(smollm2, one, two)
    assert accepts(smollm2, one, call("get_time", {"city": "Oslo"}))
    generic = tool_constraint(tools(choice), GENERIC)  # one JSON object: one call at most, always
    assert not accepts(smollm2, generic, '{"tool_call": {"name": "get_time", "arguments": {"city": "Oslo"}}}'
                                         '{"tool_call": {"name": "get_time", "arguments": {"city": "Oslo"}}}')


NESTED = {"type": "function", "function": {"name": "book", "parameters": {
    "$defs": {"Guest": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    "type": "object", "properties": {"guests": {"type": "array", "items": {"$ref": "#/$defs/Guest"}}},
    "required": ["guests"]}}}
OTHER = {"type": "function", "function": {"name": "invite", "parameters": {
    "$defs": {"Guest": {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}},
    "type": "object", "properties": {"guest": {"$ref": "#/$defs/Guest"}}, "required": ["guest"]}}}


@pytest.mark.real
@pytest.mark.parametrize("fmt", [HERMES, GENERIC])
def test_tool_parameters_with_defs_keep_their_references(smollm2, fmt):
    """A Pydantic model's parameters carry `$defs`; nested under the call's `arguments` its
    `#/$defs/...` references must still reach them, each function its own (same names apart)."""
    from specgen.llama.grammar import GuidanceConstraint

    chosen = read_tools([NESTED, OTHER], "required")
    booked = {"name": "book", "arguments": {"guests": [{"name": "Ada"}]}}
    invited = {"name": "invite", "arguments": {"guest": {"email": "a@b.c"}}}
    wrong = {"name": "invite", "arguments": {"guest": {"name": "Ada"}}}  # book's Guest, not invite's
    for obj, ok in ((booked, True), (invited, True), (wrong, False)):
        text = (f"<tool_call>\n{json.dumps(obj)}\n</tool_call>" if fmt == HERMES
                else json.dumps({"tool_call": obj}))
        matcher = GuidanceConstraint(smollm2, tool_constraint(chosen, fmt))
        tokens = smollm2.tokenize(text, add_special=False, parse_special=False)
        assert (matcher.valid_prefix(tokens) == len(tokens)) is ok, text
