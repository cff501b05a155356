"""Flags mean the same in every command, and help reads as Typer/Rich help does (no stray markers)."""

import math
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from specgen.cli import app
from specgen.drafting.methods import METHODS

COMMANDS = typer.main.get_command(app).commands
# generate's options that make sense for one prompt only, or are spelt differently on purpose
# (bench --json names a file for its one report; generate --json writes records to stdout).
GENERATE_ONLY = {"prompts", "method", "fail_fast", "json_out", "prompt_cache", "prompt_cache_mb"}  # bench keeps no prompt cache


def options(command: str) -> dict[str, tuple[tuple[str, ...], str]]:
    """name -> (flags, help without its trailing [default]) of a command's options: a default may
    differ between commands (demo writes 128 tokens, generate 256), the meaning may not."""
    return {p.name: (tuple(p.opts + p.secondary_opts), re.sub(r"\s*\\?\[[^\]]*\]\.?$", "", p.help or ""))
            for p in COMMANDS[command].params if p.param_type_name == "option"}


def test_bench_takes_every_sampling_and_model_option_generate_takes_with_the_same_meaning():
    generate, bench = options("generate"), options("bench")
    for name in ("top_k", "top_p", "temperature", "seed", "max_tokens", "target", "draft", "system"):
        assert name in bench, name
    for name in set(generate) - GENERATE_ONLY:
        assert bench.get(name) == generate[name], name


@pytest.mark.parametrize("command", ["calibrate", "doctor", "demo"])
def test_shared_options_are_the_same_in_other_commands(command):
    generate = options("generate")
    for name, spec in options(command).items():
        if name in generate:
            assert spec == generate[name], (command, name)


@pytest.mark.parametrize("args", [[], *([name] for name in COMMANDS)])
def test_help_has_no_stray_type_markers_or_spaces(args):
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert not re.search(r"<(bool|int|float|str|text|path|list)[^>]*>", result.output, re.I), result.output
    # A sentence's end after a space: what is left where Rich took "[the cores ...]" for markup.
    assert not re.search(r"\w [.,](\s|$)", result.output, re.M), result.output
    assert "the cores other processes leave free" in result.output or not args or args[0] not in (
        "generate", "bench", "calibrate", "doctor", "demo")


def test_the_readme_and_its_reference_pages_document_every_command_option_method_and_the_test_command():
    # A README edit once dropped its usage sections (generate's options, the methods, `make test`)
    # with nothing failing; users read them, and CI runs the README's test command (.ci/run). The
    # README keeps `make test` and links the reference: docs/commands.md (every command, every
    # generate option) and docs/how-it-works.md (every method).
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    commands = (root / "docs" / "commands.md").read_text(encoding="utf-8")
    methods = (root / "docs" / "how-it-works.md").read_text(encoding="utf-8")
    assert "make test" in (root / ".ci" / "run").read_text(encoding="utf-8")
    missing = [f"README.md: {m}" for m in ("`make test`", "(docs/commands.md)", "(docs/how-it-works.md)")
               if m not in readme]
    missing += [f"docs/commands.md: specgen {name}" for name in COMMANDS if f"specgen {name}" not in commands]
    missing += [f"docs/commands.md: {flags[0]}" for flags, _ in options("generate").values()
                if not any(re.search(re.escape(flag) + r"\b", commands) for flag in flags)]
    missing += [f"docs/how-it-works.md: `{name}`" for name in METHODS if f"`{name}`" not in methods]
    assert not missing, f"not documented: {', '.join(missing)}"


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_every_generating_command_takes_every_sampling_option_declared_once(command):
    from specgen.cli.options import SAMPLING

    given = options(command)
    missing = [name for name in SAMPLING if name not in given]
    assert not missing, f"specgen {command} lacks {missing}"
    reference = options("generate")
    assert {name: given[name] for name in SAMPLING} == {name: reference[name] for name in SAMPLING}


def test_sampling_options_arrive_typed_as_the_servers_fields_do(monkeypatch):
    """with_sampling hands the command one Given: the sampling values as ask.Overrides (the type the
    server's edge makes of a request's fields), --logit-bias as (token, bias) pairs, the token limit
    and stop strings; None where not given (the -c file or the defaults decide)."""
    from specgen.app.ask import Overrides
    from specgen.app.config import Given
    from specgen.cli import generate as g

    seen = []
    monkeypatch.setattr(g, "build_config", lambda config, values, given: seen.append(given) or (_ for _ in ()).throw(
        SystemExit(0)))
    result = CliRunner().invoke(app, ["generate", "-t", "0.5", "--top-k", "7", "--logit-bias", "15+1",
                                      "--logit-bias", "16-inf,15-2", "-n", "9", "--stop", "x", "hi"])
    assert result.exit_code == 0, result.output
    assert seen == [Given(Overrides(temperature=0.5, top_k=7, logit_bias=((15, -2.0), (16, -math.inf))), 9, ("x",))]
    assert seen[0].fields == {"temperature": 0.5, "top_k": 7, "logit_bias": ((15, -2.0), (16, -math.inf)),
                              "max_tokens": 9, "stop": ("x",)}




def test_the_command_line_and_the_server_make_one_typed_overrides():
    """Both edges meet at ask.Overrides: the same values, from flags or from a request's fields."""
    from specgen.cli.options import SAMPLING, read_sampling
    from specgen.serve.requests import completion_request

    cli = read_sampling({**dict.fromkeys(SAMPLING), "temperature": 0.5, "top_k": 7, "seed": 3, "min_p": 0.1,
                         "logit_bias": ["15-2", "16-inf"]})
    server = completion_request({"prompt": "hi", "temperature": 0.5, "top_k": 7, "seed": 3, "min_p": 0.1,
                                 "logit_bias": {"15": -2, "16": False}})
    assert cli.sampling == server.sampling
