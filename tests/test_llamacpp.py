"""`bench --llama-cpp DIR`: llama.cpp's speculative decoding on the same prompts, beside specgen's rows."""

import json
import stat
import sys
from pathlib import Path

import pytest

from clihelp import assert_one_line_error, specgen
from harness import SMOLLM2
from specgen.bench import llamacpp
from specgen.errors import ConfigError, SpecgenError
from specgen.core.sampling import SamplingParams

# What llama-speculative-simple prints (its stdout: prompt echo, then the text; stderr: the log).
STDOUT = "\n\n<bos>The capital of France is Paris. The capital of France is Paris. The capital\n\n"
STDERR = """0.01.775.968 I encoded   20 tokens in    0.033 seconds, speed:  612.952 t/s
0.01.775.987 I decoded   97 tokens in    0.587 seconds, speed:  165.354 t/s
0.01.776.012 I n_draft   = 3
0.01.776.024 I n_predict = 97
0.01.776.036 I n_drafted = 72
0.01.776.048 I n_accept  = 70
"""


def test_the_text_after_the_prompt_echo_and_the_counters_are_read():
    text, stats = llamacpp.parse(STDOUT, STDERR, "The capital of France is")
    assert text == " Paris. The capital of France is Paris. The capital"  # not the later copy of the prompt
    assert (stats.n_tokens, stats.drafted, stats.accepted) == (97, 72, 70)
    assert stats.decode_s == pytest.approx(0.587) and stats.prefill_s == pytest.approx(0.033)
    assert stats.target_calls == 27  # each step commits its accepted tokens and one more
    with pytest.raises(SpecgenError, match="printed no 'decoded N tokens' line: failed to load model"):
        llamacpp.parse("", "llama_model_load: error\nfailed to load model\n", "x")


def _log(steps: list[tuple[float, int, int]], decode_s: float, end_s: float) -> str:
    """A `-v --log-timestamps` log: one line per step (its end, accepted/drafted), then the totals."""
    def at(t):
        return f"0.{int(t):02d}.{int(t * 1e3) % 1000:03d}.{round(t * 1e6) % 1000:03d}"
    lines = [f"{at(t)} D accepted {a}/{d} draft tokens, the last target token is: (1)" for t, a, d in steps]
    n = sum(a + 1 for _, a, _ in steps)
    lines += [f"{at(end_s)} I decoded  {n} tokens in    {decode_s:.3f} seconds, speed: {n / decode_s:.3f} t/s",
              f"{at(end_s)} I n_drafted = {sum(d for *_, d in steps)}",
              f"{at(end_s)} I n_accept  = {sum(a for _, a, _ in steps)}"]
    return "\n".join(lines) + "\n"


def test_a_run_past_max_tokens_is_timed_over_the_steps_that_wrote_the_tokens_asked_for():
    # A real ngram-mod run asked for 64 tokens: 36 plain steps, a 27-token draft taking it to 64,
    # then a last step with no draft limit that wrote 65 more (129 in all) in a 244 ms batch.
    steps = [(1.0585 + 0.0115 * (i + 1), 0, 0) for i in range(36)] + [(1.5976, 27, 27), (1.8415, 64, 64)]
    _, stats = llamacpp.parse(STDOUT, _log(steps, 0.783, 1.8415), "The capital", max_tokens=64)
    assert (stats.n_tokens, stats.target_calls, stats.accepted, stats.drafted) == (64, 37, 27, 27)
    assert stats.decode_s == pytest.approx(1.5976 - (1.8415 - 0.783), abs=1e-5)  # its time up to token 64
    assert 110 < stats.tokens_per_s < 130  # not 129 / 0.783 = 165, nor 64 / 0.783 = 82
    # Without max_tokens, within it, or with a log that has no steps: llama.cpp's own totals.
    for out, asked in ((_log(steps, 0.783, 1.8415), None), (STDERR, 64)):
        assert llamacpp.parse(STDOUT, out, "The capital", max_tokens=asked)[1].n_tokens in (129, 97)
    # Fewer tokens than asked: it stopped at an end-of-generation token, which is not text.
    stopped = llamacpp.parse(STDOUT, _log(steps, 0.783, 1.8415), "The capital", max_tokens=200)[1]
    assert (stopped.n_tokens, stopped.n_committed) == (128, 129)


def test_a_run_past_max_tokens_is_clipped_to_what_plain_wrote_when_it_agrees():
    assert llamacpp.clip_to(" Paris. The capital of", " Paris.") == " Paris."
    assert llamacpp.clip_to(" Lyon. The", " Paris.") == " Lyon. The"


def test_flags_follow_the_bench_settings():
    setup = llamacpp.Setup(Path("/b/llama-speculative-simple"), Path("t.gguf"), Path("d.gguf"), 128, 2, 4096)
    greedy = llamacpp.command(setup, "ngram-mod", "hi")
    assert greedy[greedy.index("--temp") + 1] == "0" and greedy[greedy.index("--top-k") + 1] == "1"
    assert "-md" not in greedy and greedy[greedy.index("--spec-type") + 1] == "ngram-mod"
    assert greedy[greedy.index("-n") + 1] == "128" and greedy[greedy.index("-t") + 1] == "2"
    sampled = llamacpp.command(setup.__class__(**{**setup.__dict__, "sampling": SamplingParams(0.8, 0, 0.95, 7)}),
                               "draft-simple,ngram-map-k", "hi")
    assert "--log-timestamps" in greedy and "-v" in greedy  # each step's end, to time the tokens asked for
    assert sampled[sampled.index("--temp") + 1] == "0.8" and sampled[sampled.index("--top-p") + 1] == "0.95"
    assert sampled[sampled.index("--seed") + 1] == "7" and sampled[sampled.index("-md") + 1] == "d.gguf"


PLAIN_STDERR = """llama_perf_sampler_print:    sampling time =       3.10 ms /    40 runs   (    0.08 ms per token, 12903.23 tokens per second)
llama_perf_context_print:        load time =     120.70 ms
llama_perf_context_print: prompt eval time =      40.11 ms /     9 tokens (    4.46 ms per token,   224.38 tokens per second)
llama_perf_context_print:        eval time =     310.00 ms /    31 runs   (   10.00 ms per token,   100.00 tokens per second)
llama_perf_context_print:       total time =     400.22 ms /    40 tokens
"""


def test_llama_cpps_plain_decoding_is_read_from_its_eval_time():
    text, stats = llamacpp.parse_plain(" Paris is the capital. [end of text]\n", PLAIN_STDERR)
    assert text == " Paris is the capital."
    assert (stats.n_tokens, stats.decode_s) == (31, pytest.approx(0.31))  # not the prompt's eval line
    # As llama-completion logs it (common_perf_print, with timestamps):
    logged = ("0.00.579.303 I common_perf_print: prompt eval time =      22.43 ms /     2 tokens (  11.22 ms per token)\n"
              "0.00.579.327 I common_perf_print:        eval time =      98.30 ms /     7 runs   (  14.04 ms per token)\n")
    assert llamacpp.parse_plain(", I'm glad\n\n", logged) == (", I'm glad", llamacpp.parse_plain("", logged)[1])
    assert llamacpp.parse_plain("", logged)[1].n_tokens == 7
    with pytest.raises(SpecgenError, match="llama-completion printed no 'eval time' line: boom"):
        llamacpp.parse_plain("", "boom\n")
    setup = llamacpp.Setup(Path("/b/llama-speculative-simple"), Path("t.gguf"), None, 64, 2, 4096)
    cmd = llamacpp.plain_command(setup, "hi")
    assert cmd[0] == "/b/llama-completion" and "-no-cnv" in cmd and "--no-display-prompt" in cmd
    assert cmd[cmd.index("--top-k") + 1] == "1" and cmd[cmd.index("-n") + 1] == "64"


def test_configurations_default_to_the_ngram_types_and_draft_types_need_a_draft():
    assert llamacpp.spec_types(None, False) == list(llamacpp.DEFAULT_SPEC_TYPES)
    assert llamacpp.spec_types(None, True)[-1] == "draft-simple"
    with pytest.raises(ConfigError, match="--spec-type draft-simple needs a draft model"):
        llamacpp.spec_types(["draft-simple"], False)


FAKE = '''#!{python}
"""A stand-in llama-speculative-simple: echoes the prompt, writes N words, logs like llama.cpp."""
import json, sys
args = sys.argv[1:]
prompt, n = args[args.index("-p") + 1], int(args[args.index("-n") + 1])
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
sys.stdout.write("\\n\\n<bos>" + prompt + " word" * (n + 3) + "\\n\\n")
sys.stderr.write("I encoded   12 tokens in    0.010 seconds, speed: 1200 t/s\\n")
sys.stderr.write("I decoded %4d tokens in    0.250 seconds, speed: 10 t/s\\n" % (n + 3))
sys.stderr.write("I n_drafted = 10\\nI n_accept  = 6\\n")
'''

FAKE_PLAIN = '''#!{python}
"""A stand-in llama-completion: N words after the prompt, its perf lines on stderr."""
import sys
args = sys.argv[1:]
n = int(args[args.index("-n") + 1])
sys.stdout.write(" word" * n)
sys.stderr.write("llama_perf_context_print:        eval time =     200.00 ms /  %5d runs   (ms per token)\\n" % (n - 1))
'''


@pytest.mark.real
@pytest.mark.parametrize("target", [SMOLLM2, pytest.param("smollm2-135m-instruct-f32", marks=pytest.mark.real)])
def test_bench_runs_llama_cpp_beside_specgen_and_reports_it(tmp_path, target):
    folder, log, out = tmp_path / "bin", tmp_path / "calls.jsonl", tmp_path / "bench.json"
    folder.mkdir()
    fake = folder / llamacpp.BINARY
    fake.write_text(FAKE.format(python=sys.executable, log=str(log)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    fake_plain = folder / llamacpp.PLAIN_BINARY
    fake_plain.write_text(FAKE_PLAIN.format(python=sys.executable))
    fake_plain.chmod(fake_plain.stat().st_mode | stat.S_IEXEC)
    proc = specgen("bench", "-m", target, "--methods", "lookup", "--limit", "1", "-n", "8",
                   "--llama-cpp", str(folder), "--spec-type", "ngram-mod", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "llama.cpp ngram-mod" in proc.stdout
    report = json.loads(out.read_text())
    row = next(r for r in report["summary"] if r["method"] == "llama.cpp ngram-mod" and r["group"] == "overall")
    assert row["tokens_per_s"] == pytest.approx(11 / 0.25)  # its log has no steps: its own count
    assert row["acceptance_rate"] == pytest.approx(0.6)
    # Per prompt, against the fastest llama.cpp row: a line under the table, and the JSON's head_to_head.
    assert "lookup against the fastest llama.cpp row on each prompt: as fast or faster on" in proc.stdout
    versus = report["head_to_head"]
    assert [h["method"] for h in versus] == ["lookup"] and versus[0]["n_prompts"] == 1
    # A screened target (F32) also gets specgen's plain decoding of the target itself, the row that
    # tells screening's share of the lead over llama.cpp apart.
    screened = target.endswith("f32")
    assert report["settings"]["methods"] == ["plain", "lookup", *(["plain, unscreened"] if screened else []),
                                             "llama.cpp plain", "llama.cpp ngram-mod"]
    if screened:
        row = next(r for r in report["summary"] if r["method"] == "plain, unscreened" and r["group"] == "overall")
        assert row["lossless_mismatches"] == 0 and row["tokens_per_s"] > 0  # the same argmaxes, unscreened
    plain_row = next(r for r in report["summary"] if r["method"] == "llama.cpp plain" and r["group"] == "overall")
    assert plain_row["tokens_per_s"] == pytest.approx(7 / 0.2)  # its eval time: 7 one-token decodes
    # The builtin suite's first prompt has two turns: the second follows plain's own first answer.
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # The target as given: an F32 one's screened copy (screen.py) is specgen's alone.
    assert len(calls) == 2 and calls[0][calls[0].index("-m") + 1].endswith(f"{target}.gguf")
    assert (report["models"]["target_screened"] is not None) == target.endswith("f32")
    first, second = (call[call.index("-p") + 1] for call in calls)
    plain = next(r for r in report["records"] if r["method"] == "plain")["text"]
    assert first.count("<|im_start|>user") == 1  # the chat template's text, as specgen's own run read it
    assert second.startswith(first) and plain.split("\n\n")[0] in second
    record = next(r for r in report["records"] if r["method"] == "llama.cpp ngram-mod")
    assert record["text"] == " word" * 11 + "\n\n" + " word" * 11


def test_llama_cpp_options_are_checked_before_running(tmp_path):
    assert_one_line_error(specgen("bench", "-m", SMOLLM2, "--llama-cpp", str(tmp_path / "nope")),
                          "--llama-cpp expects a folder holding llama-speculative-simple")
    assert_one_line_error(specgen("bench", "-m", SMOLLM2, "--llama-cpp", str(tmp_path)), "without it")
    assert_one_line_error(specgen("bench", "-m", SMOLLM2, "--spec-type", "ngram-mod"),
                          "--spec-type runs llama.cpp's speculative decoding: give --llama-cpp DIR too")


def test_a_llama_cpp_tool_that_fails_is_one_line_naming_it(tmp_path):
    for name in (llamacpp.BINARY, llamacpp.PLAIN_BINARY):
        fake = tmp_path / name
        fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('loading\\nboom: no such model\\n\\n')\n"
                        "sys.exit(3)\n")
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    setup = llamacpp.Setup(tmp_path / llamacpp.BINARY, Path("t.gguf"), None, 8, 1, 512)
    with pytest.raises(SpecgenError) as plain:
        llamacpp.run_plain(setup, "hi")
    assert str(plain.value) == "llama-completion failed with exit code 3: boom: no such model"
    with pytest.raises(SpecgenError) as spec:
        llamacpp.run(setup, "ngram-mod", "hi")
    assert str(spec.value) == ("llama-speculative-simple --spec-type ngram-mod failed with exit code 3: "
                               "boom: no such model")
