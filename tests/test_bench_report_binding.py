"""Every figure `specgen bench-report --check` reads is bound to the one value it quotes: a copy of a
checked page with any one figure changed (its last digit one higher, in the prose and in its
binding line alike, so only the file's value can tell) fails the check, and the page as it stands
passes."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.bench import numbers, prose
from specgen.cli import app
from test_bench_report import CHECKED

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
