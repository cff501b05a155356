"""Spreads a published table shows, computed from a results file's records rather than read from its
summary: a method's speedup over another per repeat, its median over prompts and its 90% bootstrap
interval over prompts, each prompt resampled whole with all its repeats (summary.speedup_spread),
so that repeats of one prompt never count as independent prompts, whatever summary the file was
written with."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from statistics import median

from specgen.bench.summary import speedup_spread


@dataclass(frozen=True)
class Spread:
    """`method` over `against` on the prompts (and repeats) both finished and wrote something on."""
    ratio: float  # mean tok/s over mean tok/s, every prompt and repeat (the summary's speedup)
    low: float  # 90% bootstrap interval over prompts, each with all its repeats
    high: float
    median: float  # median over prompts of a prompt's ratio (its repeats' tok/s summed)
    per_repeat: tuple[float, ...]  # the ratio over each repeat's prompts, repeat 0 first
    n_prompts: int


def _trials(data: dict) -> dict[tuple, dict[str, dict]]:
    """Per (prompt, repeat), each method's record; only the keys every method of the run has."""
    methods = data["settings"].get("methods") or list(dict.fromkeys(r["method"] for r in data["records"]))
    by_key: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in data.get("records") or []:
        if not {"prompt_id", "method", "tokens_per_s"} <= set(r):
            continue
        by_key[(str(r["prompt_id"]), r.get("repeat", 0) or 0)][r["method"]] = r
    return {k: v for k, v in by_key.items() if all(m in v for m in methods)
            and all(v[m].get("n_tokens", 0) > 0 for m in methods)}


def spread(data: dict, method: str, against: str = "plain") -> Spread | None:
    """`method`'s tok/s over `against`'s from the file's records (None where it has none of them)."""
    trials = [(k, v) for k, v in _trials(data).items() if method in v and against in v]
    if not trials or not all(v[against]["tokens_per_s"] > 0 for _, v in trials):
        return None
    mine = [v[method]["tokens_per_s"] for _, v in trials]
    theirs = [v[against]["tokens_per_s"] for _, v in trials]
    prompts = [k[0] for k, _ in trials]
    _, low, high, _ = speedup_spread(mine, theirs, prompts)
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    reps: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (prompt, repeat), m, t in zip((k for k, _ in trials), mine, theirs):
        sums[prompt][0] += m
        sums[prompt][1] += t
        reps[repeat][0] += m
        reps[repeat][1] += t
    return Spread(round(sum(mine) / sum(theirs), 3), low, high,
                  round(median(m / t for m, t in sums.values()), 3),
                  tuple(round(m / t, 3) for _, (m, t) in sorted(reps.items())), len(sums))


def repeats_of(data: dict) -> int:
    return int(data["settings"].get("repeats", 1) or 1)
