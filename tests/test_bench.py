"""specgen bench: suites, selection, interleaving, speedup arithmetic, JSON schema and the plot."""

import json
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from clihelp import specgen
from fakes import FAKE_METHODS, fake_session, question_lines, trial
from specgen.app.ask import Ask
from specgen.bench import results, run, suites, summary
from specgen.bench.view import check_plot_path, summary_table, svg_chart
from specgen.errors import ConfigError, PromptError
from specgen.app.prompts import Prompt
from specgen.drafting.methods import METHODS
from specgen.app.runner import Completion, Runner
from specgen.core.stats import RunStats

SPEC_BENCH = Path(__file__).resolve().parent.parent.parent / "shared/bench/spec-bench/question.jsonl"


def test_spec_bench_categories_group_into_six():
    prompts = suites.parse_question_file(question_lines(4), "q.jsonl")
    assert [p.group for p in prompts][:8] == ["mt_bench"] * 8  # writing + roleplay
    assert {p.group for p in prompts} == {"mt_bench", "translation", "rag"}
    assert prompts[0].turns == ("first turn", "second turn")


def test_per_group_takes_every_kth_record():
    prompts = suites.parse_question_file(question_lines(40), "q.jsonl")  # mt_bench 80, others 40
    picked = suites.select(prompts, per_group=10)
    mt = [int(p.prompt_id) for p in picked if p.group == "mt_bench"]
    assert mt == list(range(81, 161, 8))  # spread over both categories, not the first ten
    assert sum(p.group == "rag" for p in picked) == 10
    assert len(suites.select(prompts, per_group=10, limit=3)) == 3
    assert len(suites.select(prompts, per_group=1000)) == len(prompts)


def test_category_keeps_a_records_own_category_or_a_whole_group():
    prompts = suites.parse_question_file(question_lines(3), "q.jsonl")  # writing, roleplay (mt_bench), ...
    assert [p.category for p in suites.in_categories(prompts, "roleplay")] == ["roleplay"] * 3
    assert {p.category for p in suites.in_categories(prompts, "mt_bench")} == {"writing", "roleplay"}
    assert [p.prompt_id for p in suites.in_categories(prompts, "rag, writing")] == ["81", "82", "83", "90", "91", "92"]
    assert suites.in_categories(prompts, None) == prompts
    with pytest.raises(ConfigError, match="found 'coding'"):
        suites.in_categories(prompts, "writing,coding")
    with pytest.raises(ConfigError, match="found ','"):
        suites.in_categories(prompts, ",")


def test_split_halves_are_disjoint_cover_everything_and_are_stable():
    prompts = suites.parse_question_file(question_lines(10), "q.jsonl")  # ids 81..120
    tune, report_half = suites.split_half(prompts, "tune"), suites.split_half(prompts, "report")
    assert {p.prompt_id for p in tune}.isdisjoint(p.prompt_id for p in report_half)
    assert sorted(tune + report_half, key=lambda p: int(p.prompt_id)) == prompts
    assert [p.prompt_id for p in tune][:3] == ["81", "83", "85"] and report_half[0].prompt_id == "82"
    assert suites.split_half(prompts[::-1], "report") == report_half[::-1]  # the id alone decides
    assert suites.split_half(prompts, "all") == prompts
    assert [suites.half_of(i) for i in ("mt_bench-1", "HumanEval/12", "7")] == ["tune", "report", "tune"]


def test_split_errors_are_one_line():
    with pytest.raises(ConfigError, match="--split expects all, tune, report, found 'both'"):
        suites.split_half([], "both")
    with pytest.raises(ConfigError, match="--split needs prompt ids that end in a number .* found 'q-x'"):
        suites.split_half([suites.BenchPrompt("qa", "q-x", ("t",))], "tune")


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason=f"Spec-Bench is not at {SPEC_BENCH}")
def test_spec_bench_splits_in_two_halves_with_every_category_in_both():
    records = [json.loads(line) for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines() if line.strip()]
    category = {str(r["question_id"]): r["category"] for r in records}
    _, prompts = suites.load_suite(str(SPEC_BENCH))
    tune, report_half = suites.split_half(prompts, "tune"), suites.split_half(prompts, "report")
    tune_ids, report_ids = [p.prompt_id for p in tune], [p.prompt_id for p in report_half]
    assert set(tune_ids).isdisjoint(report_ids) and sorted(tune_ids + report_ids) == sorted(category)
    assert len(tune) == len(report_half) == len(prompts) // 2 == 240
    for name in set(category.values()):  # 13 categories, each half and half
        in_tune = sum(category[i] == name for i in tune_ids)
        assert in_tune == sum(category[i] == name for i in report_ids) > 0, name
    # Stable: the same ids on every load, and the prompts development named for its constants are in tune.
    assert [p.prompt_id for p in suites.split_half(suites.load_suite(str(SPEC_BENCH))[1], "report")] == report_ids
    assert {"81", "97", "113", "209", "257", "305", "321", "353", "401", "497"} <= set(tune_ids)


@pytest.mark.parametrize("line, message", [
    ("{not json", "q.jsonl line 1: not valid JSON"),
    ('{"category": "qa", "turns": []}', "q.jsonl line 1: expected a Spec-Bench question"),
    ('{"turns": ["hi"]}', "q.jsonl line 1: expected a Spec-Bench question"),
])
def test_bad_question_file_names_the_line(line, message):
    with pytest.raises(PromptError, match=message):
        suites.parse_question_file(line, "q.jsonl")


def test_builtin_suite_covers_the_groups_and_code():
    name, prompts = suites.load_suite("builtin")
    assert {p.group for p in prompts} == set(suites.SPEC_BENCH_GROUPS) | {"code"}
    assert any(len(p.turns) == 2 for p in prompts if p.group == "mt_bench")


def test_suite_errors(tmp_path):
    with pytest.raises(ConfigError, match="--suite expects builtin, json, humaneval or a question.jsonl file"):
        suites.load_suite(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"category": "qa", "turns": ["caf\xe9"]}\n')
    with pytest.raises(PromptError, match="expected UTF-8"):
        suites.load_suite(str(bad))


def test_methods_plain_first_once_and_checked():
    assert run.parse_methods("auto, lookup,plain,auto") == ("plain", "auto", "lookup")
    assert run.parse_methods(["lookup"]) == ("plain", "lookup")
    # Constrained prompts: jump-forward is the second baseline, always run, after plain.
    assert run.parse_methods("auto,jump", constrained=True) == ("plain", "jump", "auto")
    assert run.parse_methods("auto", constrained=True) == ("plain", "jump", "auto")
    with pytest.raises(ConfigError, match="--methods expects .* found 'fast'"):
        run.parse_methods("lookup,fast")


def test_schedule_interleaves_methods_per_prompt():
    p1, p2 = (suites.BenchPrompt("qa", i, ("x",)) for i in "12")
    order = [(p.prompt_id, m, r) for p, m, r in run.schedule([p1, p2], ["plain", "lookup"], 2)]
    assert order == [("1", "plain", 0), ("1", "lookup", 0), ("2", "plain", 0), ("2", "lookup", 0),
                     ("1", "plain", 1), ("1", "lookup", 1), ("2", "plain", 1), ("2", "lookup", 1)]


class EchoRunner:
    """Answers each turn with a text naming the conversation it saw."""

    def __init__(self):
        self.seen = []

    def ask(self, prompt, max_tokens=None):
        return Ask(prompt, chat=True)

    def run(self, ask):
        self.seen.append(ask.prompt.messages())
        return Completion(ask.prompt.index, f"answer{len(self.seen)}", RunStats(n_tokens=10, decode_s=0.5), "length")


def test_second_turn_follows_the_models_own_answer():
    runner = EchoRunner()
    text, stats, _ = run.run_turns(runner, suites.BenchPrompt("mt_bench", "1", ("q1", "q2")))
    assert runner.seen[1] == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "answer1"},
                              {"role": "user", "content": "q2"}]
    assert text == "answer1\n\nanswer2"
    assert (stats.n_tokens, stats.decode_s) == (20, 1.0)  # both turns count


def test_speedup_is_ratio_of_mean_throughputs_and_mismatches_are_counted():
    trials = [trial("1", "qa", "plain", 100), trial("1", "qa", "lookup", 300),
              trial("2", "qa", "plain", 300), trial("2", "qa", "lookup", 300, text="other"),
              trial("3", "rag", "plain", 50), trial("3", "rag", "lookup", 100),
              trial("4", "rag", "plain", 50)]  # interrupted before lookup ran: left out everywhere
    rows = {(r.group, r.method): r for r in summary.summarize(trials, ["plain", "lookup"], compare_texts=True)}
    qa = rows[("qa", "lookup")]
    assert qa.speedup == pytest.approx(300 / 200)  # mean(300,300)/mean(100,300), not mean of ratios (2.0)
    assert (qa.lossless_mismatches, qa.n_prompts, qa.mean_accepted, qa.acceptance_rate) == (1, 2, 2.0, 0.5)
    assert rows[("rag", "lookup")].n_prompts == 1
    overall = rows[(summary.OVERALL, "lookup")]
    assert overall.speedup == pytest.approx((700 / 3) / (450 / 3), abs=1e-3)  # JSON keeps 3 decimals
    assert rows[(summary.OVERALL, "plain")].speedup == 1.0
    sampled = summary.summarize(trials, ["plain", "lookup"], compare_texts=False)
    assert all(r.lossless_mismatches is None for r in sampled)


def test_head_to_head_names_each_prompt_another_tool_won_by_more_than_the_margin():
    """Overall speedups hide a prompt lost to llama.cpp; bench says which, by how much, against which
    of its rows (the fastest on that prompt), and with both target-call counts (equal counts: a tie
    of plain decodes, which one run cannot settle). Repeats of a prompt count together."""
    from specgen.bench.view import head_to_head_line

    rivals = ["llama.cpp ngram-mod", "llama.cpp ngram-simple"]
    trials = [trial("1", "qa", "auto", 100, calls=30), trial("1", "qa", rivals[0], 90), trial("1", "qa", rivals[1], 50),
              trial("2", "qa", "auto", 90, calls=4), trial("2", "qa", rivals[0], 80), trial("2", "qa", rivals[1], 100, calls=4),
              trial("3", "qa", "auto", 100), trial("3", "qa", rivals[0], 104),  # within the margin
              trial("3", "qa", rivals[1], 50),
              trial("4", "qa", "auto", 50), trial("4", "qa", rivals[0], 100),  # repeat 0 lost, repeat 1 won:
              trial("4", "qa", rivals[1], 10), trial("4", "qa", "auto", 200, repeat=1),  # 250 against 200 tokens
              trial("4", "qa", rivals[0], 100, repeat=1), trial("4", "qa", rivals[1], 10, repeat=1),
              trial("5", "qa", "auto", 100), trial("5", "qa", rivals[0], 300)]  # a rival missing: left out
    h = summary.head_to_head(trials, "auto", rivals)
    assert (h.n_prompts, h.wins) == (4, 2)
    assert h.losses == (summary.PromptLoss("2", rivals[1], 0.9, 4, 4),)
    line = head_to_head_line(h, rivals)
    assert "faster on 2 of 4" in line and "prompt 2 at 0.90x (llama.cpp ngram-simple; target calls 4 against 4)" in line
    assert head_to_head_line(summary.head_to_head(trials[:3], "auto", rivals), rivals).endswith("on none")


def test_multi_turn_groups_get_a_row_per_turn():
    """MT-bench's second turn reads the first's answer: drafting finds more there, and the table
    shows each turn's speedup beside the group's."""
    def two_turns(pid, method, tps1, tps2, text2="b"):
        turns = tuple(RunStats(n_tokens=t, decode_s=1.0, target_calls=t, n_committed=t) for t in (tps1, tps2))
        return run.Trial(suites.BenchPrompt("mt_bench", pid, ("q1", "q2")), method, 0, "a\n\n" + text2,
                       run.total_of(turns), "length", ("a", text2), turns)
    trials = [two_turns("1", "plain", 50, 50), two_turns("1", "auto", 60, 150),
              two_turns("2", "plain", 50, 50), two_turns("2", "auto", 60, 100, text2="c")]
    rows = {(r.group, r.turn, r.method): r for r in summary.summarize(trials, ["plain", "auto"], compare_texts=True)}
    assert rows[("mt_bench", 1, "auto")].speedup == pytest.approx(1.2)
    assert rows[("mt_bench", 2, "auto")].speedup == pytest.approx(2.5)
    assert rows[("mt_bench", 2, "auto")].lossless_mismatches == 1 == rows[("mt_bench", None, "auto")].lossless_mismatches
    assert rows[("mt_bench", None, "auto")].speedup == pytest.approx(1.85)  # (210/2 + 160/2) / 2 over 50
    assert (summary.OVERALL, 1, "auto") not in rows  # overall has no turns of its own
    table = summary_table([r for r in rows.values()], ["plain", "auto"], "t", 1)
    assert [str(c) for c in table.columns[0]._cells] == ["mt_bench", "  turn 1", "  turn 2", "[bold]overall[/bold]"]
    record = results.trial_record(trials[1], {})
    assert [t["tokens_per_s"] for t in record["turns"]] == [60.0, 150.0]


def test_per_prompt_spread_flags_a_difference_within_noise():
    """Beside the ratio of means: the median per-prompt speedup and a 90% bootstrap interval; a
    method whose interval holds 1.0 is flagged as within noise."""
    trials = []
    for i in range(20):
        wobble = 1 if i % 2 else -1  # per-prompt noise that averages out
        trials += [trial(str(i), "qa", "plain", 50), trial(str(i), "qa", "fast", 100 + 5 * wobble),
                   trial(str(i), "qa", "same", 50 + 10 * wobble)]
    rows = {r.method: r for r in summary.summarize(trials, ["plain", "fast", "same"], compare_texts=False) if r.group == "qa"}
    fast, same = rows["fast"], rows["same"]
    assert 1.9 < fast.speedup_low < fast.speedup == 2.0 < fast.speedup_high < 2.1 and not fast.within_noise
    assert fast.median_speedup == pytest.approx(2.0, abs=0.1)
    assert same.speedup_low < 1.0 < same.speedup_high and same.within_noise
    table = summary_table(list(rows.values()), ["plain", "fast", "same"], "t", 1)
    cells = {c.header: c._cells[0] for c in table.columns}
    assert "~noise" in cells["same"] and "~noise" not in cells["fast"]


def test_repeats_of_a_prompt_are_resampled_together():
    """Three repeats of four prompts are four prompts, not twelve: the interval is the one of the
    four prompts' speedups (each repeat the same), not one three repeats would narrow."""
    speedups = {"1": 1.2, "2": 1.6, "3": 2.0, "4": 2.4}
    trials = [t for r in range(3) for i, x in speedups.items()
              for t in (replace(trial(i, "qa", "plain", 100), repeat=r), replace(trial(i, "qa", "fast", 100 * x), repeat=r))]
    fast = next(r for r in summary.summarize(trials, ["plain", "fast"], compare_texts=False)
                if r.group == "qa" and r.method == "fast")
    once = next(r for r in summary.summarize([t for t in trials if t.repeat == 0], ["plain", "fast"], compare_texts=False)
                if r.group == "qa" and r.method == "fast")
    assert (fast.speedup_low, fast.speedup_high) == (once.speedup_low, once.speedup_high)
    assert fast.speedup_high - fast.speedup_low > 0.5


def test_each_repeat_s_speedup_is_kept_and_shown_beside_the_interval_over_prompts():
    """Repeats drift with the machine: the row keeps the speedup within each repeat (the --json
    summary's repeat_speedups) and the table shows it; one repeat has none to show."""
    drift = (1.0, 0.9, 0.8)
    trials = [t for r, d in enumerate(drift) for i in ("1", "2", "3")
              for t in (replace(trial(i, "qa", "plain", 100), repeat=r),
                        replace(trial(i, "qa", "fast", round(200 * d * (1 + int(i) / 10))), repeat=r))]
    rows = [r for r in summary.summarize(trials, ["plain", "fast"], compare_texts=False) if r.group == "qa"]
    fast = next(r for r in rows if r.method == "fast")
    assert fast.repeat_speedups == pytest.approx((2.4, 2.16, 1.92))
    assert next(r for r in rows if r.method == "plain").repeat_speedups == (1.0, 1.0, 1.0)
    cell = next(c for c in summary_table(rows, ["plain", "fast"], "t", 3).columns if c.header == "fast")._cells[0]
    assert "each run 2.40 2.16 1.92" in cell and f"{fast.speedup_low:.2f}-{fast.speedup_high:.2f}" in cell
    once = summary.summarize([t for t in trials if t.repeat == 0], ["plain", "fast"], compare_texts=False)
    assert all(r.repeat_speedups is None for r in once)


def test_prompts_where_a_method_emitted_nothing_are_left_out_of_speeds():
    empty = trial("2", "qa", "lookup", 0)  # the model stopped at once: 0 tokens, no throughput
    trials = [trial("1", "qa", "plain", 100), trial("1", "qa", "lookup", 200),
              trial("2", "qa", "plain", 100), empty]
    rows = {(r.group, r.method): r for r in summary.summarize(trials, ["plain", "lookup"], compare_texts=True)}
    assert rows[("qa", "lookup")].speedup == 2.0 and rows[("qa", "lookup")].tokens_per_s == 200
    assert rows[("qa", "lookup")].n_prompts == 2  # still compared for losslessness


def test_auto_times_the_context_term_after_a_long_prompt_with_the_draft_holding_that_prompt():
    """auto's draft reads prompts lazily, yet its context term must be timed after the prompt's
    context (the fake context refuses a decode whose earlier positions hold no KV), and the lazy
    draft must find its context empty again afterwards."""
    session, cfg = fake_session(with_draft=True, n_ctx=2048)
    runner = Runner(replace(cfg, method="auto", max_tokens=8), session)
    long_prompt = "".join(chr(97 + (i * 7) % 26) for i in range(600))
    runner.run(runner.ask(Prompt(0, long_prompt)))
    tokens = session.target.tokenize(long_prompt)
    n_past = len(tokens) - 1
    assert session.costs.per_context_at == n_past and session.draft_costs.per_context_at == n_past
    read: list[int] = []
    for call in session.draft_ctx.calls:  # the prompt, read in n_batch chunks for the measurement
        if len(read) >= n_past:
            break
        read += call.tokens
    assert read == tokens[:-1]


def test_only_auto_decodes_through_the_timing_wrappers():
    """Other methods share the session's contexts, but their decodes must not move auto's curves."""
    session, cfg = fake_session(with_draft=True)
    for method in ("plain", "lookup", "staged"):
        runner = Runner(replace(cfg, method=method, max_tokens=8), session)
        runner.run(runner.ask(Prompt(0, "abcabcabc")))
    levels = lambda c: (c.scale, c.batch_scale)  # noqa: E731
    assert levels(session.costs) == (1.0, 1.0) and levels(session.draft_costs) == (1.0, 1.0)
    runner = Runner(replace(cfg, method="auto", max_tokens=8), session)
    runner.run(runner.ask(Prompt(0, "abcabcabc")))
    assert levels(session.costs) != (1.0, 1.0)  # fake decodes take microseconds, far below the curve


def test_bench_on_fake_backend_is_lossless_and_interleaved():
    session, cfg = fake_session(with_draft=True)
    runners = {m: Runner(replace(cfg, method=m, max_tokens=24), session) for m in FAKE_METHODS}
    prompts = suites.select(suites.parse_question_file(question_lines(3), "q.jsonl"), per_group=2)
    done = []
    trials = run.run_bench(prompts, runners, repeats=1, on_trial=done.append)
    assert set(FAKE_METHODS) == set(METHODS)
    assert [t.method for t in trials[:len(FAKE_METHODS)]] == list(FAKE_METHODS)
    assert len(done) == len(prompts) * len(FAKE_METHODS)
    rows = summary.summarize(trials, FAKE_METHODS, compare_texts=True)
    assert all(r.lossless_mismatches == 0 for r in rows)  # every method reproduces plain greedy text
    assert {r.group for r in rows} == {"mt_bench", "translation", "rag", summary.OVERALL}
    assert all(r.n_prompts == 2 for r in rows if r.group != summary.OVERALL)


def test_svg_chart_has_a_bar_per_group_and_method_and_the_plain_line():
    trials = [trial("1", "qa", "plain", 100), trial("1", "qa", "lookup", 150), trial("1", "qa", "auto", 200)]
    svg = svg_chart(summary.summarize(trials, ["plain", "lookup", "auto"], compare_texts=True), "title <&>")
    root = ET.fromstring(svg)  # well-formed, title escaped
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert "qa lookup: 1.50x" in titles and "overall auto: 2.00x" in titles and "plain = 1.0x" in titles


def test_plot_name_checked_before_running(tmp_path):
    with pytest.raises(ConfigError, match="--plot expects a .svg or .png file name, found 'chart.pdf'"):
        check_plot_path(tmp_path / "chart.pdf")
    check_plot_path(tmp_path / "chart.svg")


def test_png_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"--plot \.png needs matplotlib .*or write \.svg"):
        check_plot_path(tmp_path / "chart.png")


def test_png_chart_written(tmp_path):
    pytest.importorskip("matplotlib")  # optional: pip install 'specgen[plot]'
    from specgen.bench.view import write_plot

    trials = [trial("1", "qa", "plain", 100), trial("1", "qa", "lookup", 150)]
    write_plot(summary.summarize(trials, ["plain", "lookup"], compare_texts=True), tmp_path / "c.png", "t")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.real
def test_bench_cli_small_real_run(tmp_path):
    """smollm2, 2 prompts, 16 tokens: table on stdout, JSON with the stable keys (the calibration
    auto planned with, how busy the machine was), an SVG chart."""
    out, plot = tmp_path / "bench.json", tmp_path / "bench.svg"
    r = specgen("bench", "-m", "smollm2-135m-instruct-q4_1", "--methods", "lookup,auto", "-n", "16", "--limit", "2",
                "--split", "report", "--json", str(out), "--plot", str(plot), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "overall" in r.stdout and "lookup" in r.stdout and "Traceback" not in r.stderr
    report = json.loads(out.read_text())
    assert set(report) == {"run", "machine", "models", "settings", "calibration", "records", "summary",
                           "head_to_head"}
    assert report["run"]["date"] and len(report["run"]["commit"] or "0" * 40) == 40  # None outside a git checkout
    assert report["head_to_head"] == []  # per prompt against other tools' rows: none without --llama-cpp
    assert {"cpu", "cores", "threads", "load_average", "load_average_at_end", "others_cores", "backend",
            "llama_cpp"} <= set(report["machine"])
    target_curve = report["calibration"]["target"]
    assert {"sizes", "seconds", "spread", "passes", "busy_cores", "measured_at"} <= set(target_curve["at_start"])
    assert target_curve["source"] in ("cached", "measured") and target_curve["scale_at_end"] > 0
    assert report["calibration"]["draft"] is None
    assert len(report["models"]["target"]["sha256"]) == 64 and report["models"]["draft"] is None
    assert len(report["records"]) == 2 * 3
    assert report["settings"]["split"] == "report"
    assert {rec["prompt_id"] for rec in report["records"]} == {"mt_bench-2", "translation-2"}  # even: report half
    assert {"group", "prompt_id", "repeat", "text", "tokens_per_s", "finish_reason"} <= set(report["records"][0])
    rows = {(r["group"], r["method"]): r for r in report["summary"]}
    assert set(rows[("overall", "lookup")]) == {"group", "method", "tokens_per_s", "speedup", "mean_accepted",
                                                "acceptance_rate", "lossless_mismatches", "n_prompts",
                                                "median_speedup", "speedup_low", "speedup_high", "within_noise",
                                                "turn", "forced_drafted", "forced_accepted", "over_jump",
                                                "repeat_speedups"}
    assert rows[("overall", "lookup")]["over_jump"] is None  # no grammar: no jump row
    recs = {(r["prompt_id"], r["method"]): r for r in report["records"]}
    pids = {pid for pid, _ in recs}
    differing = sum(recs[(pid, "lookup")]["text"] != recs[(pid, "plain")]["text"] for pid in pids)
    assert rows[("overall", "lookup")]["lossless_mismatches"] == differing
    ET.fromstring(plot.read_text())


def test_bench_cli_errors_are_one_line():
    r = specgen("bench", "-m", "smollm2-135m-instruct-q4_1", "--methods", "chain", "--limit", "1")
    assert r.returncode != 0 and "needs a draft model" in r.stderr and "Traceback" not in r.stderr
    r = specgen("bench", "-m", "smollm2-135m-instruct-q4_1", "--per-group", "0")
    assert r.returncode == 2 and "--per-group must be at least 1, found 0" in r.stderr  # a usage error
    r = specgen("bench", "-m", "smollm2-135m-instruct-q4_1", "--split", "both")
    assert r.returncode == 2 and "--split expects all, tune, report, found 'both'" in r.stderr
    r = specgen("bench", "-m", "smollm2-135m-instruct-q4_1", "--category", "qa,poetry")
    assert r.returncode == 2 and ("--category expects categories of the suite (mt_bench, translation, summarization, "
                                  "qa, math_reasoning, rag, code), found 'poetry'") in r.stderr


def test_a_rival_that_wrote_nothing_leaves_the_other_methods_speeds_whole():
    """llama.cpp's ngram-cache wrote 0 tokens on both summarization prompts of a pair A run: the
    group's every row was left without a timed prompt and `auto` printed 0.00x there. Each method's
    speed is over the prompts that it and plain both wrote tokens on."""
    trials = [trial("1", "summarization", "plain", 100), trial("1", "summarization", "auto", 150),
              trial("1", "summarization", "llama.cpp ngram-cache", 0),
              trial("2", "summarization", "plain", 100), trial("2", "summarization", "auto", 130),
              trial("2", "summarization", "llama.cpp ngram-cache", 0)]
    rows = {(r.group, r.method): r for r in summary.summarize(trials, ["plain", "auto", "llama.cpp ngram-cache"],
                                                              compare_texts=False)}
    assert rows[("summarization", "auto")].tokens_per_s == 140 and rows[("summarization", "auto")].speedup == 1.4
    assert rows[("summarization", "plain")].speedup == 1.0
    assert rows[("summarization", "llama.cpp ngram-cache")].tokens_per_s == 0.0  # nothing timed: no speed
