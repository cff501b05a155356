"""Spreads a published table computes from a results file's records (bench/spreads.py): with several
repeats per prompt, each repeat's ratio beside the median and the 90% interval over prompts, each
prompt resampled with all its repeats; auto's lead over llama.cpp plain with its interval."""

import json

from typer.testing import CliRunner

from specgen.bench import published
from specgen.bench.spreads import spread
from specgen.bench.summary import speedup_spread
from specgen.cli import app

METHODS = ["plain", "auto", "llama.cpp plain"]
# Per prompt, auto's speedup (prompts differ a lot); repeats move it a little (+-2% per repeat).
PROMPT_SPEEDUP = {"2": 1.2, "4": 2.6, "6": 1.5, "8": 2.2, "10": 1.1, "12": 2.9}
REPEAT_SHIFT = (1.02, 1.0, 0.98)


def results(repeats: int = 3) -> dict:
    records = []
    for pid, s in PROMPT_SPEEDUP.items():
        for rep in range(repeats):
            plain = 40.0 + int(pid)
            rates = {"plain": plain, "auto": round(plain * s * REPEAT_SHIFT[rep], 3), "llama.cpp plain": plain / 2}
            records += [{"method": m, "prompt_id": pid, "repeat": rep, "group": "qa", "n_tokens": 64,
                         "tokens_per_s": v, "target_calls": 64, "text_sha256": "0" * 64} for m, v in rates.items()]
    mean = {m: sum(r["tokens_per_s"] for r in records if r["method"] == m) / (len(PROMPT_SPEEDUP) * repeats)
            for m in METHODS}
    row = dict(group="overall", turn=None, n_prompts=len(PROMPT_SPEEDUP), lossless_mismatches=0, median_speedup=1.0,
               within_noise=False, mean_accepted=1.0, acceptance_rate=0.0,
               speedup_low=0.1, speedup_high=9.9)  # what an older summary said: never shown for repeated runs
    summary = [{**row, "method": m, "tokens_per_s": round(mean[m], 2), "speedup": round(mean[m] / mean["plain"], 3)}
               for m in METHODS]
    return {"run": {"date": "2026-11-27T12:00:00+00:00", "commit": "c" * 40, "modified": []},
            "machine": {"cpu": "Some CPU", "cores": 2, "threads": 1, "backend": "cpu", "others_cores": 0.5},
            "models": {"target": {"name": "t", "sha256": "cd" * 32, "file_type": "F32"}, "draft": None,
                       "llama_cpp_draft": None},
            "settings": {"suite": "/x/question.jsonl", "split": "report", "n_prompts": len(PROMPT_SPEEDUP),
                         "max_tokens": 64, "temperature": 0.0, "repeats": repeats, "methods": METHODS},
            "records": records, "summary": summary, "head_to_head": []}


def _pairs(data, method, against="plain"):
    by = {}
    for r in data["records"]:
        by.setdefault((r["prompt_id"], r["repeat"]), {})[r["method"]] = r["tokens_per_s"]
    keys = sorted(by)
    return [by[k][method] for k in keys], [by[k][against] for k in keys], [k[0] for k in keys]


def test_each_repeat_s_ratio_is_shown_beside_the_median_and_the_interval_over_prompts():
    data = results()
    text = published.render(data, "results/r.json")
    s = spread(data, "auto")
    by_repeat = [[r for r in data["records"] if r["repeat"] == rep] for rep in range(3)]
    assert s.per_repeat == tuple(round(sum(r["tokens_per_s"] for r in rs if r["method"] == "auto")
                                       / sum(r["tokens_per_s"] for r in rs if r["method"] == "plain"), 3)
                                 for rs in by_repeat)
    assert len(s.per_repeat) == 3 and s.per_repeat[0] > s.per_repeat[1] > s.per_repeat[2]
    assert "| | tok/s | over specgen plain | 90% interval | median over prompts | each repeat | τ |" in text
    cells = f"| {s.low:.2f}-{s.high:.2f}x | {s.median:.2f}x | " + ", ".join(f"{x:.2f}x" for x in s.per_repeat) + " |"
    assert f"| specgen `auto` | {data['summary'][1]['tokens_per_s']:.1f} | **{s.ratio:.2f}x** {cells}" in text
    assert "0.10-9.90x" not in text  # the interval comes from the records, not from the file's summary
    assert "each resampled with all its repeats" in text


def test_the_interval_resamples_prompts_whole_not_repeats_as_independent_prompts():
    data = results()
    mine, plain, prompts = _pairs(data, "auto")
    _, low, high, _ = speedup_spread(mine, plain, prompts)
    _, naive_low, naive_high, _ = speedup_spread(mine, plain)  # every (prompt, repeat) its own prompt
    whole, naive = f"{low:.2f}-{high:.2f}x", f"{naive_low:.2f}-{naive_high:.2f}x"
    assert high - low > naive_high - naive_low and whole != naive  # repeats as prompts: too narrow
    text = published.render(data, "results/r.json")
    row = next(line for line in text.splitlines() if line.startswith("| specgen `auto`"))
    assert whole in row and naive not in row


def test_one_repeat_keeps_the_table_of_one_run():
    text = published.render(results(repeats=1), "results/r.json")
    assert "each repeat" not in text and "| | tok/s | over specgen plain | 90% interval | τ |" in text


def test_the_lead_over_llama_cpp_plain_has_its_interval_over_prompts():
    data = results()
    data["summary"][0]["speedup"] = 1.0
    mine, theirs, prompts = _pairs(data, "auto", "llama.cpp plain")
    _, low, high, _ = speedup_spread(mine, theirs, prompts)
    text = published.render(data, "results/r.json")
    lead = next(line for line in text.splitlines() if line.startswith("`auto` against llama.cpp plain"))
    assert f"(90% interval over prompts: {low:.2f}-{high:.2f}x) = specgen `plain` at" in lead
    _, naive_low, naive_high, _ = speedup_spread(mine, theirs)
    assert f"{naive_low:.2f}-{naive_high:.2f}x" not in lead


def test_update_and_check_render_the_repeats_on_a_page(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text(json.dumps(results()))
    page = tmp_path / "page.md"
    page.write_text("<!-- bench-table: results/r.json -->\nold\n<!-- bench-table:end -->\n")
    result = CliRunner().invoke(app, ["bench-report", "--update", str(page), "--check", str(page)])
    assert result.exit_code == 0, result.output
    s = spread(results(), "auto")
    assert ", ".join(f"{x:.2f}x" for x in s.per_repeat) in page.read_text()
