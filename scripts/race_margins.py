"""How often a draft's race finishers are the target's race winner, by the margin of the draft's race.

Per position of a text the target samples (its race, core/race.py): the draft's first three
finishers under the same noise, and the margin between its first two (logit + T g). The table it
writes is where drafting/tuning.py's RACE_FIRST / RACE_SECOND knots come from (docs/auto.md).

    python scripts/race_margins.py gemma-3-270m-f32 gemma-3-270m-f32-self 0.8 OUT.json [TOKENS]

Prompts: Spec-Bench's tune half (odd question ids), the first two of each category, first turns
as plain text (pair A's target is a base model).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from specgen.core.kv import evaluate
from specgen.core.sampling import Sampler, SamplingParams
from specgen.core.vocab import SubsetContext
from specgen.host import cpu_name
from specgen.llama.backend import LlamaModel
from specgen.models import resolve

SUITE = Path(__file__).resolve().parents[2] / "shared/bench/spec-bench/question.jsonl"
EDGES = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, float("inf"))


def prompts() -> list[dict]:
    by_group: dict[str, list[dict]] = {}
    for line in SUITE.read_text().splitlines():
        q = json.loads(line)
        if int(q["question_id"]) % 2 == 1:
            by_group.setdefault(q["category"], []).append(q)
    return [q for group in by_group.values() for q in group[:2]]


def main(target_name: str, draft_name: str, temperature: float, out: str, tokens: int = 60) -> None:
    target, draft = LlamaModel(resolve.resolve(target_name)), LlamaModel(resolve.resolve(draft_name))
    p_ctx, q_ctx = target.new_context(2048), draft.new_context(2048)
    if draft.subset_of_target is not None:
        q_ctx = SubsetContext(q_ctx, draft.subset_of_target, target.n_vocab)
    n_vocab, columns = p_ctx.n_vocab, q_ctx.columns

    def full(row: np.ndarray) -> np.ndarray:
        if columns is None:
            return row
        wide = np.full(n_vocab, -np.inf, dtype=row.dtype)
        wide[columns] = row
        return wide

    rows = []
    for i, q in enumerate(prompts()):
        text = target.tokenize(q["turns"][0] + "\n")
        sampler = Sampler(SamplingParams(temperature, seed=1000 + i))
        p_ctx.clear()
        q_ctx.clear()
        p_row, q_row = evaluate(p_ctx, text).copy(), full(evaluate(q_ctx, text).copy())
        for _ in range(tokens):
            pos = len(text)
            won = sampler.sample(p_row, pos)
            ids, scores = sampler.finishers(q_row, pos, 3)
            rows.append((ids.index(won) if won in ids else -1, scores[0] - scores[1]))
            text.append(won)
            p_row, q_row = evaluate(p_ctx, [won], pos).copy(), full(evaluate(q_ctx, [won], pos).copy())
    rank = np.array([r[0] for r in rows])
    margin = np.array([r[1] for r in rows])
    bins = []
    for lo, hi in zip(EDGES, EDGES[1:]):
        k = (margin >= lo) & (margin < hi)
        n = int(k.sum())
        bins.append(dict(margin_from=lo, margin_to=None if hi == float("inf") else hi, positions=n,
                         **{f"{name}_wins": round(float((rank[k] == r).mean()), 3) if n else None
                            for r, name in enumerate(("first", "second", "third"))}))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = dict(run=dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           command=["python", "scripts/race_margins.py", *sys.argv[1:]], commit=commit),
                  machine=dict(cpu=cpu_name()), target=target_name, draft=draft_name, temperature=temperature,
                  prompts="Spec-Bench tune half, 2 per category, first turns", tokens_per_prompt=tokens,
                  positions=len(rows), **{f"{name}_wins": round(float((rank == r).mean()), 3)
                                          for r, name in enumerate(("first", "second", "third"))},
                  bins=bins)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "bins"}))
    for b in bins:
        print(b)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], *(int(a) for a in sys.argv[5:6]))
