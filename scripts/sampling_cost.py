#!/usr/bin/env python3
"""What sampling costs plain decoding (issue 68): plain greedy and plain sampled runs of the same
prompts, interleaved prompt by prompt in one process on one loaded session (the target screened
where it may be: greedy and the race both keep it), tok/s of each, and their ratio per prompt with
a bootstrap over prompts.

    python scripts/sampling_cost.py -m gemma-3-270m-f32 --temperature 0.8 --out docs/results/DATE-x.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--target", required=True)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--suite", default="/work/shared/bench/spec-bench/question.jsonl")
    ap.add_argument("--per-group", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    from specgen.app.config import RunConfig
    from specgen.app.prompts import Prompt
    from specgen.app.runner import Runner
    from specgen.app.session import load_session
    from specgen.bench.run import trial_seed
    from specgen.bench.suites import load_suite, select, split_half
    from specgen.host import cpu_name

    cfg = RunConfig(target=a.target, draft=None, method="plain", max_tokens=a.max_tokens, threads=a.threads)
    session = load_session(cfg.loading, ["plain"])
    sampled_cfg = replace(cfg, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p)
    runners = {"greedy": Runner(cfg, session), "sampled": Runner(sampled_cfg, session)}
    _, pool = load_suite(a.suite)
    prompts = select(split_half(pool, "report"), a.per_group, None)
    for runner in runners.values():  # warm-up, not recorded
        runner.run(runner.ask(Prompt(0, prompts[0].turns[0]), 16))
    records = []
    for repeat in range(a.repeats):
        for p in prompts:
            for name, runner in runners.items():
                ask = runner.ask(Prompt(0, p.turns[0]))
                if name == "sampled":
                    ask = replace(ask, sampling=replace(ask.sampling, seed=trial_seed(0, p.prompt_id, repeat, 0)))
                done = runner.run(ask)
                records.append({"prompt_id": p.prompt_id, "group": p.group, "repeat": repeat, "run": name,
                                "n_tokens": done.stats.n_tokens, "tokens_per_s": round(done.stats.tokens_per_s, 3)})
    ratios = per_prompt_ratios(records)
    lo, hi = bootstrap(ratios)
    head = session.target.screen
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "machine": {"cpu": cpu_name(), "python": platform.python_version()},
           "settings": {**vars(a), "out": str(a.out), "screened": head is not None},
           "records": records,
           "summary": {"greedy_tok_s": mean_of(records, "greedy"), "sampled_tok_s": mean_of(records, "sampled"),
                       "ratio": round(mean_of(records, "sampled") / mean_of(records, "greedy"), 3),
                       "median_prompt_ratio": round(float(np.median(list(ratios.values()))), 3),
                       "interval_90": [lo, hi], "n_prompts": len(ratios)}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"]))


def mean_of(records: list[dict], run: str) -> float:
    return round(float(np.mean([r["tokens_per_s"] for r in records if r["run"] == run and r["n_tokens"]])), 2)


def per_prompt_ratios(records: list[dict]) -> dict[str, float]:
    """Per prompt, its repeats together: mean sampled tok/s over mean greedy tok/s."""
    by: dict[str, dict[str, list[float]]] = {}
    for r in records:
        if r["n_tokens"]:
            by.setdefault(r["prompt_id"], {}).setdefault(r["run"], []).append(r["tokens_per_s"])
    return {k: float(np.mean(v["sampled"]) / np.mean(v["greedy"])) for k, v in by.items()
            if "sampled" in v and "greedy" in v}


def bootstrap(ratios: dict[str, float], samples: int = 2000, level: float = 0.90) -> tuple[float, float]:
    """A percentile interval of the mean ratio, prompts resampled (each with its repeats)."""
    values = np.array(list(ratios.values()))
    rng = np.random.default_rng(0)
    means = values[rng.integers(0, len(values), (samples, len(values)))].mean(axis=1)
    return round(float(np.quantile(means, (1 - level) / 2)), 3), round(float(np.quantile(means, (1 + level) / 2)), 3)


if __name__ == "__main__":
    main()
