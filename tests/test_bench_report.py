"""Published tables: README.md's and docs/measurements.md's benchmark tables are what `specgen
bench-report` renders from the checked-in results files; rendering, publishing and the CLI's checks."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clihelp import assert_one_line_error, specgen
from harness import CHECKED_PAGES as CHECKED
from specgen.bench import llamacpp, prose, published
from specgen.cli import app

ROOT = Path(__file__).resolve().parents[1]
SHA = "ab" * 32


@pytest.mark.parametrize("page", ["README.md", "docs/measurements.md", "docs/structured-output.md",
                                  "docs/agent-bench.md"])
def test_the_published_tables_are_rendered_from_the_checked_in_results(page):
    found = published.blocks(ROOT / page)
    assert found, f"{page} has no bench-table block"
    for files, body, fresh in found:
        assert all(f.is_file() and f.resolve().is_relative_to(ROOT / "docs" / "results") for f in files), files
        assert body == fresh, (f"{page}'s table differs from what {[str(f) for f in files]} render; run: "
                               f"specgen bench-report --update {page}")


# Pages with passages whose figures outside them are not all bound yet: their passages must check
# (bound passages by key; agent-bench's, screening-and-kernels' and gpu's are not bound yet and get
# the value-alone check: bindings drafted by matching values named wrong keys, so they were not kept).
PASSAGES = ["docs/structured-output.md", "docs/screening-and-kernels.md", "docs/gpu.md", "docs/losslessness.md",
            "docs/agent-bench.md"]


@pytest.mark.parametrize("page", CHECKED)
def test_every_checked_page_passes_check_its_tables_and_prose_as_their_files_give(page):
    """What `specgen bench-report --check PAGE` checks (tests/test_bench_report_binding.py alters each figure)."""
    assert published.stale(ROOT / page) == [] and prose.problems(ROOT / page) == []


@pytest.mark.parametrize("page", PASSAGES)
def test_the_passages_of_the_other_pages_check(page):
    assert [p for p in prose.problems(ROOT / page) if "is bound to no file" not in p] == []


def test_check_reads_each_figure_from_the_key_it_names(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text(json.dumps(report()))
    auto = "summary[method=auto,group=overall]"
    page = tmp_path / "page.md"
    page.write_text(f"<!-- figures: results/r.json\n2.20x  {auto}.speedup\n1.90-2.50x  {auto}.speedup_low | "
                    f"{auto}.speedup_high\n3.40  {auto}.mean_accepted\n71%  100 * {auto}.acceptance_rate\n"
                    f"4/4  {auto}.n_prompts - {auto}.lossless_mismatches | {auto}.n_prompts\n-->\n"
                    "`auto` ran at 2.20x (1.90-2.50x, τ 3.40, 71%, 4/4).\n<!-- figures:end -->\n")
    assert CliRunner().invoke(app, ["bench-report", "--check", str(page)]).exit_code == 0
    page.write_text(page.read_text().replace("2.20x", "2.30x"))  # both the prose and its binding line
    assert_one_line_error(specgen("bench-report", "--check", str(page)), "the prose quotes 2.30x, its files give 2.20x")
    page.write_text(page.read_text().replace("2.30x (", "2.20x ("))  # the prose alone
    assert "figure 1 is 2.20x, its binding's 2.30x" in prose.problems(page)[0]
    page.write_text(page.read_text().replace("2.30x", "2.20x") + "\nAnd 1.20x, unbound.\n")
    assert prose.problems(page) == [f"{page}:11: 1.20x is bound to no file: bind it in a figures passage, or move "
                                    "it under a History heading"]
    page.write_text(page.read_text() + "\n## History (not re-measured)\n\nOnce 9.99x.\n")
    assert len(prose.problems(page)) == 1


def test_a_key_must_name_one_value_never_search(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text(json.dumps(report()))
    page = tmp_path / "page.md"
    page.write_text("<!-- figures: results/r.json\n2.20x  summary[method=auto].speedup\n-->\nAt 2.20x.\n"
                    "<!-- figures:end -->\n")
    assert "names 2 values, not one" in prose.problems(page)[0]


def test_figures_are_read_whole_and_written_as_the_prose_writes_them():
    from specgen.bench import numbers

    text = ("gemma-3-270m at 1.47x (1.47-2.25x, −3%, +50%, 1,553/1,600, 0.56–0.61x, **1.86x**) on 2026-11-27, "
            "v0.3.36, T=0.7, 12 of 12, 90% interval, issue 67, `--vocab 65536`, Q4_K_M, 8B.")
    assert prose.figures(text) == ["1.47x", "1.47-2.25x", "−3%", "+50%", "1,553/1,600", "0.56–0.61x", "1.86x",
                                   "12", "12"]
    assert numbers.format_like("1,553/1,600", [1553, 1600]) == "1,553/1,600"
    assert numbers.format_like("1.40x", [1.2]) == "1.20x" and numbers.format_like("+50%", [49.6]) == "+50%"
    assert numbers.format_like("−3%", [3.0]) == "+3%" and numbers.format_like("0.971", [0.970625]) == "0.971"


def test_prose_may_quote_a_checked_in_file_that_is_not_a_bench_file(tmp_path):
    """A log, a junit XML or a script's JSON is no bench results file: a log's figures are named by
    line and word, a JSON's by its keys."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "check.log").write_text("  8  1.1   1.22  0.14\n")
    (tmp_path / "results" / "steps.json").write_text(json.dumps({"seconds": 28.4}))
    page = tmp_path / "page.md"
    page.write_text("<!-- figures: log=results/check.log s=results/steps.json\n8  log:lines[0][0]\n1  log:lines[0][1]\n"
                    "1.22  log:lines[0][2]\n28.4  s:seconds\n-->\nc(8)/c(1) = 1.22, all in 28.4 s.\n"
                    "<!-- figures:end -->\n")
    assert prose.problems(page) == []
    page.write_text(page.read_text().replace("1.22", "1.23"))
    assert "the prose quotes 1.23, its files give 1.22" in prose.problems(page)[0]


def test_structured_output_token_sources_are_counted_from_the_greedy_records():
    """structured-output.md's "Where the tokens come from" is what the greedy files' `auto` records sum to."""
    import re

    def auto(name):
        return [r for r in published.load(ROOT / "docs" / "results" / name)["records"] if r["method"] == "auto"]

    compact, free = auto("2026-11-27-json-greedy.json"), auto("2026-11-27-json-free-greedy.json")
    by = {k: sum(r["accepted_by"].get(k, 0) for r in compact) for k in ("forced", "loop", "lookup", "history")}
    n, calls = sum(r["n_tokens"] for r in compact), sum(r["target_calls"] for r in compact)
    forced = sorted(r["forced_accepted"] for r in compact), sorted(r["forced_accepted"] for r in free)
    expected = (f"{n} tokens in {calls} target calls; {by['forced']} forced, and of the drafters' accepted tokens "
                f"{by['loop']} from loops in the answer, {by['lookup']} from the prompt (lookup), {by['history']} from "
                f"history. Forced tokens are {forced[0][0]}-{forced[0][-1]} per answer with `compact` "
                f"({by['forced'] / n:.0%}) and {forced[1][0]}-{forced[1][-1]} with `free`")
    page = re.sub(r"\s+", " ", (ROOT / "docs" / "structured-output.md").read_text())
    assert expected in page


def test_published_results_carry_what_a_reader_needs_to_trust_them():
    for path in sorted((ROOT / "docs" / "results").glob("*.json")):
        data = published.load(path)
        assert data["run"]["date"][:10] == path.name[:10] and len(data["run"]["commit"]) == 40
        assert data["settings"]["split"] == "report", f"{path.name}: published tables use the report half"
        assert len(data["models"]["target"]["sha256"]) == 64
        assert data["models"]["draft"] is None or len(data["models"]["draft"]["sha256"]) == 64
        assert all("text" not in r and len(r["text_sha256"]) == 64 for r in data["records"])  # publish()


def report(**settings) -> dict:
    row = dict(group="overall", turn=None, n_prompts=4, lossless_mismatches=0, speedup_low=0.0, speedup_high=0.0,
               median_speedup=1.0, within_noise=False, mean_accepted=1.0, acceptance_rate=0.0)
    summary = [{**row, "method": "plain", "tokens_per_s": 50.0, "speedup": 1.0},
               {**row, "method": "auto", "tokens_per_s": 110.0, "speedup": 2.2, "speedup_low": 1.9,
                "speedup_high": 2.5, "mean_accepted": 3.4, "acceptance_rate": 0.71},
               {**row, "method": "auto", "group": "qa", "tokens_per_s": 100.0, "speedup": 2.0},
               {**row, "method": "llama.cpp draft-simple (-d self, whole vocabulary)", "tokens_per_s": 60.0,
                "speedup": 1.2, "lossless_mismatches": 1, "mean_accepted": 2.0, "acceptance_rate": 0.5}]
    model = {"name": "gemma-3-270m-f32-self", "sha256": SHA, "file_type": "Q4_K_M", "head_type": "Q8_0",
             "n_vocab": 65964, "vocabulary_cut": True}
    return {"run": {"date": "2026-11-26T12:00:00+00:00", "commit": "c" * 40, "modified": []},
            "machine": {"cpu": "Some CPU", "cores": 2, "threads": 2, "backend": "cpu", "others_cores": 1.07,
                        "llama_cpp": {"system_info": "CPU : AVX2 = 1 | AVX512 = 0"}},
            "models": {"target": {"name": "t", "sha256": "cd" * 32, "file_type": "F32"}, "draft": model,
                       "llama_cpp_draft": None},
            "settings": {"suite": "/x/question.jsonl", "split": "report", "per_group": 2, "n_prompts": 4,
                         "max_tokens": 128, "temperature": 0.0, "repeats": 1,
                         "methods": ["plain", "auto", "llama.cpp draft-simple (-d self, whole vocabulary)"],
                         **settings},
            "records": [{"method": "plain", "text": "secret words", "turns": [{}, {}]},
                        *({"method": "plain", "text": "more"} for _ in range(3))],
            "summary": summary,
            "head_to_head": [{"method": "auto", "n_prompts": 4, "wins": 3,
                              "losses": [{"prompt_id": "q8", "rival": "llama.cpp plain", "ratio": 0.9}]}]}


def test_a_rendered_table_names_its_date_commit_machine_suite_and_recorded_draft():
    text = published.render(report(), "results/x.json")
    assert ("2026-11-26 · commit cccccccccc · Some CPU (AVX2), 2 cores, 2 threads, cpu (other processes used 1.07 "
            "of its 2 cores meanwhile)") in text
    assert "question.jsonl, report half: 2 prompts per group, 4 prompts, 5 turns, 128 tokens, greedy, one run" in text
    assert "| specgen `auto` | 110.0 | **2.20x** | 1.90-2.50x | 3.40 | 71% | 4/4 |" in text
    assert "| llama.cpp draft-simple (-d self, whole vocabulary) | 60.0 | 1.20x |  | 2.00 | 50% | 3/4 |" in text
    assert "`auto` by group: qa 2.00x." in text
    assert "as fast or faster on 3 of 4; slower by more than 5% on 1: q8 at 0.90x (llama.cpp plain)." in text
    assert (f"- specgen's draft: gemma-3-270m-f32-self (Q4_K_M, embedding/output Q8_0, vocabulary cut to 65,964 "
            f"tokens), sha256 `{SHA}`") in text
    assert "interrupted" in published.render(report(interrupted=True), "x.json")


def test_a_caption_states_the_load_its_file_recorded_quiet_or_not():
    """The load comes from the file only: a quiet run says how quiet (prose cannot contradict it), a
    file without the measurement says so."""
    quiet = report()
    quiet["machine"]["others_cores"] = 0.0097
    assert "cpu (other processes used 0.01 of its 2 cores meanwhile)" in published.render(quiet, "x.json")
    del quiet["machine"]["others_cores"]
    assert "cpu (other processes' load not recorded)" in published.render(quiet, "x.json")


def test_the_lead_over_llama_cpp_plain_is_split_into_plain_against_plain_and_speculation():
    data = report()
    row = {**data["summary"][0], "method": "llama.cpp plain", "tokens_per_s": 25.0, "speedup": 0.5}
    data["summary"].append(row)
    data["models"]["target"]["head_type"] = "F32"
    data["models"]["target_screened"] = "/cache/screened/t-q8_0-head.gguf"
    text = published.render(data, "x.json")
    assert "by its parts: 4.40x = specgen `plain` at 2.00x llama.cpp plain (specgen's plain is screened" in text
    assert "this run has no `plain, unscreened` row" in text and "× `auto` at 2.20x specgen `plain` (speculation)" in text
    data["summary"].append({**row, "method": "plain, unscreened", "tokens_per_s": 40.0, "speedup": 0.8})
    data["settings"]["methods"].append("plain, unscreened")
    assert ("`plain, unscreened` runs at 0.80x specgen's plain: screening 1.25x, the two plain decoders' other "
            "differences 1.60x") in published.render(data, "x.json")
    assert "| specgen `plain, unscreened` | 40.0 | 0.80x |  |  |  | 4/4 |" in published.render(data, "x.json")
    data["models"]["target_screened"] = None
    assert "(nothing screened; the target's output layer is F32)" in published.render(data, "x.json")


def test_publishing_replaces_generated_texts_by_their_sha256():
    out = published.publish(report())
    assert "secret" not in json.dumps(out) and len(out["records"][0]["text_sha256"]) == 64


def test_check_fails_on_a_stale_table_and_update_renders_it(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text(json.dumps(report()))
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n<!-- bench-table: results/r.json -->\nhand-typed\n<!-- bench-table:end -->\n\nafter\n")
    assert_one_line_error(specgen("bench-report", "--check", str(page)), "differs from what they render")
    result = CliRunner().invoke(app, ["bench-report", "--update", str(page), "--check", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert text.startswith("# Title\n\n<!-- bench-table: results/r.json -->\n*2026-11-26") and text.endswith(
        "<!-- bench-table:end -->\n\nafter\n")
    assert "[r.json](results/r.json)" in text and "hand-typed" not in text


def test_markers_shown_as_examples_in_code_are_not_read(tmp_path):
    """A page may show the markers in a fenced code block or inline code (docs/benchmarking.md does):
    --check and --update read only markers on lines of their own, outside fences."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text(json.dumps(report()))
    example = ("```\n<!-- bench-table: results/none.json -->\n(rendered)\n<!-- bench-table:end -->\n"
               "<!-- figures: results/none.json -->\nat 9.99x\n<!-- figures:end -->\n```\n")
    page = tmp_path / "page.md"
    page.write_text(f"Between `<!-- figures: FILES -->` and `<!-- figures:end -->`:\n\n{example}\n"
                    "<!-- bench-table: results/r.json -->\nhand-typed\n<!-- bench-table:end -->\n")
    result = CliRunner().invoke(app, ["bench-report", "--update", str(page), "--check", str(page)])
    assert result.exit_code == 0, result.output
    assert example in page.read_text() and "hand-typed" not in page.read_text()
    page.write_text(example.strip("`\n") + "\n")  # the same markers outside the fence are read
    assert_one_line_error(specgen("bench-report", "--check", str(page)), "cannot read bench results")


def test_bad_inputs_are_one_line_errors(tmp_path):
    (tmp_path / "bad.json").write_text("{}")
    assert_one_line_error(specgen("bench-report", str(tmp_path / "bad.json")), "is not a `specgen bench --json` file")
    assert_one_line_error(specgen("bench-report", str(tmp_path / "none.json")), "cannot read bench results")
    assert_one_line_error(specgen("bench-report"), "expects results files")


def test_a_llama_cpp_draft_row_says_which_draft_it_loaded():
    assert llamacpp.method_name("draft-simple", "-d self, whole vocabulary") == \
        "llama.cpp draft-simple (-d self, whole vocabulary)"
    assert llamacpp.method_name("ngram-mod", "gemma-3-270m-q2_k") == "llama.cpp ngram-mod"
    assert llamacpp.method_name("draft-simple") == "llama.cpp draft-simple"


def test_every_llama_cpp_draft_row_names_the_draft_it_loaded():
    """A results file whose draft-mode row was named without its draft (the bench's own draft, as
    2026-11-26-pair-a-q2k.json has it) is rendered with the draft's name from models.llama_cpp_draft."""
    data = report()
    data["settings"]["methods"] = ["plain", "auto", "llama.cpp draft-simple"]
    data["summary"][-1]["method"] = "llama.cpp draft-simple"
    data["models"]["llama_cpp_draft"] = {"name": "gemma-3-270m-q2_k", "sha256": SHA, "file_type": "Q2_K"}
    assert "| llama.cpp draft-simple (gemma-3-270m-q2_k) | 60.0 |" in published.render(data, "x.json")


def test_a_bench_run_names_its_own_draft_in_llama_cpp_draft_rows(gemma_path):
    """The bench's own draft (not vocabulary-cut) is what llama.cpp loads: the row says which."""
    from types import SimpleNamespace

    from specgen.bench import drafts

    session = SimpleNamespace(draft=SimpleNamespace(path=str(gemma_path), subset_of_target=None),
                              draft_label="gemma-3-270m-q4_k_m")
    draft = drafts.for_llama_cpp(session)
    assert llamacpp.method_name("draft-simple", draft.label) == "llama.cpp draft-simple (gemma-3-270m-q4_k_m)"


def _rendered(page: str, marker: str, script: str):
    """The table a page holds between `<!-- MARKER: FILE -->` and `<!-- MARKER:end -->`, the
    results file it names, and the script (module) that renders such files."""
    import importlib.util
    import re
    import sys

    text = (ROOT / "docs" / page).read_text()
    found = re.search(rf"<!-- {marker}: (\S+) -->\n(.*?)\n<!-- {marker}:end -->", text, re.S)
    assert found is not None, f"docs/{page} has no {marker} marker"
    spec = importlib.util.spec_from_file_location(script, ROOT / "scripts" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[script] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    name = found.group(1)  # from the checkout's root (docs/...) or from the page's folder
    return found.group(2), ROOT / name if name.startswith("docs/") else ROOT / "docs" / name, module


def test_the_oracle_samples_only_under_a_seed():
    """scripts/oracle.py compares auto's text with plain's: sampled (-t, --llama-server-sampler), both
    must write the one text a seed gives, so a sampled ceiling without --seed is refused in one line."""
    import subprocess
    import sys

    for flag in (["-t", "0.7"], ["--llama-server-sampler"]):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "oracle.py"), "-c", "configs/bench-pair-c.yaml",
                               "--suite", "builtin", *flag], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 2 and "--temperature needs --seed" in done.stderr.splitlines()[-1], done.stderr


def test_the_oracle_table_in_auto_md_is_rendered_from_its_results_file():
    """docs/auto.md's ceiling table is scripts/oracle.py's rendering of the file its marker names."""
    table, path, oracle = _rendered("auto.md", "oracle-table", "oracle")
    assert table == oracle.table(path)
    quoted, quoted_path, _ = _rendered("auto.md", "oracle-figures", "oracle")  # the prose under it
    assert quoted_path == path and set(prose.figures(quoted)) <= set(prose.figures(table)), quoted


def test_the_draft_agreement_figures_are_rendered_from_their_results_file():
    """measurements.md's agreement table is scripts/draft_agreement.py's rendering of the file its
    marker names, and the README quotes the same agreements."""
    import re

    table, path, script = _rendered("measurements.md", "agreement-table", "draft_agreement")
    assert table == script.table(path)
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    data = json.loads(path.read_text())
    for draft in data["drafts"]:
        assert f"{draft['agreement']:.3f} ({draft['agreed']:,}/{data['n_tokens']:,})" in readme, draft["name"]


def test_the_layout_table_in_structured_output_md_is_rendered_from_its_results_file():
    """docs/structured-output.md's default-layout table is scripts/json_validity.py's rendering of
    the file its marker names, and the default layout is the one that won on the tune half there."""
    import json

    from specgen.app.config import RunConfig

    table, path, script = _rendered("structured-output.md", "layout-table", "json_validity")
    assert table == script.table(path)
    answers = json.loads(path.read_text())["answers"]
    tune = {layout: sum(a["valid"] for a in answers if a["layout"] == layout and a["half"] == "tune")
            for layout in script.LAYOUTS}
    assert tune[RunConfig().json_layout] == max(tune.values())


def test_the_prefill_table_in_serve_md_is_rendered_from_its_results_file():
    """docs/serve.md's prefill table (specgen's prompt reading against llama-bench's) is
    scripts/prefill_bench.py's rendering of the file its marker names (each of them), and that file holds every
    round of every configuration it names."""
    import json

    import re

    _, _, script = _rendered("serve.md", "prefill-table", "prefill_bench")
    found = re.findall(r"<!-- prefill-table: (\S+) -->\n(.*?)\n<!-- prefill-table:end -->",
                       (ROOT / "docs" / "serve.md").read_text(), re.S)
    assert len(found) >= 2  # this day's table and the earlier ones under History
    for name, table in found:
        path = ROOT / "docs" / name
        assert table == script.table(path), name
        data = json.loads(path.read_text())
        cells = {(x["model"], x["threads"], x["n_prompt"]) for x in data["samples"]}
        for model, threads, n in cells:
            for config in data["settings"]["configs"]:
                rounds = [x["round"] for x in data["samples"] if (x["model"], x["threads"], x["n_prompt"]) ==
                          (model, threads, n) and x["config"] == config]
                assert sorted(rounds) in ([], list(range(data["settings"]["rounds"]))), (model, threads, n, config)


def test_the_op_profiles_in_screening_and_kernels_md_are_rendered_from_their_results_files():
    """Each per-op profile in docs/screening-and-kernels.md is scripts/op_profile.py's rendering of the
    file its marker names, and that file holds each of its models in each of its settings (the
    script's), every round."""
    import json
    import re

    _, _, script = _rendered("screening-and-kernels.md", "profile-table", "op_profile")
    text = (ROOT / "docs" / "screening-and-kernels.md").read_text()
    blocks = re.findall(r"<!-- profile-table: (\S+) -->\n(.*?)\n<!-- profile-table:end -->", text, re.S)
    assert len(blocks) == 7, ("the shipped quantized models, the F32 target, an AVX2 build, the other weight types, "
                             "gemma's K-quant layouts, and in an AVX2 build, the derived smollm2 models' layouts")
    for name, table in blocks:
        path = ROOT / "docs" / name
        assert table == script.table(path), name
        data = json.loads(path.read_text())
        settings, models = list(data["settings"]["env"]), {r["model"] for r in data["runs"]}
        assert set(settings) <= set(script.SETTINGS), name
        runs = {(r["model"], r["setting"], r["round"]) for r in data["runs"]}
        assert runs == {(m, s, r) for m in models for s in settings for r in range(data["settings"]["rounds"])}, name

def test_an_unbound_passage_still_quotes_only_values_its_files_give(tmp_path):
    """A passage whose marker binds nothing (a page not converted yet) gets the value-alone check:
    a figure no file gives fails, naming the weaker check; one the files give passes."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text(json.dumps(report()))
    (tmp_path / "results" / "s.json").write_text(json.dumps(report()))
    page = tmp_path / "page.md"
    page.write_text("<!-- figures: results/r.json results/s.json -->\n`auto` ran at 2.20x.\n<!-- figures:end -->\n")
    assert [p for p in prose.problems(page) if "bound to no file" not in p] == []
    page.write_text(page.read_text().replace("2.20x", "2.30x"))
    assert any("2.30x is in no value its files give" in p and "value alone" in p for p in prose.problems(page))
