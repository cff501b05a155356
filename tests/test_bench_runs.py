"""Several runs of one setting on one page (`<!-- bench-table: --runs FILE FILE -->`, runs_view.py):
each figure's median over the runs and their range, each run's own figure, each run's file named."""

import json

import pytest
from typer.testing import CliRunner

from clihelp import assert_one_line_error, specgen
from specgen.bench import published
from specgen.bench.runs_view import median_range
from specgen.cli import app
from specgen.errors import ConfigError

METHODS = ["plain", "auto", "llama.cpp plain"]


def run(auto: float, theirs: float, wins: int, commit: str, **settings) -> dict:
    row = dict(group="overall", turn=None, n_prompts=12, lossless_mismatches=0, speedup_low=0.0, speedup_high=0.0,
               median_speedup=1.0, within_noise=False, mean_accepted=1.0, acceptance_rate=0.0)
    return {"run": {"date": "2026-11-28T12:00:00+00:00", "commit": commit * 40, "modified": []},
            "machine": {"cpu": "Some CPU", "cores": 2, "threads": 1, "backend": "cpu"},
            "models": {"target": {"name": "t", "sha256": "cd" * 32}, "draft": None, "llama_cpp_draft": None},
            "settings": {"suite": "/x/question.jsonl", "split": "report", "n_prompts": 12, "max_tokens": 128,
                         "temperature": 0.8, "repeats": 1, "methods": METHODS, **settings},
            "records": [],
            "summary": [{**row, "method": "plain", "tokens_per_s": 40.0, "speedup": 1.0},
                        {**row, "method": "auto", "tokens_per_s": 40.0 * auto, "speedup": auto},
                        {**row, "method": "llama.cpp plain", "tokens_per_s": 40.0 * theirs, "speedup": theirs,
                         "lossless_mismatches": None}],
            "head_to_head": [{"method": "auto", "n_prompts": 12, "wins": wins, "losses": []}]}


def page_with(tmp_path, *runs: dict, marker: str = "--runs") -> object:
    (tmp_path / "results").mkdir(exist_ok=True)
    names = []
    for i, data in enumerate(runs):
        name = f"results/2026-11-28-pair-a-t08{'' if i == 0 else f'-run{i + 1}'}.json"
        (tmp_path / name).write_text(json.dumps(data))
        names.append(name)
    page = tmp_path / "page.md"
    page.write_text(f"<!-- bench-table: {marker} {' '.join(names)} -->\nold\n<!-- bench-table:end -->\n")
    return page


def test_runs_of_one_setting_show_the_median_the_range_and_each_run_with_its_file(tmp_path):
    page = page_with(tmp_path, run(1.54, 0.66, 12, "a"), run(1.39, 0.67, 11, "b"), run(1.50, 0.70, 12, "c"))
    result = CliRunner().invoke(app, ["bench-report", "--update", str(page), "--check", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    for name, commit in [("2026-11-28-pair-a-t08.json", "a"), ("2026-11-28-pair-a-t08-run2.json", "b"),
                         ("2026-11-28-pair-a-t08-run3.json", "c")]:
        assert f"[{name}](results/{name}): 2026-11-28 · commit {commit * 10}" in text
    assert "| specgen `auto` | **1.50x** (1.39-1.54x) | 1.54x, 1.39x, 1.50x | 60.0 (55.6-61.6) |" in text
    assert "| llama.cpp plain | 0.67x (0.66-0.70x) | 0.66x, 0.67x, 0.70x |" in text
    assert "12/12, 12/12, 12/12 |" in text
    leads = [1.54 / 0.66, 1.39 / 0.67, 1.50 / 0.70]
    assert f"`auto` against llama.cpp plain: {median_range(leads)}; each run 2.33x, 2.07x, 2.14x." in text
    assert "each run: on 12 of 12 prompts, on 11 of 12 prompts, on 12 of 12 prompts." in text
    # The same files without --runs: each run's own table, no medians.
    page.write_text(page.read_text().replace("--runs ", ""))
    assert "runs of one setting" not in "".join(fresh for _, _, fresh in published.blocks(page))


def test_a_changed_run_makes_the_page_stale(tmp_path):
    page = page_with(tmp_path, run(1.54, 0.66, 12, "a"), run(1.39, 0.67, 11, "b"))
    assert CliRunner().invoke(app, ["bench-report", "--update", str(page)]).exit_code == 0
    (tmp_path / "results" / "2026-11-28-pair-a-t08-run2.json").write_text(json.dumps(run(1.29, 0.67, 11, "b")))
    assert_one_line_error(specgen("bench-report", "--check", str(page)), "differs from what they render")


def test_runs_of_different_settings_or_a_single_run_are_refused(tmp_path):
    page = page_with(tmp_path, run(1.54, 0.66, 12, "a"), run(1.39, 0.67, 11, "b", temperature=0.7))
    with pytest.raises(ConfigError, match="is not a run of .* setting .*temperature"):
        published.blocks(page)
    (tmp_path / "one").mkdir()
    page = page_with(tmp_path / "one", run(1.54, 0.66, 12, "a"))
    with pytest.raises(ConfigError, match="two runs or more"):
        published.blocks(page)


def test_an_unknown_marker_option_is_an_error(tmp_path):
    page = page_with(tmp_path, run(1.54, 0.66, 12, "a"), run(1.39, 0.67, 11, "b"), marker="--median")
    with pytest.raises(ConfigError, match="option --median is none it knows"):
        published.blocks(page)


def test_median_and_range():
    assert median_range([1.54, 1.39]) == "1.46x (1.39-1.54x)"
    assert median_range([40.6, 46.7, 41.0], "{:.1f}") == "41.0 (40.6-46.7)"
