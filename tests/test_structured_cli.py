"""Constrained output from the command line: --json-schema (a file or inline), --grammar (GBNF),
--json-object, a .jsonl file of extraction and tool jobs, and one-line refusals."""

import json
import re

import jsonschema
import pytest

from clihelp import assert_one_line_error, specgen
from harness import SMOLLM2, TOO_WIDE

pytestmark = pytest.mark.real

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
ASK = "Extract the person as JSON: Ada Lovelace, aged 36."


def gen(*args, input=None):
    return specgen("generate", "-m", SMOLLM2, "-n", "48", *args, input=input)


def test_json_schema_file_and_inline_give_the_same_valid_answer(tmp_path):
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON))
    by_file = gen("--json-schema", str(path), ASK)
    inline = gen("--json-schema", json.dumps(PERSON), "--method", "plain", ASK)
    assert by_file.returncode == 0 and inline.returncode == 0, by_file.stderr + inline.stderr
    assert by_file.stdout == inline.stdout  # auto equals plain, both constrained
    jsonschema.validate(json.loads(by_file.stdout), PERSON)
    # The stats line counts the grammar's forced tokens apart: accepted/drafted.
    accepted, drafted = map(int, re.search(r"forced (\d+)/(\d+)", by_file.stderr).groups())
    assert 0 < accepted <= drafted


def test_grammar_and_json_object(tmp_path):
    gbnf = tmp_path / "yesno.gbnf"
    gbnf.write_text('root ::= ("yes" | "no") "."\n')
    proc = gen("--grammar", str(gbnf), "Is water wet?")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("yes.", "no.")
    proc = gen("--json-object", "-n", "24", ASK)
    assert proc.returncode == 0 and proc.stdout.lstrip().startswith("{")


def test_jsonl_jobs_with_response_format_and_tools(tmp_path):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": ASK, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}},
        {"messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": [weather], "tool_choice": "required"},
        {"prompt": "Name a colour."},
    ]) + "\n")
    proc = gen("-f", str(jobs), "--json")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    jsonschema.validate(json.loads(records[0]["text"]), PERSON)
    assert records[1]["tool_calls"][0]["function"]["name"] == "get_weather" and records[1]["content"] is None
    assert "tool_calls" not in records[2]


@pytest.mark.parametrize("args,words", [
    (["--json-schema", "{not json"], "--json-schema expects JSON"),
    (["--json-schema", "/nonexistent/schema.json"], "--json-schema expects a readable file"),
    (["--json-object", "--grammar", "x.gbnf"], "expected one of --json-schema, --grammar, --json-object"),
    (["--grammar", "BAD"], "--grammar expects a readable file"),
])
def test_bad_constraint_options_are_one_line(args, words):
    assert_one_line_error(gen(*args, ASK), words)


def test_a_schema_that_is_not_an_object_names_the_option_not_an_openai_field(tmp_path):
    # The CLI's schema used to travel inside a made-up OpenAI body, and its refusal named the body's
    # field (response_format.json_schema.schema), which no CLI user wrote.
    from specgen.cli.options import constraint_option
    from specgen.errors import SpecgenError

    path = tmp_path / "schema.json"
    path.write_text("[1, 2]")
    with pytest.raises(SpecgenError) as refused:
        constraint_option(str(path), None, False)
    assert str(refused.value).startswith("--json-schema expects a JSON Schema object, found [1, 2]")


def test_grammar_the_compiler_refuses_is_one_line(tmp_path):
    gbnf = tmp_path / "bad.gbnf"
    gbnf.write_text("root ::= missing_rule\n")
    assert_one_line_error(gen("-d", "none", "--grammar", str(gbnf), ASK), "gbnf grammar")


def test_a_refused_schema_in_a_file_costs_only_its_own_record(tmp_path):
    bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": ASK, "response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}}},
        {"prompt": ASK, "response_format": {"type": "json_object"}},
    ]) + "\n")
    proc = gen("-f", str(jobs), "--json", "-n", "16")
    assert proc.returncode == 1, proc.stderr  # some prompts failed
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert records[0]["finish_reason"] == "error" and "json_schema" in records[0]["error"]
    assert records[1]["text"].startswith("{")
    assert "prompt 1: json_schema" in proc.stderr and "Traceback" not in proc.stderr


# The answer must be the JSON string "okQ": once `"ok` is written, every token the grammar allows
# holds a "Q" (tests/conftest's smollm2 names them), and logit_bias may ban them all.
OK_Q = {"enum": ["okQ"]}


@pytest.fixture(scope="module")
def q_ban(smollm2):
    """--logit-bias's text banning every smollm2 token whose text holds a "Q"."""
    return ",".join(f"{t}-inf" for t in range(smollm2.n_vocab) if b"Q" in smollm2.piece(t))


@pytest.mark.parametrize("method,temperature", [("plain", "0"), ("plain", "0.8"), ("lookup", "0"),
                                                ("chain", "0.8")])
def test_logit_bias_that_bans_every_allowed_token_is_one_line(q_ban, method, temperature):
    """Greedy and sampled, plain and speculative (chain at T > 0 verifies by rejection sampling)."""
    draft = ["-d", SMOLLM2] if method == "chain" else []
    proc = gen("--json-schema", json.dumps(OK_Q), "--method", method, *draft, "-t", temperature, "--seed", "1",
               "--logit-bias", q_ban, ASK)
    assert_one_line_error(proc, "logit_bias bans every token the grammar allows at output token ")
    assert proc.returncode == 2 and "expected a finite logit for at least one of the" in proc.stderr
    assert "found -inf for all" in proc.stderr


def test_a_banned_answer_costs_only_its_own_record(q_ban, tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "Name a colour."},
        {"prompt": ASK, "response_format": {"type": "json_schema", "json_schema": {"name": "q", "schema": OK_Q}}},
        {"prompt": "Name a fruit."},
    ]) + "\n")
    proc = gen("-f", str(jobs), "--json", "-n", "8", "--logit-bias", q_ban)
    assert proc.returncode == 1, proc.stderr  # some prompts failed
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["prompt_index"] for r in records] == [0, 1, 2]
    assert records[1]["finish_reason"] == "error" and "logit_bias bans every token" in records[1]["error"]
    assert records[0]["text"] and records[2]["text"] and "Traceback" not in proc.stderr


# TOO_WIDE (harness.py): a grammar that compiles but overruns llguidance's items per mask step.


@pytest.mark.parametrize("method", ["plain", "lookup"])
def test_a_grammar_engine_error_is_one_line_not_a_stop(tmp_path, method):
    gbnf = tmp_path / "wide.gbnf"
    gbnf.write_text(TOO_WIDE)
    proc = gen("--grammar", str(gbnf), "--method", method, "Say hello.")
    assert_one_line_error(proc, "the grammar engine failed at output token ")
    assert "Too many items" in proc.stderr and proc.returncode == 2
    assert proc.stdout.startswith("H")  # what was written before stays written
