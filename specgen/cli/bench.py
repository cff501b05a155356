"""`specgen bench`: options into a run of every method on the same prompts, shown as a table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from specgen.app.ask import with_sampler
from specgen.app.config import Given
from specgen.bench import command
from specgen.bench.view import head_to_head_line, summary_table
from specgen.cli.options import (Chat, Config, Corpus, Ctx, Draft, DraftGpuLayers, EXIT_INTERRUPTED,
                                 EXIT_WRITE_FAILED, GpuLayers, Grammar, JsonLayout, JsonObject, JsonSchema, Rpc,
                                 Store, System, Target, Threads, constraint_option, with_sampling)
from specgen.cli.render import count_progress, error
from specgen.errors import ConfigError
from specgen.files import write_text


@with_sampling
def bench(
    target: Target = None,
    draft: Draft = None,
    suite: Optional[str] = typer.Option(None, "--suite", metavar="NAME|FILE", help="builtin | json | agent | humaneval | "
                                        "a Spec-Bench question.jsonl path [builtin]; agent: tool loops through "
                                        "real servers (specgen serve's rows, llama-server's with --llama-cpp)."),
    methods: Optional[str] = typer.Option(None, "--methods", metavar="LIST", help="Comma-separated; plain always runs "
                                          "(and jump, where prompts are constrained) [every method that can run "
                                          "with the models given]."),
    category: Optional[str] = typer.Option(None, "--category", metavar="LIST", help="Comma-separated: only the "
                                           "prompts of these categories of the suite (Spec-Bench's, e.g. coding, "
                                           "or a group such as mt_bench) [every one]."),
    limit: Optional[int] = typer.Option(None, "--limit", metavar="N", help="At most N prompts in all."),
    per_group: Optional[int] = typer.Option(None, "--per-group", metavar="N",
                                            help="N prompts per group, spread evenly."),
    split: Optional[str] = typer.Option(None, "--split", metavar="HALF", help="all | tune | report: the suite's fixed halves, "
                              "by the number its ids end in (odd: tune, even: report); published tables use report "
                              "[all]."),
    sampling: Given = Given(),  # the sampling options, typed at the edge (with_sampling)
    chat: Chat = None,
    system: System = None,
    config: Config = None,
    repeats: Optional[int] = typer.Option(None, "--repeats", metavar="R", help="Run the whole schedule R times [1]."),
    json_file: Optional[Path] = typer.Option(None, "--json", metavar="FILE", help="Write machine, models, settings, "
                                             "records and summary as one JSON object to this file."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE",
                                        help="Write a speedup chart (.svg, or .png with matplotlib)."),
    threads: Threads = None,
    ctx: Ctx = None,
    gpu_layers: GpuLayers = None,
    draft_gpu_layers: DraftGpuLayers = None,
    rpc: Rpc = None,
    corpus: Corpus = None,
    store: Store = None,
    json_schema: JsonSchema = None,
    grammar: Grammar = None,
    json_object: JsonObject = False,
    json_layout: JsonLayout = None,
    sampler: Optional[str] = typer.Option(None, "--sampler", metavar="NAME", help="Another tool's default "
                                          "sampler: llama-server (T 0.8, top-k 40, top-p 0.95, min-p 0.05), openai "
                                          "(T 1) or greedy; sampling options given beside it win."),
    llama_cpp: Optional[Path] = typer.Option(None, "--llama-cpp", metavar="DIR", help="A folder holding llama.cpp's "
                                             "llama-speculative-simple: run the same prompts through it too."),
    spec_type: Optional[List[str]] = typer.Option(None, "--spec-type", metavar="TYPE", help="With --llama-cpp: one "
                                                  "llama.cpp configuration per use, e.g. ngram-mod or "
                                                  "draft-simple,ngram-map-k [the n-gram types, and draft-simple with a "
                                                  "draft]."),
    llama_cpp_draft: Optional[str] = typer.Option(None, "--llama-cpp-draft", metavar="MODEL", help="With --llama-cpp: "
                                                  "the draft its draft modes load [-d's; for a vocabulary-cut -d self, "
                                                  "the same draft with its whole vocabulary]."),
    llama_cpp_template: Optional[Path] = typer.Option(None, "--llama-cpp-template", metavar="FILE", help="With "
                                                      "--suite agent and --llama-cpp: the chat template llama-server "
                                                      "renders (its --chat-template-file), e.g. one that writes tools "
                                                      "for a model whose own template does not."),
    answer_tool_choice: Optional[str] = typer.Option(None, "--answer-tool-choice", metavar="CHOICE", help="With "
                                                     "--suite agent: the answers' tool_choice, auto or none (a "
                                                     "framework's last answer in text) [auto]."),
) -> None:
    """Run every method against plain decoding on the same prompts, interleaved, and compare.

    \b
    Examples:
      specgen bench -m smollm2-135m-instruct-q4_1 --methods lookup,auto -n 64
      specgen bench -c configs/bench-pair-a.yaml --suite question.jsonl --split report --per-group 2 --json a.json
      specgen bench -c configs/bench-pair-b.yaml --methods auto --llama-cpp ~/llama.cpp/build/bin --spec-type ngram-mod
    """
    sampling = replace(sampling, sampling=with_sampler(sampler, sampling.sampling))
    options = {k: v for k, v in locals().items() if k not in ("sampling", "sampler")}
    if suite == "agent":
        return _agent({**options, "max_tokens": sampling.max_tokens, **sampling.fields})
    ask = command.BenchAsk(command.settings_of(options), sampling, constraint_option(json_schema, grammar, json_object),
                           llama_cpp, tuple(spec_type or ()), llama_cpp_draft, json_file, plot)
    command.check(ask)  # a wrong option fails before a model loads or a file is written
    done = command.run(ask, count_progress)
    _show(done)
    failed = command.write(ask, done)  # the table above stays whatever the writes do
    for f in failed:
        error(f"could not write {f.option} {f.path}: {f.reason}; the table above is what was measured")
    if done.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if failed:
        raise typer.Exit(EXIT_WRITE_FAILED)


def _show(done: command.BenchRun) -> None:
    """The table, and llama.cpp's head-to-head lines under it."""
    console = Console()
    if not console.is_terminal:
        # Piped: never truncated (a cell's widest line, "0.98-1.38 med 1.28", with padding and border).
        console = Console(width=30 + sum(max(21, len(c) + 5) for c in done.columns))
    console.print(summary_table(done.rows, done.columns, done.title, done.n_repeats))
    for h in done.versus:
        console.print(head_to_head_line(h, done.rivals), markup=False, highlight=False)


def _agent(given: dict) -> None:
    from specgen.cli.agentbench import run_agent_bench

    command.check_agent(given)
    try:
        run_agent_bench(given["target"], given["split"] or "all", given["limit"], given["max_tokens"],
                        given["threads"], given["ctx"], given["draft"], given["json_file"], given["llama_cpp"],
                        given["spec_type"], given["llama_cpp_draft"], template=given["llama_cpp_template"],
                        answer_choice=given["answer_tool_choice"])
    except KeyboardInterrupt:  # what finished is written; the servers are stopped
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _written(write, option: str, path: Path) -> list[str]:
    """Run `write`; on an OSError say which file in one line and return it as failed."""
    try:
        write()
        return []
    except OSError as e:
        error(f"could not write {option} {path}: {e.strerror or e}; the table above is what was measured")
        return [str(path)]


def bench_report(
    files: Optional[List[Path]] = typer.Argument(None, metavar="[FILE.json]...", help="`specgen bench --json` files."),
    update: Optional[List[Path]] = typer.Option(None, "--update", metavar="PAGE.md", help="Rewrite each bench-table "
                                                "block of this markdown page from the results files its marker names."),
    check: Optional[List[Path]] = typer.Option(None, "--check", metavar="PAGE.md", help="Exit 1 where a bench-table "
                                               "block of this page differs from what its files render, or a figure of its prose is not the value "
                                               "its binding names (or is bound to none)."),
    publish: Optional[Path] = typer.Option(None, "--publish", metavar="OUT.json", help="Write the one FILE given as a "
                                           "results file to check in: each generated text replaced by its sha256."),
) -> None:
    """Render published benchmark tables (markdown) from `specgen bench --json` files.

    \b
    A page shows a table between <!-- bench-table: results/FILE.json --> and <!-- bench-table:end -->
    (paths relative to the page); --update rewrites it, --check fails where it is out of date, and
    where a figure of the page's prose is not what its binding names: a passage between
    <!-- figures: NAME=FILE ... (a line per figure: FIGURE KEY.PATH) --> and <!-- figures:end -->
    (docs/benchmarking.md), or where a figure is bound to nothing (outside History sections).

    \b
    Examples:
      specgen bench-report docs/results/2026-11-26-pair-a.json          # the markdown, on stdout
      specgen bench-report /tmp/a.json --publish docs/results/2026-11-26-pair-a.json
      specgen bench-report --update README.md --update docs/measurements.md
      specgen bench-report --check README.md
    """
    from specgen.bench import prose, published

    if not (files or update or check):
        raise ConfigError("bench-report expects results files, --update PAGE or --check PAGE; found none")
    if publish is not None:
        if len(files or []) != 1:
            raise ConfigError(f"--publish writes one results file: give one FILE.json, found {len(files or [])}")
        text = json.dumps(published.publish(published.load(files[0])), indent=1, ensure_ascii=False) + "\n"
        if _written(lambda: _write_readable(publish, text), "--publish", publish):
            raise typer.Exit(EXIT_WRITE_FAILED)
    elif files:
        typer.echo(published.render_files(files, Path.cwd()), nl=False)
    for page in update or []:
        text = published.updated(page)
        if _written(lambda: _write_readable(page, text), "--update", page):
            raise typer.Exit(EXIT_WRITE_FAILED)
    out_of_date = [f"{page}: the table from {files} differs from what they render (run: specgen bench-report "
                   f"--update {page})" for page in check or [] for files in published.stale(page)]
    out_of_date += [line for page in check or [] for line in prose.problems(page)]
    for line in out_of_date:
        error(line)
    if out_of_date:
        raise typer.Exit(1)


def _write_readable(path: Path, text: str) -> None:
    """write_text, keeping the mode of the file it replaces (a new one: readable by all, as a file
    checked in should be; write_text's temporary file is private)."""
    import os

    mode = path.stat().st_mode & 0o777 if path.is_file() else 0o644
    write_text(path, text)
    os.chmod(path, mode)
