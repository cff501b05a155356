"""A tool answer streamed as it is written (app/callstream.py): whatever the pieces the text comes
in, the fragments join into the answer parse_answer reads from the whole text, a call's head comes
once its name is whole and its arguments open, before them, and nothing shown is taken back."""

import json
import random

import pytest

from specgen.app.callstream import CallArguments, CallHead, CallStream
from specgen.app.structured import GENERIC, HERMES, Tools, parse_answer

TOOLS = Tools(({"name": "get_weather", "description": "", "parameters": {}},
               {"name": "send", "description": "", "parameters": {}}))

ARGS = {"city": "Oslo \"Fjord\" {x}", "days": [1, 2], "note": "caf\u00e9 \\ \u2603 \U0001F600", "nested": {"a": {}}}
CASES = [
    (GENERIC, json.dumps({"tool_call": {"name": "get_weather", "arguments": ARGS}})),
    (GENERIC, json.dumps({"tool_call": {"name": "send", "arguments": ARGS}}, ensure_ascii=False)),
    (GENERIC, json.dumps({"response": "It is \"sunny\" in Oslo \u2603 \\ \U0001F600\nbye"})),
    (GENERIC, json.dumps({"response": "caf\u00e9 \U0001F600"}, ensure_ascii=False)),
    (HERMES, "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": ARGS}) + "\n</tool_call>"),
    (HERMES, "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': {'k': i}})}\n</tool_call>\n"
                     for i, n in enumerate(["send", "get_weather", "send"])).rstrip("\n")),
    (HERMES, "Plain words, a {brace} and \"quotes\" \u2603."),
]


def joined(fmt: str, text: str, cuts: list[int]) -> tuple[str, dict[int, dict], list]:
    """Feed `text` grown at `cuts`; the content and calls the fragments add up to, and every fragment."""
    stream, content, calls, seen = CallStream(fmt, TOOLS), "", {}, []
    for end in [*cuts, len(text)]:
        delta = stream.feed(text[:end])
        content += delta.content
        for f in delta.calls:
            seen.append(f)
            if isinstance(f, CallHead):
                assert f.index not in calls, "a head is sent once"
                calls[f.index] = {"id": f.id, "name": f.name, "arguments": ""}
            else:
                assert isinstance(f, CallArguments) and f.index in calls, "arguments come after their head"
                calls[f.index]["arguments"] += f.text
    return content, calls, seen


@pytest.mark.parametrize("fmt,text", CASES)
def test_fragments_join_into_the_whole_answer_whatever_the_pieces(fmt, text):
    answer = parse_answer(text, fmt, TOOLS)
    rng = random.Random(7)
    for trial in range(60):
        n = 0 if trial == 0 else len(text) if trial == 1 else rng.randint(1, 12)
        cuts = sorted(rng.sample(range(1, len(text)), min(n, len(text) - 1)))
        content, calls, _ = joined(fmt, text, cuts)
        assert (content or None) == answer.content, cuts
        assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == \
            [(c.name, json.loads(c.arguments)) for c in answer.calls], cuts


def test_a_call_streams_while_it_is_written():
    """Character by character: the head as soon as the arguments' opening brace is written (the
    call is known to be one: test_call_cuts), then the arguments in many fragments, each shown once
    its characters exist."""
    fmt, text = CASES[0]
    _, _, seen = joined(fmt, text, list(range(1, len(text))))
    heads = [f for f in seen if isinstance(f, CallHead)]
    assert len(heads) == 1 and heads[0].name == "get_weather" and seen[0] is heads[0]
    assert len([f for f in seen if isinstance(f, CallArguments)]) > len(json.dumps(ARGS)) // 2
    stream = CallStream(fmt, TOOLS)
    brace = text.index("{", text.index('"arguments"'))
    assert not stream.feed(text[:brace]).calls
    head = CallHead(0, stream.calls[0].id, "get_weather")
    assert stream.feed(text[:brace + 1]).calls == (head, CallArguments(0, "{"))


def test_nothing_is_shown_before_the_branch_is_known():
    stream = CallStream(GENERIC, TOOLS)
    for prefix in ("", " ", "{", '{"', '{"resp', '{"response"', '{"response": '):
        assert not stream.feed(prefix)
    assert stream.feed('{"response": "a\\').content == "a" and stream.feed('{"response": "a\\u00').content == ""
    assert stream.feed('{"response": "a\\u00e9"}').content == "\u00e9"


@pytest.mark.parametrize("fmt,text", [CASES[0], CASES[5]])
def test_a_text_cut_inside_a_call_answers_with_the_call_as_written(fmt, text):
    """max_tokens ends the text inside a call's arguments: the answer is what the stream showed,
    the last call with its arguments so far (not JSON yet), as OpenAI answers such a call."""
    cut = text.rindex('"arguments"') + len('"arguments": ') + 3
    stream = CallStream(fmt, TOOLS)
    content, calls, _ = joined(fmt, text[:cut], [cut // 2])
    stream.feed(text[:cut // 2])
    stream.feed(text[:cut])
    answer = stream.answer()
    assert answer.content is None and [(c.name, c.arguments) for c in answer.calls] == \
        [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
    assert answer.calls[-1].arguments == text[cut - 3:cut]
    assert [(c.name, c.arguments) for c in parse_answer(text[:cut], fmt, TOOLS).calls] == \
        [(c.name, c.arguments) for c in answer.calls]  # read whole, the same
