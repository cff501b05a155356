"""The CLI contract, through a real process on the real smollm2 model: input paths, stdout/stderr
separation, --json fields, and one-line errors with a non-zero exit."""

import json
import re

import pytest

from clihelp import assert_one_line_error, gen, specgen
from harness import SMOLLM2

pytestmark = pytest.mark.real

RECORD_FIELDS = {"prompt_index", "text", "n_tokens", "method", "target", "draft", "temperature",
                 "target_calls", "drafted", "accepted", "acceptance_rate", "mean_accepted", "prefill_s",
                 "decode_s", "tokens_per_s", "accepted_by", "forced_drafted", "forced_accepted", "finish_reason",
                 "n_prompt", "n_cached"}


@pytest.fixture(scope="module")
def reference(smollm2_path):
    """Greedy text for the prompt 'Name a colour.' via the argument path."""
    proc = gen("Name a colour.", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["text"]


def test_argument_streams_text_to_stdout_and_stats_to_stderr(reference):
    proc = gen("Name a colour.")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == reference + "\n"
    assert "8 tok" in proc.stderr and "tok/s" in proc.stderr and "τ 1.00" in proc.stderr
    assert "\x1b[" not in proc.stdout  # plain text when piped


def test_stdin_dash_and_piped_stdin_match_argument(reference):
    for args in (["-"], []):
        proc = gen(*args, "--json", input="Name a colour.\n")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["text"] == reference


def test_txt_and_jsonl_files_one_record_per_prompt(tmp_path, reference):
    txt = tmp_path / "p.txt"
    txt.write_text("Name a colour.\n\nSay hi.\n")
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "Name a colour."}) + "\n"
                     + json.dumps({"question_id": 1, "category": "x", "turns": ["Say hi.", "more"]}) + "\n")
    outs = []
    for f in (txt, jsonl):
        proc = gen("-f", str(f), "--json")
        assert proc.returncode == 0, proc.stderr
        records = [json.loads(line) for line in proc.stdout.splitlines()]
        assert [r["prompt_index"] for r in records] == [0, 1]
        assert records[0]["text"] == reference
        outs.append(records[1]["text"])
    assert outs[0] == outs[1]  # Spec-Bench "turns": the first turn is the prompt


def test_json_record_fields_and_values():
    proc = gen("Name a colour.", "--json")
    record = json.loads(proc.stdout)
    assert set(record) == RECORD_FIELDS
    assert record["method"] == "plain" and record["target"] == SMOLLM2 and record["draft"] is None
    assert record["n_tokens"] == 8 and record["target_calls"] == 8 and record["finish_reason"] == "length"
    assert record["drafted"] == record["accepted"] == 0 and record["mean_accepted"] == 1.0
    assert record["tokens_per_s"] > 0 and record["decode_s"] > 0


def test_prompts_that_share_a_system_prompt_reuse_it(tmp_path):
    """-f: a prompt that begins as the one before reads only the rest (the prompt cache), and the
    texts are those of a --no-prompt-cache run."""
    system = ("You are a careful assistant for a garden centre. Answer in one sentence, name the plant, and say "
              "when it should be planted. Never recommend a pesticide; suggest a natural remedy instead.")
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps({"messages": [{"role": "system", "content": system},
                                                      {"role": "user", "content": q}]}) + "\n"
                             for q in ("What grows in shade?", "What likes full sun?", "What about clay soil?")))
    runs, stderr = [], []
    for flag in ("--prompt-cache", "--no-prompt-cache"):
        proc = gen("-f", str(jsonl), "--json", flag)
        assert proc.returncode == 0, proc.stderr
        runs.append([json.loads(line) for line in proc.stdout.splitlines()])
        stderr.append(proc.stderr)
    warm, cold = runs
    assert [r["text"] for r in warm] == [r["text"] for r in cold]
    assert warm[0]["n_cached"] == 0 and all(r["n_cached"] > 32 for r in warm[1:])
    assert all(r["n_cached"] == 0 for r in cold) and warm[1]["n_prompt"] == cold[1]["n_prompt"]
    assert f"(cached {warm[1]['n_cached']})" in stderr[0] and "cached" not in stderr[1]


def test_interleaved_multi_turn_records_each_resume_their_own_conversation(tmp_path):
    """-f over two conversations' records taking turns (A, B, A's next turn): the last record
    resumes A's prefix from host memory (--prompt-cache-mb), not only what it shares with B's; with
    0 MiB it keeps only the live (B's) prefix; the texts are those of a --no-prompt-cache run."""
    def record(system, *turns):
        return {"messages": [{"role": "system", "content": system},
                             *({"role": role, "content": text} for role, text in turns)]}

    a = "You answer questions about the planets of the solar system in one short sentence, and name the planet."
    b = "You are a cook. Every answer is one recipe step, with the quantities in grams and the time in minutes."
    records = [record(a, ("user", "Which planet is largest?")), record(b, ("user", "How do I boil an egg?")),
               record(a, ("user", "Which planet is largest?"), ("assistant", "Jupiter is the largest planet."),
                      ("user", "And the smallest?"))]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    runs = {}
    for flags in (("--prompt-cache-mb", "64"), ("--prompt-cache-mb", "0"), ("--no-prompt-cache",)):
        proc = gen("-f", str(jsonl), "--json", "-n", "8", *flags)
        assert proc.returncode == 0, proc.stderr
        runs[flags[-1]] = [json.loads(line) for line in proc.stdout.splitlines()]
    kept = {name: [r["n_cached"] for r in run] for name, run in runs.items()}
    assert kept["64"][2] > kept["0"][2] + 32 and kept["--no-prompt-cache"] == [0, 0, 0], kept
    assert [r["text"] for r in runs["64"]] == [r["text"] for r in runs["0"]] == [r["text"] for r in
                                                                              runs["--no-prompt-cache"]]


def test_seeded_sampling_reproducible():
    args = ("Tell me a story.", "--json", "-t", "0.9", "--top-k", "40", "--top-p", "0.95", "-n", "24")
    a, b, c = (json.loads(gen(*args, "--seed", s).stdout)["text"] for s in ("3", "3", "4"))
    assert a == b
    assert a != c


def test_no_chat_changes_the_prompt(reference):
    proc = gen("Name a colour.", "--json", "--no-chat")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["text"] != reference


def test_missing_model_file(tmp_path):
    proc = specgen("generate", "-m", str(tmp_path / "nope.gguf"), "hi")
    assert_one_line_error(proc, "model file not found")


def test_file_that_is_not_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("hello, not a model")
    proc = specgen("generate", "-m", str(bad), "hi")
    assert_one_line_error(proc, "not a GGUF file")


def test_unknown_model_name():
    proc = specgen("generate", "-m", "no-such-model", "hi")
    assert_one_line_error(proc, "unknown model 'no-such-model'")


def test_empty_prompt():
    assert_one_line_error(gen(""), "empty prompt")
    assert_one_line_error(gen("-", input="  \n"), "empty prompt on stdin")


def test_unknown_config_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("target: x\nmax_tokenz: 5\n")
    proc = gen("hi", "-c", str(cfg))
    assert_one_line_error(proc, "unknown key 'max_tokenz'")


def test_config_values_apply_and_command_line_wins(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"target: {SMOLLM2}\nmax_tokens: 3\nmethod: plain\n")
    proc = specgen("generate", "-c", str(cfg), "--json", "Name a colour.")
    assert json.loads(proc.stdout)["n_tokens"] == 3
    proc = specgen("generate", "-c", str(cfg), "-n", "5", "--json", "Name a colour.")
    assert json.loads(proc.stdout)["n_tokens"] == 5


def test_draft_with_other_vocabulary_is_rejected():
    proc = specgen("generate", "-m", SMOLLM2, "-d", "gemma-3-270m-q4_k_m", "--method", "auto", "hi")
    assert_one_line_error(proc, "does not match target")


def test_models_list_and_path(smollm2_path):
    proc = specgen("models", "list")
    assert proc.returncode == 0
    row = next(line for line in proc.stdout.splitlines() if line.startswith(SMOLLM2 + " "))
    assert row.split()[-1] == "yes"
    proc = specgen("models", "path", SMOLLM2)
    assert proc.stdout.strip() == str(smollm2_path)


def test_calibrate_shows_the_cost_curve(isolated_home, smollm2_path):
    """The curve, how it was measured (passes, spread, other processes' CPU) and, on a quiet
    machine, cached for the next run; a curve timed while the machine was busy is not kept."""
    proc = specgen("calibrate", str(smollm2_path), env={"SPECGEN_HOME": str(isolated_home)})
    assert proc.returncode == 0, proc.stderr
    assert "(measured)" in proc.stdout and " passes; median spread ±" in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows][:4] == [1, 2, 3, 4] and float(rows[0][2]) == 1.0
    assert all(r[-1].startswith("±") and r[-1].endswith("%") for r in rows)  # each size's spread
    busy = "the machine was busy" in proc.stderr
    again = specgen("calibrate", str(smollm2_path), env={"SPECGEN_HOME": str(isolated_home)})
    assert ("(measured)" if busy else "(cached)") in again.stdout


def test_calibrate_takes_the_model_as_m_like_every_other_command(isolated_home, smollm2_path):
    """`-m MODEL` as in generate, bench and serve (the positional name still works, above): the
    cached curve written here is the one shown, so nothing is timed."""
    from specgen.llama import tools
    from specgen.costs.cache import cache_key, save_cached
    from specgen.costs.curve import CostCurve
    from specgen.host import cpu_name
    from specgen.models.curves import build_key

    key = cache_key(str(smollm2_path), build_key(tools.build_info()), 1, 1024, cpu_name())
    save_cached(isolated_home / "calibration" / f"{key}.json", CostCurve([1, 2, 4], [0.010, 0.015, 0.025]))
    proc = specgen("calibrate", "-m", str(smollm2_path), "--threads", "1", "--ctx", "1024",
                   env={"SPECGEN_HOME": str(isolated_home)})
    assert proc.returncode == 0, proc.stderr
    assert "(cached)" in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [(int(r[0]), float(r[1])) for r in rows[:3]] == [(1, 10.0), (2, 15.0), (4, 25.0)]


@pytest.mark.real
def test_calibrate_kernels_times_each_weight_type_against_llama_cpps(smollm2_path):
    """--kernels: a row per weight type of the model's products (the output layer apart) and one
    for the whole decode, each cell specgen's ms / llama.cpp's at B = 1..16 (specgen/llama/profile.py)."""
    proc = specgen("calibrate", "-m", str(smollm2_path), "--kernels", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "SPECGEN_KERNELS = " in proc.stderr and "c(16)/c(1)" in proc.stdout
    rows = {line.strip().split("  ")[0]: line.strip() for line in proc.stdout.splitlines()}
    for name in ("matmul q4_1", "output layer (q8_0)", "whole decode"):
        cells = rows[name][len(name):].split()
        assert len(cells) == 3 * 6 and all(float(c) > 0 for c in cells if c != "/"), rows[name]


def test_auto_stats_line_reports_its_choices(isolated_home, smollm2_path):
    """With a seed auto plans from the cached calibration alone, not from this machine's timings.
    The curve written there makes a batch cost 1 + (B - 1)/2 single decodes: drafting after a
    1-2 token match does not pay, after the repeated passage it does, so auto mixes both. (A prompt
    whose continuation repeats to the end, as "one two three four" did once specgen's attention came
    in, takes no plain step: the passage must end.)"""
    from specgen.llama import tools
    from specgen.costs.cache import cache_key, save_cached
    from specgen.costs.curve import CostCurve
    from specgen.host import cpu_name
    from specgen.models.curves import build_key

    key = cache_key(str(smollm2_path), build_key(tools.build_info()), 1, 1024, cpu_name())
    sizes = [1, 2, 4, 8, 16, 32]
    save_cached(isolated_home / "calibration" / f"{key}.json",
                CostCurve(sizes, [0.010 * (1 + 0.5 * (b - 1)) for b in sizes]))
    proc = specgen("generate", "-m", str(smollm2_path), "--method", "auto", "-n", "24", "--no-chat", "--seed", "0",
                   "--threads", "1", "--ctx", "1024", "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a +",
                   env={"SPECGEN_HOME": str(isolated_home)})
    assert proc.returncode == 0, proc.stderr
    steps = proc.stderr.split("steps: ")[1].split(" · ")[0]
    assert "lookup" in steps and "plain" in steps, proc.stderr


@pytest.mark.parametrize("args, message", [
    (["calibrate", SMOLLM2, "--threads", "0"], "--threads must be at least 1, found 0"),
    (["calibrate"], "calibrate needs a model: -m MODEL (or MODEL alone), found none"),
    (["calibrate", SMOLLM2, "--kernels", "--refresh"], "--kernels times the CPU's kernels afresh: it takes -m and "
                                                        "--threads, found --refresh"),
    (["calibrate", SMOLLM2, "-m", "gemma-3-270m-q4_k_m"],
     f"calibrate takes one model, found two: {SMOLLM2} and -m gemma-3-270m-q4_k_m"),
    (["rpc-server", "--port", "0"], "--port must be in 1..65535, found 0"),
    (["rpc-server", "--threads", "0"], "--threads must be at least 1, found 0"),
    (["doctor", "--threads", "0"], "--threads must be at least 1, found 0"),
    (["draft", "derive", SMOLLM2, "--vocab", "0"], "--vocab must be at least 1, found 0"),
    (["draft", "derive", SMOLLM2, "--head", "Q9_9"], "--head must be one of Q4_0, Q4_1, Q5_0, Q8_0, F16, found 'Q9_9'"),
])
def test_bad_options_are_usage_errors(args, message):
    proc = specgen(*args)
    assert_one_line_error(proc, message)
    assert proc.returncode == 2


SUMMARY = re.compile(r"^plain [\d.]+ tok/s · auto [\d.]+ tok/s · [\d.]+x · identical to plain: (yes|no)$")


def test_demo_compares_auto_with_plain_on_the_same_prompt(isolated_home):
    # An F32 target is lossless to the token: auto's text must be plain's, and the demo must say so.
    text = "one two three four five six one two three four five six one two three"
    proc = specgen("demo", "-m", "smollm2-135m-instruct-f32", "-d", "none", "-n", "24", "--threads", "1", text,
                   env={"SPECGEN_HOME": str(isolated_home)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(text) and len(proc.stdout) > len(text) + 10  # the prompt, then its continuation
    summary = proc.stderr.strip().splitlines()[-1]
    assert SUMMARY.match(summary) and summary.endswith("identical to plain: yes"), proc.stderr


def test_demo_summary_line():
    from specgen.cli.generate import demo_summary

    assert demo_summary(40.0, 90.0, True) == "plain 40.0 tok/s · auto 90.0 tok/s · 2.25x · identical to plain: yes"
    assert SUMMARY.match(demo_summary(50.0, 45.0, False)).group(1) == "no"


def test_a_target_of_ones_own_without_a_draft_gets_one_hint():
    hint = "hint: no draft model"
    proc = specgen("generate", "-m", SMOLLM2, "-n", "4", "Name a colour.")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(hint) == 1 and "-d MODEL" in proc.stderr
    assert "makes it faster" not in proc.stderr and "-d self" not in proc.stderr  # no unmeasured advice
    for quiet in (["-d", "none"], ["--method", "plain"]):
        proc = specgen("generate", "-m", SMOLLM2, "-n", "4", *quiet, "Name a colour.")
        assert proc.returncode == 0 and hint not in proc.stderr, proc.stderr


def test_no_hint_when_a_draft_is_named_on_the_command_line_or_in_a_config_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("draft: none\n")
    for args in (["-d", SMOLLM2], ["-c", str(config)]):
        proc = specgen("generate", "-m", SMOLLM2, "-n", "4", *args, "Name a colour.")
        assert proc.returncode == 0 and "hint: no draft model" not in proc.stderr, proc.stderr
