"""Every figure `specgen bench-report --check` reads is bound to the one value it quotes: a copy of a
checked page with any one figure changed (its last digit one higher, in the prose and in its
binding line alike, so only the file's value can tell) fails the check, and the page as it stands
passes."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness import CHECKED_PAGES as TABLE_PAGES
from specgen.bench import numbers, prose
from specgen.cli import app

# Every page whose figures are all bound (or exempt, or under History): the pages with tables
# (harness.CHECKED_PAGES), and these pages of prose.
CHECKED = TABLE_PAGES + ["docs/losslessness.md", "docs/gpu.md", "docs/agent-bench.md", "docs/structured-output.md",
                         "docs/screening-and-kernels.md", "docs/how-it-works.md", "docs/chat.md",
                         "docs/troubleshooting.md", "docs/benchmarking.md", "docs/serve.md",
                         "docs/auto.md"]
ROOT = Path(__file__).resolve().parents[1]


def _changed(text: str, at: int, figure: str) -> str:
    assert text[at:at + len(figure)] == figure
    return text[:at] + numbers.mutated(figure) + text[at + len(figure):]


@pytest.mark.parametrize("page", CHECKED)
def test_changing_any_one_checked_figure_fails_the_check(page):
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    assert prose.problems(path, text) == []
    pairs = prose.checked(path, text)
    assert pairs, f"{page} binds no figure"
    passed = []
    for quote, binding in pairs:
        altered = _changed(_changed(text, quote.at, quote.figure), binding.at, binding.figure)
        if not prose.problems(path, altered):
            passed.append(f"line {quote.line}: {quote.figure} -> {numbers.mutated(quote.figure)}")
        if not prose.problems(path, _changed(text, quote.at, quote.figure)):  # the prose alone
            passed.append(f"line {quote.line}: {quote.figure} (prose only)")
    assert not passed, f"{page}: the check passes these changed figures: {passed}"


def test_a_changed_figure_in_a_copy_of_the_page_fails_the_cli(tmp_path):
    """The same through the command, on a copy of README.md beside the checked-in results."""
    import shutil

    shutil.copytree(ROOT / "docs" / "results", tmp_path / "docs" / "results")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (tmp_path / "README.md").write_text(text)
    assert CliRunner().invoke(app, ["bench-report", "--check", str(tmp_path / "README.md")]).exit_code == 0
    quote, binding = prose.checked(ROOT / "README.md", text)[0]
    (tmp_path / "README.md").write_text(_changed(_changed(text, quote.at, quote.figure), binding.at, binding.figure))
    result = CliRunner().invoke(app, ["bench-report", "--check", str(tmp_path / "README.md")])
    assert result.exit_code == 1 and f"the prose quotes {numbers.mutated(quote.figure)}" in result.output


def test_a_figure_outside_any_passage_fails_unless_exempt_or_history(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Runs `--max-tokens 256` on 2026-11-27 with gemma-3-270m, T=0.7.\n\n## History (not re-measured)\n\n"
                    "Once 1.40x.\n\n## Now\n\nAt 1.40x.\n")
    assert [p.split(": ", 1)[1] for p in prose.problems(page)] == [
        "1.40x is bound to no file: bind it in a figures passage, or move it under a History heading"]


def test_a_figure_bound_to_a_source_files_constant_follows_the_code(tmp_path):
    """A count the code fixes (not a measurement) binds to the constant's name in its source file."""
    (tmp_path / "k.h").write_text("constexpr int64_t FEW = 128;\n#define TWICE 2\n#define TWICE 3\n")
    (tmp_path / "r.py").write_text("BLOCK = 1024  # ids per block\n")
    page = tmp_path / "page.md"
    body = "Decodes of up to 128 tokens, in blocks of 1,024 ids.\n<!-- figures:end -->\n"
    page.write_text(f"<!-- figures: k=k.h r=r.py\n128  k:names.FEW\n1,024  r:names.BLOCK\n-->\n{body}")
    assert prose.problems(page) == []
    page.write_text(f"<!-- figures: k=k.h r=r.py\n128  k:names.FEW\n1,025  r:names.BLOCK\n-->\n{body.replace('1,024', '1,025')}")
    assert "its files give 1,024" in prose.problems(page)[0]
    page.write_text("<!-- figures: k=k.h\n2  k:names.TWICE\n-->\nTwo: 2.\n<!-- figures:end -->\n")
    assert "no key 'TWICE'" in prose.problems(page)[0]


def _rendered_blocks(script_name: str, page: str, kind: str):
    """The `kind` blocks of `page` (exempt from figure binding as rendered tables), each as (the
    files it names, its body), and the module of scripts/SCRIPT_NAME.py that renders them."""
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location(script_name, ROOT / "scripts" / f"{script_name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    blocks = re.findall(rf"^<!-- {kind}: ([^>]+?) -->\n(.*?)\n<!-- {kind}:end -->",
                        (ROOT / page).read_text(encoding="utf-8"), re.S | re.M)
    assert blocks, f"{page} has no {kind} block"
    return script, blocks


def test_the_interleave_table_is_what_its_script_renders_from_its_file():
    """docs/agent-bench.md's interleave-table block is what `scripts/interleave_bench.py FILE --render`
    prints, so each of its figures is its file's."""
    import json

    script, blocks = _rendered_blocks("interleave_bench", "docs/agent-bench.md", "interleave-table")
    for path, body in blocks:
        assert body == script.render(json.loads((ROOT / "docs" / path).read_text(encoding="utf-8")))


def test_the_distance_table_is_what_its_script_renders_from_its_files():
    """docs/screening-and-kernels.md's distance-table block is what `scripts/kernel_distance.py --render
    FILES` prints, so each of its figures is its files'."""
    script, blocks = _rendered_blocks("kernel_distance", "docs/screening-and-kernels.md", "distance-table")
    for paths, body in blocks:
        assert body == script.render([str(ROOT / "docs" / f) for f in paths.split()])


def test_keys_read_selections_that_exclude_json_lines_junit_and_several_values(tmp_path):
    from specgen.bench import keys

    data = {"rows": [{"id": None, "v": 1.0}, {"id": "a", "v": 2.0}, {"id": "b", "v": 4.0}]}
    assert keys.evaluate("mean(rows[id!=null].v)", {"": data}) == 3.0
    assert keys.evaluate("mean(rows[0].v, rows[2].v)", {"": data}) == 2.5  # several values, not weights
    assert keys.evaluate("sum(rows[1].v, rows[2].v)", {"": data}) == 6.0
    (tmp_path / "s.jsonl").write_text('{"id": 1}\n{"id": 2}\n')
    assert keys.evaluate("len(records[*])", {"": keys.read(tmp_path / "s.jsonl")}) == 2
    (tmp_path / "j.xml").write_text('<?xml version="1.0"?><testsuites><testsuite tests="2"><testcase name="t[x]">'
                                    '<properties><property name="B2" value="err=0.5 same=0/2"/></properties>'
                                    '</testcase></testsuite></testsuites>')
    junit = {"": keys.read(tmp_path / "j.xml")}
    assert keys.evaluate('testsuite[0].testcase[name="t[x]"].properties.B2.err', junit) == 0.5
    assert keys.evaluate("testsuite[0].tests", junit) == 2


def test_a_range_with_its_unit_on_both_ends_is_a_figure_and_checked(tmp_path):
    """'2.06x-2.09x' was read as no figure at all, so it could change unchecked."""
    assert [m.group(0) for m in numbers.find(numbers.mask("auto 2.08x (2.06x-2.09x)"))] == ["2.08x", "2.06x-2.09x"]
    (tmp_path / "r.json").write_text('{"lo": 2.061, "hi": 2.089}')
    page = tmp_path / "page.md"
    page.write_text("<!-- figures: r.json\n2.06x-2.09x  lo | hi\n-->\nBetween 2.06x-2.09x.\n<!-- figures:end -->\n")
    assert prose.problems(page) == []
    page.write_text("<!-- figures: r.json\n2.06x-2.08x  lo | hi\n-->\nBetween 2.06x-2.08x.\n<!-- figures:end -->\n")
    assert "its files give 2.06x-2.09x" in prose.problems(page)[0]


def test_round_takes_its_digits_and_a_misused_function_is_one_line_not_a_traceback():
    import pytest

    from specgen.bench import keys
    from specgen.errors import ConfigError

    data = {"": {"seconds": [0.0065432, 0.0161]}}
    assert keys.evaluate("round(1000 * seconds[0], 1)", data) == 6.5  # the digits were read as 1.0: a TypeError
    with pytest.raises(ConfigError, match="abs"):
        keys.evaluate("abs(seconds[0], seconds[1])", data)


def test_an_op_profiles_computed_rows_are_the_cells_its_script_renders():
    """keys' `computed.profile` of an op-profile file gives each cell of the table scripts/op_profile.py
    renders from it (median over rounds, net of the per-node overhead), unrounded: a row per model,
    setting and category, and the plain decode as "decode, no callback"."""
    import importlib.util
    import re

    from specgen.bench import keys

    spec = importlib.util.spec_from_file_location("op_profile", ROOT / "scripts" / "op_profile.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for path in sorted((ROOT / "docs" / "results" / "profile").glob("*.json")):
        data = keys.read(path)
        sizes = [str(b) for b in data["settings"]["sizes"]]
        rows = {(r["model"], r["setting"], r["op"]): r["ms"] for r in data["computed"]["profile"]}
        head, cells = None, 0
        for line in script.table(path).splitlines():
            if line.startswith("**") and line.endswith("**") and not line.startswith("**decode"):
                head = line.strip("*")
            elif line.startswith("| ") and not line.startswith("| ms per decode"):
                op, *values = [c.strip().strip("*") for c in line.strip("|").split("|")]
                model, setting = next((m, s) for m, s, _ in rows if f"{m}, {s}" == head)
                got = rows[(model, setting, op)]
                assert [f"{got[b]:.2f}" for b in sizes] == values[:len(sizes)], (path.name, head, op)
                cells += len(sizes)
        assert cells > 100, path.name
    data = {"": keys.read(ROOT / "docs" / "results" / "profile" / "2026-11-27-op-profile-codes-1thread.json")}
    path = 'computed.profile[model=gemma-3-270m-q4_k_m,setting="specgen, ggml\'s attention",op=attention].ms.8'
    assert re.fullmatch(r"8\.62", f"{keys.evaluate(path, data):.2f}")
