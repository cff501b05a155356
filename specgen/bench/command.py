"""`specgen bench`'s run apart from its options: settings into a run of every method (and llama.cpp's
rows) on the same prompts, interleaved, and what the command prints and writes, as one BenchRun.

cli/bench.py turns options into a BenchAsk and shows the BenchRun; nothing here prints."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from specgen.app.ask import any_needs_exact_rows
from specgen.app.config import Given, run_config
from specgen.app.runner import Runner
from specgen.app.session import load_session
from specgen.bench import drafts, llamacpp
from specgen.bench.results import bench_report as results_of_run, header, machine_info, run_info
from specgen.bench.run import UNSCREENED, in_process, parse_methods, run_bench
from specgen.bench.suites import SPLITS, load_suite, select, split_half
from specgen.bench.summary import HeadToHead, SummaryRow, head_to_head, summarize
from specgen.core.constraint import ConstraintSpec
from specgen.drafting import methods as M
from specgen.errors import ConfigError
from specgen.host import cpu_sample, others_cores

# (total trials, label) -> a context yielding advance(): the CLI's progress bar, or none.
Progress = Callable[[int, str], AbstractContextManager[Callable[[], None]]]


@dataclass(frozen=True)
class BenchAsk:
    """What a bench run was asked for: the merged settings (a -c preset under the options given),
    the sampling options given (they replace the settings' fields), a constraint for every prompt
    without one, and llama.cpp's rows."""
    values: dict
    given: Given = Given()
    constraint: ConstraintSpec | None = None
    llama_cpp: Path | None = None
    spec_types: Sequence[str] = ()
    llama_cpp_draft: str | None = None


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
    if (ask.spec_types or ask.llama_cpp_draft) and ask.llama_cpp is None:
        raise ConfigError(f"{'--spec-type' if ask.spec_types else '--llama-cpp-draft'} runs llama.cpp's speculative "
                          "decoding: give --llama-cpp DIR too")


def run(ask: BenchAsk, progress: Progress) -> BenchRun:
    """Load the models once, run every trial interleaved, summarise (KeyboardInterrupt: what finished).
    The caller has run check(ask) first, before anything it writes."""
    from specgen.llama import backend, tools  # loads llama.cpp: not at start-up

    values = ask.values
    cfg = run_config(values, ask.given)
    split = values.get("split") or "all"
    suite_name, pool = load_suite(values.get("suite") or "builtin")
    prompts = select(split_half(pool, split), values.get("per_group"), values.get("limit"))
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
    report["settings"].update(split=split, per_group=values.get("per_group"), limit=values.get("limit"))
    return BenchRun(rows, columns, rivals, title, n_repeats, versus, report, interrupted)
