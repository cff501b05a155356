"""specgen bench on constrained prompts: jump-forward runs beside plain, forced tokens are counted
apart from the drafters' τ and acceptance, and each method's speed over jump is shown."""

import dataclasses
import json
from dataclasses import replace

import pytest

from specgen.app.runner import Runner
from specgen.bench import run, suites, summary
from specgen.core.constraint import ConstraintSpec
from specgen.core.stats import RunStats
from clihelp import specgen
from fakes import fake_session, question_lines, trial


def constrained_trial(pid, method, tps, drafted=0, accepted=0, forced=0, calls=10, committed=20):
    s = RunStats(n_tokens=int(tps), decode_s=1.0, target_calls=calls, n_committed=committed, drafted=drafted,
                 accepted=accepted, forced_drafted=forced, forced_accepted=forced)
    return run.Trial(suites.BenchPrompt("extract", pid, ("x",)), method, 0, "same", s, "length")


def test_constrained_rows_count_forced_tokens_apart_and_show_the_ratio_over_jump():
    from specgen.bench.published import _table
    from specgen.bench.view import _cell

    trials = [constrained_trial("1", "plain", 100, calls=20),
              constrained_trial("1", "jump", 150, forced=8, calls=12),  # 20 tokens: 8 forced + 12 calls
              constrained_trial("1", "auto", 240, drafted=8, accepted=4, forced=8, calls=8)]
    rows = {r.method: r for r in summary.summarize(trials, ["plain", "jump", "auto"], compare_texts=True)
            if r.group == summary.OVERALL}
    assert (rows["jump"].mean_accepted, rows["jump"].forced_drafted, rows["jump"].forced_accepted) == (1.0, 8, 8)
    assert (rows["auto"].mean_accepted, rows["auto"].acceptance_rate) == (1.5, 0.5)  # (20 - 8) / 8; 4 of 8
    assert rows["auto"].over_jump == pytest.approx(240 / 150, abs=1e-3) and rows["jump"].over_jump == 1.0
    cell = _cell(rows["auto"], 1)
    assert "forced 8/8" in cell and "1.60x jump" in cell and "τ1.50 50%" in cell
    assert "τ" not in _cell(rows["jump"], 1)  # jump drafts nothing of its own
    table = _table({m: dataclasses.asdict(r) for m, r in rows.items()}, ["plain", "jump", "auto"], 1, True)
    cells = [[c.strip() for c in line.split("|")] for line in table]
    assert cells[0][5:10] == ["τ", "accepted", "forced", "over jump", "identical to plain"]
    assert cells[3][5:10] == ["", "", "8/8", "", "1/1"]  # jump: no τ, no acceptance, no ratio to itself
    assert cells[4][5:10] == ["1.50", "50%", "8/8", "1.60x", "1/1"]
    unconstrained = summary.summarize([trial("1", "qa", "plain", 100), trial("1", "qa", "lookup", 150)],
                                      ["plain", "lookup"], compare_texts=True)
    assert all(r.over_jump is None and r.forced_drafted == 0 for r in unconstrained)
    assert "jump" not in _cell(unconstrained[-1], 1) and "forced" not in _cell(unconstrained[-1], 1)


FORCING = ConstraintSpec("lark", json.dumps([[[12], [13], [14], list(range(2, 10)), list(range(2, 10)), [15]]]))


def test_constrained_bench_on_fake_backend_runs_jump_and_counts_forced_tokens():
    session, cfg = fake_session(with_draft=False)
    methods = run.parse_methods("lookup,auto", constrained=True)
    runners = {m: Runner(replace(cfg, method=m, max_tokens=24), session) for m in methods}
    prompts = [replace(p, constraint=FORCING)
               for p in suites.select(suites.parse_question_file(question_lines(2), "q.jsonl"), per_group=1)
               if len(p.turns) == 1]
    trials = run.run_bench(prompts, runners, repeats=1)
    rows = {r.method: r for r in summary.summarize(trials, methods, compare_texts=True) if r.group == summary.OVERALL}
    assert list(rows) == ["plain", "jump", "lookup", "auto"] and all(r.lossless_mismatches == 0 for r in rows.values())
    assert rows["plain"].forced_drafted == 0 and rows["jump"].forced_accepted == 4 * len(prompts)  # 12 13 14, 15
    assert rows["jump"].mean_accepted == 1.0 and rows["auto"].over_jump is not None
    calls = {m: sum(t.stats.target_calls for t in trials if t.method == m) for m in methods}
    assert calls["jump"] < calls["plain"]


@pytest.mark.real
def test_constrained_bench_cli_has_a_jump_row(tmp_path):
    """`--suite json` on two prompts: jump-forward runs after plain without being asked, its texts
    are plain's, drafting's gain over it is in the summary, and forced tokens are counted apart."""
    out = tmp_path / "bench.json"
    r = specgen("bench", "-m", "smollm2-135m-instruct-q4_1", "--suite", "json", "--methods", "lookup", "-n", "32",
                "--limit", "2", "--json", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "jump" in r.stdout and "x jump" in r.stdout and "forced" in r.stdout
    report = json.loads(out.read_text())
    assert report["settings"]["methods"] == ["plain", "jump", "lookup"]
    rows = {(r["group"], r["method"]): r for r in report["summary"]}
    jump, lookup = rows[("overall", "jump")], rows[("overall", "lookup")]
    assert jump["lossless_mismatches"] == 0 and jump["mean_accepted"] == 1.0 and jump["forced_accepted"] > 0
    assert lookup["over_jump"] > 0 and lookup["forced_drafted"] > 0
    for rec in report["records"]:
        assert rec["forced_accepted"] <= rec["forced_drafted"] and rec["accepted"] <= rec["drafted"]
        assert rec["accepted_by"].get("forced", 0) == rec["forced_accepted"]
        if rec["method"] == "jump":
            assert rec["drafted"] == 0 and rec["forced_accepted"] > 0
