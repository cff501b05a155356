"""Bench results: per group (and turn) and method, speedups over plain decoding as Spec-Bench computes
them (the ratio of per-prompt mean throughputs over the same prompts) with their spread, and per
prompt against other tools' runs (head to head)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from specgen.bench.run import Trial
from specgen.core.stats import RunStats
from specgen.drafting.methods import JUMP

OVERALL = "overall"


@dataclass(frozen=True)
class SummaryRow:
    """One group x method; the --json `summary` keys (a contract: scripts depend on them)."""
    group: str
    method: str
    tokens_per_s: float  # mean of per-prompt throughputs
    speedup: float  # tokens_per_s / plain's tokens_per_s over the same prompts
    mean_accepted: float  # τ of the drafters: tokens per target call, forced ones excluded (core/stats.py)
    acceptance_rate: float  # the drafters' (forced tokens excluded)
    lossless_mismatches: int | None  # trials whose text differs from plain's (greedy, or one seed per trial); else None
    n_prompts: int
    # Per prompt (and repeat), method tok/s over plain tok/s: their median, and a 90% bootstrap
    # interval of `speedup` (prompts resampled). within_noise: the interval holds 1.0, so this
    # run cannot tell the method from plain decoding.
    median_speedup: float = 0.0
    speedup_low: float = 0.0
    speedup_high: float = 0.0
    within_noise: bool = False
    turn: int | None = None  # a row of one turn (1, 2, ...) of a group's multi-turn prompts; None: all turns
    # Tokens a grammar forced (constrained prompts): drafted as the trunk of each step's tree, and
    # accepted; apart from τ and acceptance.
    forced_drafted: int = 0
    forced_accepted: int = 0
    # tokens_per_s over jump-forward's (the `jump` method) over the same prompts: what drafting adds
    # to the grammar's forced tokens. None where jump did not run (unconstrained benches).
    over_jump: float | None = None
    # With several repeats per prompt: the speedup over each repeat's prompts, repeat 0 first (a
    # repeat's spread shows the machine's drift; the interval above is over prompts). None: one repeat.
    repeat_speedups: tuple[float, ...] | None = None


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def summarize(trials: Sequence[Trial], methods: Sequence[str], compare_texts: bool) -> list[SummaryRow]:
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
        rows += _rows(group, None, whole, methods, compare_texts)
        n_turns = {len(by_key[(*k, m)].turn_stats) for k in keys for m in methods}
        if group != OVERALL and len(n_turns) == 1 and min(n_turns) > 1:
            for turn in range(min(n_turns)):
                one = {k: {m: (by_key[(*k, m)].turn_stats[turn], by_key[(*k, m)].answers[turn]) for m in methods}
                       for k in keys}
                rows += _rows(group, turn + 1, one, methods, compare_texts)
    return rows


def _rows(group: str, turn: int | None, runs: dict[tuple, dict[str, tuple[RunStats, str]]], methods: Sequence[str],
          compare_texts: bool) -> list[SummaryRow]:
    """One row per method over `runs`: per prompt key, per method, its (stats, text)."""
    # A trial that emitted nothing (the model stopped at once, a rival that failed) has no
    # throughput: a method's speed is over the prompts that it and plain (and jump, where it is
    # compared) both wrote tokens on, or a 0 tok/s would count as a slowdown, and one rival's empty
    # trials would leave every other method without a timed prompt.
    rows = []
    for method in methods:
        timed = [k for k, by_method in runs.items()
                 if all(by_method[m][0].n_tokens > 0 for m in {method, "plain", *({JUMP} & set(methods))})]
        plain_tps = _mean(runs[k]["plain"][0].tokens_per_s for k in timed)
        jump_tps = _mean(runs[k][JUMP][0].tokens_per_s for k in timed) if JUMP in methods else None
        total = RunStats()
        for k in runs:
            total.add(runs[k][method][0])
        tps = _mean(runs[k][method][0].tokens_per_s for k in timed)
        mismatches = sum(runs[k][method][1] != runs[k]["plain"][1] for k in runs) if compare_texts else None
        spread = speedup_spread([runs[k][method][0].tokens_per_s for k in timed],
                                [runs[k]["plain"][0].tokens_per_s for k in timed], [k[0] for k in timed])
        rows.append(SummaryRow(
            group, method, round(tps, 2), round(tps / plain_tps, 3) if plain_tps else 0.0,
            round(total.mean_accepted, 3), round(total.acceptance_rate, 4),
            mismatches, len({k[0] for k in runs}), *spread, turn=turn, forced_drafted=total.forced_drafted,
            forced_accepted=total.forced_accepted,
            over_jump=None if jump_tps is None else round(tps / jump_tps, 3) if jump_tps else 0.0,
            repeat_speedups=_by_repeat(runs, timed, method)))
    return rows


def _by_repeat(runs: dict[tuple, dict[str, tuple[RunStats, str]]], timed: Sequence[tuple],
               method: str) -> tuple[float, ...] | None:
    """`method`'s speedup over plain within each repeat (keys are (prompt, repeat)); None for one."""
    repeats = sorted({k[1] for k in timed})
    if len(repeats) < 2:
        return None
    out = []
    for rep in repeats:
        keys = [k for k in timed if k[1] == rep]
        plain = sum(runs[k]["plain"][0].tokens_per_s for k in keys)
        out.append(round(sum(runs[k][method][0].tokens_per_s for k in keys) / plain, 3) if plain else 0.0)
    return tuple(out)


BOOTSTRAP_SAMPLES, BOOTSTRAP_LEVEL = 2000, 0.90


def speedup_spread(method_tps: Sequence[float], plain_tps: Sequence[float],
                   prompts: Sequence[str] | None = None) -> tuple[float, float, float, bool]:
    """(median per-prompt speedup, low, high, within_noise) for paired per-prompt throughputs: the
    interval is a percentile bootstrap of the ratio of means over prompts resampled whole, each
    with all its repeats (`prompts`: the prompt of each pair; None: every pair its own), since
    repeats of one prompt are not independent prompts; seeded, so a report is reproducible from its
    records."""
    import numpy as np

    m, p = np.asarray(method_tps, dtype=float), np.asarray(plain_tps, dtype=float)
    if len(m) == 0 or not np.all(p > 0):
        return 0.0, 0.0, 0.0, False
    _, which = np.unique(np.asarray(prompts if prompts is not None else np.arange(len(m))), return_inverse=True)
    m_sum, p_sum = np.bincount(which, weights=m), np.bincount(which, weights=p)
    idx = np.random.default_rng(0).integers(0, len(m_sum), size=(BOOTSTRAP_SAMPLES, len(m_sum)))
    ratios = m_sum[idx].sum(axis=1) / p_sum[idx].sum(axis=1)
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
