import io
import json

import pytest

from specgen.errors import PromptError
from specgen.app.prompts import Prompt, collect_prompts, parse_prompt_file


class FakeStdin(io.StringIO):
    def __init__(self, text="", tty=False):
        super().__init__(text)
        self.buffer = io.BytesIO(text.encode())
        self._tty = tty

    def isatty(self):
        return self._tty


def texts(prompts):
    return [p.text for p in prompts]


def test_argument_wins_and_dash_reads_stdin():
    assert texts(collect_prompts("hi", None, FakeStdin("ignored"))) == ["hi"]
    assert texts(collect_prompts("-", None, FakeStdin("from stdin\n"))) == ["from stdin"]
    assert texts(collect_prompts(None, None, FakeStdin("piped\n"))) == ["piped"]


def test_no_prompt_on_terminal_or_without_stdin():
    for stdin in (FakeStdin(tty=True), None):
        with pytest.raises(PromptError, match="no prompt: expected PROMPT"):
            collect_prompts(None, None, stdin)


def test_empty_prompts_rejected():
    with pytest.raises(PromptError, match="empty prompt on PROMPT"):
        collect_prompts("   ", None, None)
    with pytest.raises(PromptError, match="empty prompt on stdin"):
        collect_prompts("-", None, FakeStdin("\n\n"))


def test_txt_one_per_line_skipping_blanks(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("one\n\n  \ntwo\n")
    assert [(p.index, p.text) for p in collect_prompts(None, f, None)] == [(0, "one"), (1, "two")]


def test_jsonl_prompt_and_spec_bench_turns(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "a"}) + "\n\n" + json.dumps({"turns": ["b", "c"]}) + "\n")
    assert texts(parse_prompt_file(f)) == ["a", "b"]


def test_jsonl_errors_name_the_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "a"}) + "\n{oops\n")
    with pytest.raises(PromptError, match=r"p.jsonl line 2: not valid JSON"):
        parse_prompt_file(f)
    f.write_text(json.dumps({"text": "a"}) + "\n")
    with pytest.raises(PromptError, match=r"line 1: expected an object with \"prompt\""):
        parse_prompt_file(f)


def test_file_errors(tmp_path):
    with pytest.raises(PromptError, match="prompt file not found"):
        parse_prompt_file(tmp_path / "missing.txt")
    empty = tmp_path / "e.txt"
    empty.write_text("\n\n")
    with pytest.raises(PromptError, match="has no prompts"):
        parse_prompt_file(empty)
    latin = tmp_path / "l.txt"
    latin.write_bytes(b"ok\ncaf\xe9\n")
    with pytest.raises(PromptError, match="expected UTF-8 text, found byte 0xe9 on line 2"):
        parse_prompt_file(latin)
    with pytest.raises(PromptError, match="either PROMPT or -f"):
        collect_prompts("x", latin, None)


def test_a_next_turn_keeps_the_constraint_and_tools():
    from specgen.app.structured import read_tools
    from specgen.core.constraint import ConstraintSpec

    spec = ConstraintSpec("json_object")
    tools = read_tools([{"type": "function", "function": {"name": "f"}}], "auto")
    nxt = Prompt(0, "first", constraint=spec, tools=tools).followed_by("{}", "second")
    assert (nxt.text, nxt.constraint, nxt.tools) == ("second", spec, tools)
    assert [m["role"] for m in nxt.messages()] == ["user", "assistant", "user"]
