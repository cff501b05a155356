"""`specgen bench --suite agent`: the suite file, the schema check of calls, and one small real run
through real specgen servers (2 conversations x 2 turns) checking the bench's contract."""

import json
from pathlib import Path
import subprocess
import sys

import pytest

from specgen.app.structured import GENERIC, HERMES, read_tools, tool_constraint
from specgen.bench import published
from specgen.bench.agent import BASELINE
from specgen.bench.agent_suite import call_valid, fits, load_agent_suite, tool_result
from specgen.drafting.methods import JUMP

SMOLLM2 = "smollm2-135m-instruct-q4_1"
CACHED = ("plain", JUMP, "auto")


def _walk(schema):
    yield schema
    for sub in (schema.get("properties") or {}).values():
        yield from _walk(sub)
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"])


def test_agent_suite_records_are_well_formed():
    """16+ conversations of 4+ turns (8+ in the report half), tools that read as OpenAI's and whose
    call grammars build, enums in every conversation, arrays and nested objects in most, a result
    for every function."""
    convs, report = load_agent_suite("all"), load_agent_suite("report")
    assert len(convs) >= 16 and len(report) >= 8 and len({c.prompt_id for c in convs}) == len(convs)
    with_arrays = with_nested = 0
    for c in convs:
        assert len(c.turns) >= 4 and c.system
        tools = read_tools(list(c.tools), "required")
        for fmt in (GENERIC, HERMES):
            assert tool_constraint(tools, fmt).kind in ("json_schema", "lark")
        inner = [n for t in c.tools for n in list(_walk(t["function"]["parameters"]))[1:]]  # below the top
        assert any("enum" in n for n in inner), c.prompt_id
        with_arrays += any(n.get("type") == "array" for n in inner)
        with_nested += any(n.get("type") == "object" for n in inner)
        for name in tools.names():
            json.loads(tool_result(c, name, "{}"))  # a result even for a call without arguments
    assert with_arrays >= 12 and with_nested >= 12


def test_tool_results_are_filled_from_the_call():
    conv = next(c for c in load_agent_suite("all") if "get_forecast" in c.results)
    result = json.loads(tool_result(conv, "get_forecast", json.dumps({"city": "Bergen", "country": "Norway",
                                                                      "days": 3, "units": "metric"})))
    assert result["city"] == "Bergen" and result["units"] == "metric"
    assert json.loads(tool_result(conv, "nope", "{}")) == {"error": "no tool named nope"}


def test_calls_are_checked_against_the_closed_schema():
    conv = next(c for c in load_agent_suite("all") if "get_forecast" in c.results)
    good = {"city": "Bergen", "country": "Norway", "days": 3, "units": "metric"}
    assert call_valid(conv, "get_forecast", json.dumps(good))
    assert not call_valid(conv, "get_forecast", json.dumps({**good, "units": "kelvin"}))  # enum
    assert not call_valid(conv, "get_forecast", json.dumps({**good, "days": 9}))  # maximum
    assert not call_valid(conv, "get_forecast", json.dumps({**good, "extra": 1}))  # closed
    assert not call_valid(conv, "get_forecast", json.dumps({"city": "Bergen"}))  # required
    assert not call_valid(conv, "get_forecast", "{not json")
    assert not call_valid(conv, "book_hotel", json.dumps(good))  # not one of this conversation's tools
    assert fits({"type": "array", "items": {"type": "integer"}}, [1, 2]) and not fits({"type": "integer"}, True)


def test_agent_suite_refuses_options_it_would_ignore():
    r = subprocess.run([sys.executable, "-m", "specgen", "bench", "--suite", "agent", "-m", SMOLLM2,
                        "--methods", "lookup"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "found --methods" in r.stderr and "Traceback" not in r.stderr


def test_llama_cpp_template_goes_to_llama_server_only(tmp_path):
    """--llama-cpp-template is llama-server's --chat-template-file: refused without --llama-cpp,
    refused outside the agent suite, and a missing file is named."""
    from specgen.bench.agent import llama_server_rows

    tpl = tmp_path / "tools.jinja"
    tpl.write_text("{{ messages }}")
    rows = llama_server_rows(Path("/bin/llama-server"), Path("m.gguf"), 2, 4096, ["ngram-mod"], template=tpl)
    assert all(r.command[-2:] == ["--chat-template-file", str(tpl)] or "--spec-type" in r.command for r in rows)
    assert all(str(tpl) in r.command for r in rows)
    for extra, words in ((["--suite", "agent"], "give --llama-cpp DIR too"),
                         (["--llama-cpp", str(tmp_path)], "it goes with --suite agent, found --suite builtin")):
        r = subprocess.run([sys.executable, "-m", "specgen", "bench", "-m", SMOLLM2, "--llama-cpp-template", str(tpl),
                            *extra], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_several_runs_render_with_their_spread():
    """Two published runs in one block: each run's table, then each row's median and range across
    them, computed from the files' own summaries."""
    results = Path(__file__).parent.parent / "docs" / "results"
    files = [results / "2026-11-27-agent-report.json", results / "2026-11-27-agent-report-2.json"]
    text = published.render_files(files, results.parent)
    assert text.count("| row | loop s |") == 2 and "Across the 2 runs above" in text
    runs = [json.loads(f.read_text()) for f in files]
    auto = sorted(next(r["speedup"] for r in d["summary"] if r["row"] == "auto" and r["turn"] is None
                       and r["prompt_id"] is None) for d in runs)
    line = [x for x in text.splitlines() if x.startswith("| auto |")][-1]  # the across table comes last
    assert f"{sum(auto) / 2:.2f}x ({auto[0]:.2f}x-{auto[1]:.2f}x)" in line
    assert "Across" not in published.render_files(files[:1], results.parent)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    from specgen.cli.agentbench import run_agent_bench

    out = tmp_path_factory.mktemp("agent") / "agent.json"
    report = run_agent_bench(SMOLLM2, "report", 1, 64, None, None, None, out, None, None, None, turns=2,
                             answer_max_tokens=8)
    return report, out


@pytest.mark.real
def test_agent_bench_rows_replay_the_baseline_exactly(small_run):
    """Every row answered every request; plain with the cache, jump and auto wrote what the
    baseline (plain, no cache) wrote, their caches kept tokens on the later turn, and every call
    request was answered with a call that fits its tool's schema."""
    report, _ = small_run
    names = [BASELINE, *CACHED]
    assert report["settings"]["methods"] == names
    records = report["records"]
    assert len(records) == 1 * 2 * 2 * len(names)  # conversations x turns x (call, answer) x rows: calls made
    assert all(r["error"] is None for r in records)
    assert all(r["identical"] for r in records if r["row"] in CACHED)
    assert all(r["cache_n"] == 0 for r in records if r["row"] == BASELINE)
    for row in CACHED:
        assert sum(r["cache_n"] for r in records if r["row"] == row and r["turn"] == 2) > 0, row
    assert all(r["call_made"] for r in records if r["kind"] == "call"), [
        (r["row"], r["prompt_id"], r["turn"], r["content"]) for r in records if r["kind"] == "call" and not r["call_made"]]
    overall = {r["row"]: r for r in report["summary"] if r["turn"] is None and r["prompt_id"] is None}
    assert set(overall) == set(names) and overall[BASELINE]["speedup"] == 1.0


@pytest.mark.real
def test_agent_bench_file_renders_as_a_table(small_run):
    _, out = small_run
    text = published.render_files([out], out.parent)
    assert f"| {BASELINE} |" in text and "| auto |" in text and "turn 2" in text


def test_a_call_cut_by_max_tokens_is_not_run_and_goes_back_as_text():
    """A reference call cut by max_tokens (streamed as far as written): a framework cannot run it,
    so the turn ends; the history keeps it as text (a history's calls must be whole JSON: llama-server
    answers 500 to one that is not)."""
    from specgen.bench.agent_http import ChatCompletion

    cut = ChatCompletion(calls=[{"name": "get_forecast", "arguments": '{"city": "Ber'}], finish_reason="length")
    assert cut.runnable == [] and "tool_calls" not in cut.message()
    assert cut.message()["content"] == '{"name": "get_forecast", "arguments": {"city": "Ber'
    whole = ChatCompletion(calls=[{"name": "get_forecast", "arguments": '{"city": "Bergen"}'}],
                           finish_reason="tool_calls")
    assert whole.runnable == whole.calls and whole.message()["tool_calls"][0]["function"]["name"] == "get_forecast"


def test_tokens_new_to_each_request_leave_out_what_the_row_read_and_wrote_before():
    """A row whose reply was the baseline's held its prompt and that reply: only the rest is new; a row
    that wrote something else held its prompt alone (the history holds the baseline's reply)."""
    from specgen.bench.agent_summary import new_tokens, past_the_first, summarize

    def rec(row, conv, prompt_n, cache_n, wrote, identical=True, cut=False):
        return {"row": row, "prompt_id": conv, "prompt_n": prompt_n, "cache_n": cache_n, "completion_tokens": wrote,
                "identical": identical, "calls": [{"name": "f", "arguments": "{"}], "finish_reason": "length" if cut
                else "tool_calls"}

    records = [rec(BASELINE, "a", 100, 0, 20), rec("auto", "a", 100, 0, 20), rec("other", "a", 90, 10, 30, False),
               rec(BASELINE, "a", 150, 0, 5, cut=True), rec("auto", "a", 31, 119, 5, cut=True),
               rec("other", "a", 50, 100, 5, False), rec("auto", "a", 40, 130, 5),
               rec(BASELINE, "b", 80, 0, 5)]
    # a call cut short goes back as other text: the next request holds its prompt alone
    assert new_tokens(records) == [100, 100, 100, 30, 30, 50, 20, 80]
    full = [{**r, "turn": 1, "kind": "call", "wall_s": 1.0, "ttft_s": None, "decode_s": 1.0, "prompt_s": 0.1,
             "call_made": True, "error": None} for r in records]
    overall = {r.row: r for r in summarize(full, [BASELINE, "auto", "other"]) if r.turn is None and r.prompt_id is None}
    assert (overall["auto"].prompt_read, overall["auto"].prompt_new) == (171, 150)
    assert str(past_the_first(full, "auto")) == "71/50 (1.42x)"  # a conversation's first may share a head
