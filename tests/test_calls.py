"""Call-aware drafting (drafting/calls.py): where a call's text stands, what the source proposes at
a field given the conversation, nothing where nothing matches; and on smollm2, values tokenized
under the real grammar, and a tool conversation whose repeated value the source drafts, with text
identical to plain's."""

import json

import pytest

import harness
from harness import SMOLLM2

from specgen.app.config import RunConfig
from specgen.app.prompts import Message, Prompt
from specgen.app.structured import GENERIC, call_history, read_tools
from specgen.drafting.calls import SAME, TEXT, CallHistory, CallRecord, CallSource, entities
from specgen.drafting.calls import candidates as found
from specgen.drafting.jsonfield import ARGUMENT, NAME, Field, FieldScanner

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def candidates(history, where, answer):
    return [c.text for c in found(history, where, answer)]


def field_at(text):
    scanner = FieldScanner()
    scanner.feed(text)
    return scanner.field()


def test_the_scanner_names_the_function_the_argument_and_the_value_so_far():
    generic = '{"tool_call": {"name": "get_weather", "arguments": {"city":'
    assert field_at(generic) == Field(ARGUMENT, "get_weather", ("city",), "")
    assert field_at(generic + ' "San Fr') == Field(ARGUMENT, "get_weather", ("city",), '"San Fr')
    hermes = '<tool_call>\n{"name": "book", "arguments": {"guests": [{"name": "Ada"}, {"name": "Gr'
    assert field_at(hermes) == Field(ARGUMENT, "book", ("guests", "[]", "name"), '"Gr')  # an argument called name
    assert field_at('<tool_call>\n{"name": "ge') == Field(NAME, None, (), '"ge')
    assert field_at(generic + ' "Oslo", ') is None  # a key comes next, not a value
    assert field_at('{"response": "It is') is None  # no call


def test_earlier_calls_of_the_same_function_and_key_come_first():
    history = CallHistory(calls=(("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"city": "Rome"}),
                                 ("get_weather", {"city": "Oslo", "unit": "celsius"})),
                          texts=("What about Lisbon?",))
    at_city = Field(ARGUMENT, "get_weather", ("city",), "")
    assert candidates(history, at_city, "")[:4] == ['"Oslo"', '"Paris"', '"Rome"', '"Lisbon"']
    assert candidates(history, Field(ARGUMENT, "get_time", ("city",), '"P'), "") == ['"Paris"']
    assert candidates(history, Field(NAME, None, (), '"'), "") == ['"get_weather"', '"get_time"']


def test_values_come_from_the_conversation_and_tool_results():
    history = CallHistory(texts=("Find Jonas Berg's orders, and email jonas@example.com.",
                                 '{"customer_id": "C-1042", "plan": "pro"}'),
                          tool_results=('{"customer_id": "C-1042", "plan": "pro"}',))
    assert candidates(history, Field(ARGUMENT, "orders", ("id",), ""), "")[0] == '"C-1042"'  # id <- customer_id
    assert candidates(history, Field(ARGUMENT, "send", ("to",), '"jon'), "") == ['"jonas@example.com"']
    assert '"Jonas Berg"' in candidates(history, Field(ARGUMENT, "send", ("who",), '"'), "")
    assert entities("Flights from Amsterdam (AMS) on 2027-06-12 for 2.") == [
        "Amsterdam", "AMS", "2027-06-12", 2, "2"]


def test_nothing_is_proposed_where_no_history_matches():
    history = CallHistory(calls=(("get_weather", {"city": "Paris"}),), texts=("weather please",))
    assert candidates(history, Field(ARGUMENT, "get_weather", ("city",), '"Ber'), "") == []
    assert candidates(CallHistory(), Field(ARGUMENT, "get_weather", ("city",), ""), "") == []
    assert candidates(CallHistory(), Field(NAME, None, (), '"'), "") == []


def test_a_tier_is_drafted_while_its_values_are_taken_often_enough_to_pay_for_their_rows():
    record = CallRecord(cost=lambda b: 0.006 + 0.002 * (b - 1))  # a drafted token: a third of a plain step
    assert record.pays(SAME, 8) and record.pays(TEXT, 8)
    for _ in range(6):
        record.observe(TEXT, False)
    assert not record.pays(TEXT, 8) and record.pays(SAME, 8)  # the words stop; earlier calls go on
    for _ in range(12):
        record.observe(TEXT, True)
    assert record.pays(TEXT, 8)
    assert CallRecord().pays(TEXT, 1) and not CallRecord().pays(SAME, 0)  # no curve: always, when there is a chain


def test_the_history_reads_structured_calls_and_calls_written_as_text():
    tools = read_tools([WEATHER, TIME], "auto")
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "get_weather",
                                                                 "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "a", "content": '{"temp": 18}'},
                {"role": "assistant", "content": '{"tool_call": {"name": "get_time", "arguments": {"city": "Rome"}}}'}]
    history = call_history(messages, tools, GENERIC)
    assert history.calls == (("get_weather", {"city": "Paris"}), ("get_time", {"city": "Rome"}))
    assert history.texts == ("Weather in Paris?", '{"temp": 18}') and history.tool_results == ('{"temp": 18}',)


# -- on smollm2 -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def session():
    return harness.session(SMOLLM2, None)


@pytest.mark.real
def test_a_value_is_drafted_with_the_key_the_grammar_forces_after_it(session):
    from specgen.app.structured import tool_constraint

    target = session.target
    tools = read_tools([WEATHER], "required")
    constraint = target.constrain(tool_constraint(tools, GENERIC))
    history = CallHistory(calls=(("get_weather", {"city": "San Francisco", "unit": "celsius"}),))
    source = CallSource(history, lambda t: target.tokenize(t, add_special=False), target.piece)
    written = target.tokenize('{"tool_call": {"name": "get_weather", "arguments": {"city":', add_special=False)
    for t in written[:3]:
        constraint.consume(t)
    source.observe(written[:3])
    assert source.chains(constraint, [], 16) == []  # not at a field yet
    for t in written[3:]:
        constraint.consume(t)
    source.observe(written[3:])
    chains = source.chains(constraint, [], 24)
    text = b"".join(target.piece(t) for t in chains[0]).decode()
    assert text == ' "San Francisco", "unit": "celsius"}}}'  # the value, the next key, the next value
    assert constraint.valid_prefix(chains[0]) == len(chains[0])


@pytest.mark.real
def test_a_repeated_argument_is_drafted_and_the_text_is_plains(session):
    from specgen.app.runner import Runner

    tools = read_tools([WEATHER, TIME], "required")
    first = {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "San Francisco", "unit": "celsius"})}}
    history = (Message("user", "What's the weather in San Francisco, in celsius?"),
               Message("assistant", None, tool_calls=(first,)),
               Message("tool", "18 C, sunny", tool_call_id="c1"),
               Message("assistant", "It is 18 C and sunny in San Francisco."))
    prompt = Prompt(0, "And what time is it there?", history, tools=tools)
    out = {}
    for method in ("plain", "auto"):
        runner = Runner(RunConfig(target=SMOLLM2, draft=None, method=method, max_tokens=48, store=False), session)
        out[method] = runner.run(runner.ask(prompt))
    assert out["auto"].text == out["plain"].text
    assert '"city": "San Francisco"' in out["plain"].text
    stats = out["auto"].stats
    assert stats.accepted_by["call"] >= 2 and stats.choices["call"] >= 1
    assert stats.target_calls < out["plain"].stats.target_calls
    # Sampled, the values are deterministic nodes beside the grammar's (verified by rejection
    # sampling as lookup's are): every committed token is one the grammar allows.
    from specgen.core.engine import TokenEvent

    sampled = Runner(RunConfig(target=SMOLLM2, draft=None, method="auto", max_tokens=32, store=False,
                               temperature=0.7, seed=3), session)
    tokens = [e.token for e in sampled.stream(sampled.ask(prompt)) if isinstance(e, TokenEvent)]
    assert session.target.constrain(sampled.constraint_for(prompt)).valid_prefix(tokens) == len(tokens) > 20
