"""One reader decides what a tool answer holds (app/callstream.py), streamed or read whole
(structured.parse_answer): a call only to an offered function, with an object of arguments, one
unless parallel; a text cut anywhere (max_tokens, a stop string) reads the same both ways, a cut
call as written, a cut text answer as its decoded text. The server's side: test_structured_serve."""

import json

import pytest

from specgen.app.callstream import CallArguments, CallHead, CallStream
from specgen.app.structured import GENERIC, HERMES, Tools, parse_answer

TOOLS = Tools(({"name": "get_weather", "description": "", "parameters": {}},
               {"name": "get_time", "description": "", "parameters": {}}))
ONE = Tools(TOOLS.functions, parallel=False)


def block(obj: dict) -> str:
    return "<tool_call>\n" + json.dumps(obj, ensure_ascii=False) + "\n</tool_call>"


WEATHER = {"name": "get_weather", "arguments": {"city": "Oslo \"Fjord\" \u2603"}}
TIME = {"name": "get_time", "arguments": {"city": "Paris", "hours24": True}}
ANSWERS = [
    (GENERIC, json.dumps({"tool_call": WEATHER})),
    (GENERIC, json.dumps({"response": "It is \"sunny\" in Oslo \u2603 \\ caf\u00e9\nbye"}, ensure_ascii=False)),
    (HERMES, block(WEATHER) + "\n" + block(TIME)),
    (HERMES, "  Plain words, a {brace} and <b>tags</b>.\n\n"),
]
UNKNOWN = {"name": "delete_all_files", "arguments": {"path": "/"}}
REFUSED = [  # never a call: a name not offered, arguments not an object, a second call without parallel
    (GENERIC, json.dumps({"tool_call": UNKNOWN}), TOOLS, []),
    (GENERIC, json.dumps({"tool_call": {"name": "get_time", "arguments": ["Oslo"]}}), TOOLS, []),
    (HERMES, block(UNKNOWN), TOOLS, []),
    (HERMES, block({"name": "get_time", "arguments": "Oslo"}), TOOLS, []),
    (HERMES, block(TIME) + "\n" + block(UNKNOWN), TOOLS, ["get_time"]),
    (HERMES, block(TIME) + "\n" + block(WEATHER), ONE, ["get_time"]),
]


def read(fmt: str, text: str, tools: Tools, step: int = 1) -> tuple[str | None, list, list]:
    """Stream `text` grown `step` characters at a time, then end it: the content and calls its
    fragments join into, and every head shown."""
    stream, content, calls, heads = CallStream(fmt, tools), "", {}, []
    deltas = [stream.feed(text[:end]) for end in range(0, len(text), step)] + [stream.finish(text)]
    for delta in deltas:
        content += delta.content
        for f in delta.calls:
            if isinstance(f, CallHead):
                heads.append(f.name)
                calls[f.index] = [f.name, ""]
            else:
                assert isinstance(f, CallArguments)
                calls[f.index][1] += f.text
    answer = stream.answer()
    assert (content or None) == answer.content and [list(c) for _, c in sorted(calls.items())] == \
        [[c.name, c.arguments] for c in answer.calls], "the stream's fragments are its answer"
    return content or None, [tuple(c) for _, c in sorted(calls.items())], heads


def whole(fmt: str, text: str, tools: Tools) -> tuple[str | None, list]:
    answer = parse_answer(text, fmt, tools)
    return answer.content, [(c.name, c.arguments) for c in answer.calls]


@pytest.mark.parametrize("fmt,text,tools,heads", REFUSED)
def test_a_streamed_head_is_checked_as_the_whole_answer_checks_it(fmt, text, tools, heads):
    """Today's stream showed a head for any name as soon as it was written; the whole reply then
    took the stream's calls. A refused call is never shown: the text stays content, both ways."""
    content, calls, shown = read(fmt, text, tools)
    assert shown == heads and (content, calls) == whole(fmt, text, tools)
    assert content == text[len(block(TIME)) if heads else 0:].strip()  # the refused call's text


@pytest.mark.parametrize("fmt,text", ANSWERS)
def test_every_cut_reads_the_same_streamed_and_whole(fmt, text):
    """Cut at every character (max_tokens or a stop string can end the text anywhere), streamed in
    pieces of 1 or 5 characters: the same content and calls as the whole reader reads the cut text."""
    for cut in range(len(text) + 1):
        for step in (1, 5):
            content, calls, _ = read(fmt, text[:cut], TOOLS, step)
            assert (content, calls) == whole(fmt, text[:cut], TOOLS), (cut, step)


def test_a_cut_text_answer_is_its_decoded_text():
    """Not `{"response": "It is \\"sun` as content: the text so far, as the stream shows it."""
    text = json.dumps({"response": "It is \"sunny\" in Oslo \u2603"})
    for cut in range(len('{"response": "'), len(text)):
        content, _ = whole(GENERIC, text[:cut], TOOLS)
        assert "It is \"sunny\" in Oslo \u2603".startswith(content or ""), text[:cut]
    assert whole(GENERIC, text[:text.index("sunny") + 3], TOOLS) == ('It is "sun', [])


def test_a_cut_call_is_the_call_as_written():
    """Cut inside its arguments: the call, its arguments so far (not JSON yet), both ways."""
    text = block(TIME)
    cut = text.index("Paris") + 2
    assert whole(HERMES, text[:cut], TOOLS) == (None, [("get_time", '{"city": "Pa')])
    text = json.dumps({"tool_call": TIME})
    assert whole(GENERIC, text[:text.index("Paris") + 2], TOOLS) == (None, [("get_time", '{"city": "Pa')])
    assert whole(GENERIC, '{"tool_call": {"na', TOOLS) == ('{"tool_call": {"na', [])  # no call begun: the text


def test_a_head_waits_for_its_arguments_to_open():
    """The head is shown once the call is known to be one: its name offered and whole, and its
    arguments begun as an object; then the arguments as they are written."""
    text = json.dumps({"tool_call": TIME})
    stream = CallStream(GENERIC, TOOLS)
    brace = text.index("{", text.index('"arguments"'))
    assert not stream.feed(text[:brace]).calls
    head = CallHead(0, stream.calls[0].id, "get_time")
    assert stream.feed(text[:brace + 1]).calls == (head, CallArguments(0, "{"))
