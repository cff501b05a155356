"""`specgen bench`'s run apart from its options: settings into a run of every method (and llama.cpp's
rows) on the same prompts, interleaved, and what the command prints and writes, as one BenchRun;
the --json and --plot files written; --suite agent's options checked.

cli/bench.py turns options into a BenchAsk and shows the BenchRun; nothing here prints."""

from __future__ import annotations

import dataclasses
import json
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from specgen.app.ask import any_needs_exact_rows
from specgen.app.config import Given, merged_settings, run_config
from specgen.app.runner import Runner
from specgen.app.session import load_session
from specgen.bench import drafts, llamacpp
from specgen.bench.results import bench_report as results_of_run, header, machine_info, run_info
from specgen.bench.run import UNSCREENED, in_process, parse_methods, run_bench
from specgen.bench.suites import SPLITS, in_categories, load_suite, select, split_half
from specgen.bench.summary import HeadToHead, SummaryRow, head_to_head, summarize
from specgen.bench.view import check_plot_path, write_plot
from specgen.core.constraint import ConstraintSpec
from specgen.drafting import methods as M
from specgen.errors import ConfigError
from specgen.files import check_writable, write_text
from specgen.host import cpu_sample, others_cores

# (total trials, label) -> a context yielding advance(): the CLI's progress bar, or none.
Progress = Callable[[int, str], AbstractContextManager[Callable[[], None]]]


@dataclass(frozen=True)
class BenchAsk:
    """What a bench run was asked for: the merged settings (a -c preset under the options given),
    the sampling options given (they replace the settings' fields), a constraint for every prompt
    without one, llama.cpp's rows, and the files to write."""
    values: dict
    given: Given = Given()
    constraint: ConstraintSpec | None = None
    llama_cpp: Path | None = None
    spec_types: Sequence[str] = ()
    llama_cpp_draft: str | None = None
    json_file: Path | None = None  # --json
    plot: Path | None = None  # --plot


@dataclass(frozen=True)
class BenchRun:
    """A finished (or interrupted) run: the table's rows and columns, llama.cpp's head-to-head lines,
    and the --json report."""
    rows: list[SummaryRow]
    columns: list[str]
    rivals: list[str]  # llama.cpp's rows
    title: str
    n_repeats: int
    versus: list[HeadToHead]
    report: dict
    interrupted: bool


# The options that are settings (keys of a -c file too); the others are the run's own.
SETTINGS = ("target", "draft", "chat", "system", "threads", "ctx", "gpu_layers", "draft_gpu_layers", "rpc", "methods",
            "suite", "category", "limit", "per_group", "repeats", "split", "store", "json_layout", "corpus")


@dataclass(frozen=True)
class Unwritten:
    """A file the run could not write (checked before the run, a write may still fail: a full disk)."""
    option: str  # --json | --plot
    path: Path
    reason: str


def settings_of(options: dict) -> dict:
    """The command's options (every one, by parameter name) as the run's settings: defaults.yaml,
    the -c file, then the options given. The agent suite's own options are refused here."""
    o = options
    corpus = ",".join(map(str, o["corpus"])) if o["corpus"] else None
    values = merged_settings(o["config"], {**{k: o[k] for k in SETTINGS}, "corpus": corpus})
    if o["llama_cpp_template"] is not None or o["answer_tool_choice"] is not None:
        flag = "--llama-cpp-template sets llama-server's chat template" if o["llama_cpp_template"] is not None else \
            "--answer-tool-choice sets the agent loops' answers"
        raise ConfigError(f"{flag}: it goes with --suite agent, found --suite {values.get('suite') or 'builtin'}")
    return values


# What --suite agent reads (bench/agent.py: servers, greedy); any other option given is refused.
AGENT_OPTIONS = {"target", "draft", "suite", "limit", "split", "max_tokens", "threads", "ctx", "json_file",
                 "llama_cpp", "spec_type", "llama_cpp_draft", "llama_cpp_template", "answer_tool_choice", "config"}


def check_agent(given: dict) -> None:
    """Refuse a --suite agent run given an option it does not read, or without what it needs."""
    unused = [k for k, v in given.items() if k not in AGENT_OPTIONS and v not in (None, False, [], ())
              and not k.startswith("_") and k not in ("backend", "tools")]
    if unused or given.get("config") is not None:
        name = "config" if given.get("config") is not None else unused[0]
        raise ConfigError(f"--suite agent runs servers greedily with its own rows: it takes -m, -d, --split, --limit, "
                          f"-n, --threads, --ctx, --json, --llama-cpp, --spec-type, --llama-cpp-draft, "
                          f"--llama-cpp-template and --answer-tool-choice, found --"
                          f"{name.replace('_', '-')}")
    if given["limit"] is not None and given["limit"] < 1:
        raise ConfigError(f"--limit must be at least 1, found {given['limit']}")
    if not given["target"]:
        raise ConfigError("--suite agent needs a target model (-m MODEL), found none")


def check(ask: BenchAsk) -> None:
    """Refuse a bench that cannot run as asked, in one line, before anything is loaded."""
    values = ask.values
    for key in ("limit", "per_group", "repeats"):
        if values.get(key) is not None and values[key] < 1:
            raise ConfigError(f"--{key.replace('_', '-')} must be at least 1, found {values[key]}")
    split = values.get("split") or "all"  # a -c preset may pin it (published tables: report)
    if split not in SPLITS:
        raise ConfigError(f"--split expects {', '.join(SPLITS)}, found {split!r}")
    parse_methods(values.get("methods") or ())  # a misspelt method fails before anything is read
    if values.get("category") is not None:  # a category the suite lacks, too
        in_categories(load_suite(values.get("suite") or "builtin")[1], values["category"])
    if (ask.spec_types or ask.llama_cpp_draft) and ask.llama_cpp is None:
        raise ConfigError(f"{'--spec-type' if ask.spec_types else '--llama-cpp-draft'} runs llama.cpp's speculative "
                          "decoding: give --llama-cpp DIR too")
    if ask.json_file is not None:
        check_writable(ask.json_file, "--json")
    if ask.plot is not None:
        check_plot_path(ask.plot)


def run(ask: BenchAsk, progress: Progress) -> BenchRun:
    """Load the models once, run every trial interleaved, summarise (KeyboardInterrupt: what finished).
    The caller has run check(ask) first, before anything it writes."""
    from specgen.llama import backend, tools  # loads llama.cpp: not at start-up

    values = ask.values
    cfg = run_config(values, ask.given)
    split = values.get("split") or "all"
    suite_name, pool = load_suite(values.get("suite") or "builtin")
    prompts = select(in_categories(split_half(pool, split), values.get("category")), values.get("per_group"),
                     values.get("limit"))
    if ask.constraint is not None:  # every prompt that carries no response_format or tools of its own
        prompts = [p if p.constraint or p.tools else dataclasses.replace(p, constraint=ask.constraint) for p in prompts]
    n_repeats = values.get("repeats") or 1
    # Constrained prompts: jump-forward runs too (after plain), the speed of the forced tokens alone.
    constrained = any(p.constrained for p in prompts)
    chosen = parse_methods(values.get("methods") or M.usable(cfg.draft is not None, constrained), constrained)
    binary = llamacpp.find_binary(ask.llama_cpp) if ask.llama_cpp is not None else None
    if binary is not None and cfg.stops:  # its rows would write past the stop string and be compared as cut
        raise ConfigError(f"--stop cuts specgen's texts only: llama.cpp's rows (--llama-cpp) do not stop at a "
                          f"string, found --stop {cfg.stops[0]!r}; leave out one of the two")
    # Past runs' texts would favour auto; a screened target serves where no prompt needs exact rows.
    session = load_session(cfg.loading, chosen, store_default=False, screen=not any_needs_exact_rows(cfg.sampling, prompts))
    runners = {m: Runner(dataclasses.replace(cfg, method=m), session) for m in chosen}
    info = tools.build_info()
    n_threads = cfg.threads or backend.default_threads()
    external, their_draft = {}, None
    if binary is not None:
        their_draft = drafts.for_llama_cpp(session, ask.llama_cpp_draft)
        external = llamacpp.bench_runs(binary, ask.spec_types, session, runners["plain"], n_threads, their_draft)
        if session.target.screen:  # llama.cpp decodes the target itself: a row that does too
            unscreened = load_session(cfg.loading, ["plain"], store_default=False, screen=False)
            external = {UNSCREENED: in_process(Runner(dataclasses.replace(cfg, method="plain"), unscreened),
                                               prompts[0]), **external}
    columns = [*chosen, *external]
    machine = machine_info(n_threads, info)
    title = header(machine, cfg, session, suite_name) + ("" if split == "all" else f" ({split} half)")

    calibration_at_start = {role: c.to_json() for role, c in (("target", session.costs), ("draft", session.draft_costs))
                            if c is not None}
    cpu_at_start, run_at_start = cpu_sample(), run_info()
    trials: list = []
    interrupted = False
    with progress(len(prompts) * len(columns) * n_repeats, f"bench: {len(prompts)} prompts x "
                  f"{len(columns)} methods x {n_repeats}") as advance:
        try:
            run_bench(prompts, runners, n_repeats, on_trial=lambda t: (trials.append(t), advance()),
                      external=external)
        except KeyboardInterrupt:
            interrupted = True  # report what finished; the command exits 130

    machine["others_cores"] = others_cores(cpu_at_start, cpu_sample())  # other processes' CPU use meanwhile
    machine["load_average_at_end"] = machine_info(n_threads, info)["load_average"]
    rows = summarize(trials, columns, compare_texts=True)  # sampled: every method with a trial's seed (run.trial_seed)
    if not cfg.sampling.greedy:  # llama.cpp samples otherwise: its texts are not specgen's to match
        rows = [dataclasses.replace(r, lossless_mismatches=None) if r.method in external and r.method != UNSCREENED
                else r for r in rows]
    rivals = [name for name in external if name != UNSCREENED]
    versus = [head_to_head(trials, m, rivals) for m in chosen if m != "plain"] if rivals else []
    report = results_of_run(cfg, session, machine, columns, suite_name, len(prompts), n_repeats, interrupted,
                            trials, rows, calibration_at_start, versus,
                            their_draft.record if their_draft is not None else None, run_at_start)
    report["settings"].update(split=split, category=values.get("category"), per_group=values.get("per_group"),
                              limit=values.get("limit"))
    return BenchRun(rows, columns, rivals, title, n_repeats, versus, report, interrupted)


def write(ask: BenchAsk, done: BenchRun) -> list[Unwritten]:
    """Write --json (the report) and --plot (the speedup chart); the files that could not be written."""
    failed = []
    if ask.json_file is not None:
        text = json.dumps(done.report, indent=1, ensure_ascii=False) + "\n"
        failed += _written(lambda: write_text(ask.json_file, text), "--json", ask.json_file)
    if ask.plot is not None and done.rows:
        failed += _written(lambda: write_plot(done.rows, ask.plot, done.title), "--plot", ask.plot)
    return failed


def _written(write: Callable[[], None], option: str, path: Path) -> list[Unwritten]:
    try:
        write()
        return []
    except OSError as e:
        return [Unwritten(option, path, str(e.strerror or e))]
