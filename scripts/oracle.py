#!/usr/bin/env python3
"""The ceiling of `auto`'s choice, in hindsight: per step the better of plain, lookup and the draft
model, knowing how many drafted tokens each would have had accepted; and what auto reached.

For each prompt (its first turn): plain decoding writes the greedy text (or, with -t and --seed, the
sampled text every method writes under that seed); then, at every position of
that text, how many tokens a lookup draft would have had accepted there (the longest path of the
lookup trie auto builds, from this text alone, that the text follows) and how many a draft chain
would (the draft's teacher-forced argmax, compared token by token: a chain's tokens are conditioned
on the text as long as they are accepted). An oracle that knows these picks, each step, plain (1
token for c(1)), lookup verifying exactly its accepted tokens (k + 1 for c(k + 1)) or a draft chain
of exactly its accepted length (k + 1 for k draft decodes + c(k + 1)), minimising the text's
modelled time (dynamic programming over positions) with the cost curves of the calibration cache.
Optimistic on purpose: the draft is taken as always caught up, verification as free beyond the
curve. Then plain and auto run the prompt back to back (interleaved) and their measured speeds are
set beside the oracle's modelled ratios.

    python scripts/oracle.py -c specgen/configs/bench-pair-a.yaml \\
        --suite ../shared/bench/spec-bench/question.jsonl --split tune --per-group 1 -n 128 --seed 1 --out oracle.json
    python scripts/oracle.py --table oracle.json      # the table docs/auto.md shows

With --seed, auto plans from the cached curves alone (no clocks), so its choices, and the modelled
ratios, do not depend on how busy the machine is; measured speeds still do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specgen.app.ask import SAMPLERS, why_exact_rows
from specgen.app.config import build_config
from specgen.app.prompts import Prompt
from specgen.app.runner import Runner, encode_prompt
from specgen.models.selfdraft import greedy_predictions
from specgen.app.session import load_session
from specgen.bench.suites import load_suite, select, split_half
from specgen.core.engine import TokenEvent
from specgen.core.stats import RunStats
from specgen.core.verify import Verdict
from specgen.drafting.lookup import LookupDrafter, continuation_tree

MAX_CHAIN = 16  # auto's draft chains are at most this long (methods.py)


@dataclass
class PromptCeiling:
    prompt_id: str
    group: str
    tokens: int
    modelled_plain_s: float
    oracle_s: float  # plain, lookup and draft
    no_draft_s: float  # plain and lookup
    draft_only_s: float  # plain and draft
    oracle_steps: dict[str, int]
    plain_tok_s: float  # measured
    auto_tok_s: float
    auto_steps: dict[str, int]
    auto_identical: bool
    auto_modelled_s: float  # auto's steps priced by the same curves (each tree's decode + its draft decodes)


def accepted_runs(predicted: list[int], text: list[int]) -> list[int]:
    """Per position i, how many of text[i:] a chain following `predicted` gets accepted."""
    runs = [0] * (len(text) + 1)
    for i in range(len(text) - 1, -1, -1):
        runs[i] = runs[i + 1] + 1 if predicted[i] == text[i] else 0
    return runs[:-1]


def lookup_runs(prompt: list[int], text: list[int], depth: int = 64, matches: int = 4) -> list[int]:
    """Per position, the longest path of auto's lookup trie (this text only) that the text follows."""
    lookup, runs = LookupDrafter(), []
    lookup.reset(list(prompt))
    for i, token in enumerate(text):
        found = lookup.continuations(lookup.matches(lookup.tokens, matches), depth)
        tree, _, _ = continuation_tree(lookup.tokens[-1], found, depth)
        kids, node, n = tree.children(), 0, 0
        for want in text[i:]:
            node = next((c for c in kids[node] if tree.tokens[c] == want), None)
            if node is None:
                break
            n += 1
        runs.append(n)
        lookup.observe(Verdict([], [token]), [token])
    return runs


def best_time(n: int, c_target, c_draft_1: float, lookup: list[int] | None, draft: list[int] | None):
    """Minimal modelled seconds to write n tokens and the steps of one best schedule, by kind."""
    best = [0.0] * (n + 1)
    choice: list[tuple[str, int]] = [("plain", 0)] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i], choice[i] = c_target(1) + best[i + 1], ("plain", 0)
        for kind, runs, draft_s in (("lookup", lookup, 0.0), ("draft", draft, c_draft_1)):
            if runs is None:
                continue
            top = min(runs[i], n - i - 1, MAX_CHAIN if kind == "draft" else 79)
            for k in range(1, top + 1):
                t = k * draft_s + c_target(k + 1) + best[i + k + 1]
                if t < best[i]:
                    best[i], choice[i] = t, (kind, k)
    steps: dict[str, int] = {}
    i = 0
    while i < n:
        kind, k = choice[i]
        steps[kind] = steps.get(kind, 0) + 1
        i += k + 1
    return best[0], steps


def table(path: Path) -> str:
    """A results file as docs/auto.md shows it (modelled ratios against plain, by prompt)."""
    data = json.loads(path.read_text())
    rows = ["| prompt | group | oracle | no draft | draft only | auto (modelled) | oracle's steps | auto's steps |",
            "|---|---|---|---|---|---|---|---|"]
    for r in data["prompts"]:
        plain = r["modelled_plain_s"]
        steps = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))  # noqa: E731
        rows.append(f"| {r['prompt_id']} | {r['group']} | {plain / r['oracle_s']:.2f}x | {plain / r['no_draft_s']:.2f}x | "
                    f"{plain / r['draft_only_s']:.2f}x | {plain / r['auto_modelled_s']:.2f}x | {steps(r['oracle_steps'])} | "
                    f"{steps(r['auto_steps'])} |")
    s = data["summary"]
    rows.append(f"| all | time-weighted | {s['oracle']:.2f}x | {s['oracle_no_draft']:.2f}x | {s['oracle_draft_only']:.2f}x | "
                f"{s['auto_modelled']:.2f}x | | |")
    return "\n".join(rows)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(table(Path(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", type=Path, required=True, help="a bench preset (target and draft)")
    parser.add_argument("--suite", required=True)
    parser.add_argument("--split", default="tune", choices=("tune", "report", "all"))
    parser.add_argument("--per-group", type=int, default=1)
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, help="write the per-prompt results as JSON")
    parser.add_argument("--seed", type=int, help="plan auto from the cached curves alone, no clocks (a busy machine)")
    parser.add_argument("--llama-server-sampler", action="store_true",
                        help="llama-server's default sampler (as `specgen bench --sampler llama-server`)")
    parser.add_argument("-t", "--temperature", type=float, default=0.0,
                        help="sample (with --seed: plain's sampled text, which every method writes under that seed; a "
                             "lookup draft is accepted where it follows it, so the lookup ceiling holds; the draft "
                             "column stays greedy's teacher-forced argmax, so leave it to presets without a draft)")
    args = parser.parse_args()
    settings = {"max_tokens": args.max_tokens, "method": "auto", "store": False, "temperature": args.temperature}
    if args.llama_server_sampler:
        settings.update(SAMPLERS["llama-server"])
        args.temperature = settings["temperature"]
    if args.temperature > 0 and args.seed is None:
        parser.error("--temperature needs --seed: plain and auto must write the same sampled text")
    if args.seed is not None:
        settings["seed"] = args.seed
    cfg = build_config(args.config, settings)
    session = load_session(cfg.loading, ["plain", "auto"], store_default=False,
                           screen=why_exact_rows(cfg.sampling, constrained=False) is None)
    plain, auto = Runner(dataclasses.replace(cfg, method="plain"), session), Runner(cfg, session)
    _, prompts = load_suite(args.suite)
    prompts = select(split_half(prompts, args.split), args.per_group)
    c_draft = session.draft_costs
    steps_run: list = []
    drafter = auto._learning(auto.ask(Prompt(0, "x"))).drafter  # auto's own, kept across prompts: log each step
    record = drafter._record
    drafter._record = lambda step: (steps_run.append(step), record(step))[1]
    results = []
    for bp in prompts:
        prompt = Prompt(0, bp.turns[0])
        session.forget_texts()
        ids = encode_prompt(session.target, prompt, plain.chat, cfg.system)
        t0 = time.perf_counter()
        plain_stats, auto_stats = RunStats(), RunStats()
        text = [e.token for e in plain.stream(plain.ask(prompt), plain_stats) if isinstance(e, TokenEvent)]
        session.forget_texts()
        steps_run.clear()
        auto_text = [e.token for e in auto.stream(auto.ask(prompt), auto_stats) if isinstance(e, TokenEvent)]
        n = len(text)
        context = len(ids)
        c_target = session.costs.given(context + n // 2)
        drafted = accepted_runs(greedy_predictions(session.draft_ctx, [(ids + text, len(ids))]), text) \
            if session.draft_ctx is not None else None
        if session.draft_ctx is not None:
            session.draft_ctx.clear()
        looked = lookup_runs(ids, text)
        d1 = c_draft(1, context + n // 2) if c_draft is not None else 0.0
        oracle_s, steps = best_time(n, c_target, d1, looked, drafted)
        no_draft_s, _ = best_time(n, c_target, d1, looked, None)
        draft_only_s, _ = best_time(n, c_target, d1, None, drafted)
        auto_s = sum(c_target(len(step.tree)) + step.draft_calls * d1 for step in steps_run)
        r = PromptCeiling(bp.prompt_id, bp.group, n, n * c_target(1), oracle_s, no_draft_s, draft_only_s, steps,
                          plain_stats.n_tokens / plain_stats.decode_s, auto_stats.n_tokens / auto_stats.decode_s,
                          dict(auto_stats.choices), auto_text == text, auto_s)
        results.append(r)
        print(f"{bp.prompt_id:>6} {bp.group:<12} n={n:3d}  oracle {r.modelled_plain_s / oracle_s:4.2f}x "
              f"(no draft {r.modelled_plain_s / no_draft_s:4.2f}x, draft only {r.modelled_plain_s / draft_only_s:4.2f}x) "
              f"steps {steps}  auto modelled {r.modelled_plain_s / auto_s:4.2f}x, measured {r.auto_tok_s / r.plain_tok_s:4.2f}x "
              f"steps {dict(auto_stats.choices)}  {time.perf_counter() - t0:.0f} s",
              flush=True)
    total = lambda f: sum(f(r) for r in results)  # noqa: E731
    plain_total = total(lambda r: r.modelled_plain_s)
    auto_ratio = total(lambda r: r.tokens / r.auto_tok_s)
    plain_measured = total(lambda r: r.tokens / r.plain_tok_s)
    summary = {"oracle": plain_total / total(lambda r: r.oracle_s),
               "oracle_no_draft": plain_total / total(lambda r: r.no_draft_s),
               "oracle_draft_only": plain_total / total(lambda r: r.draft_only_s),
               "auto_modelled": plain_total / total(lambda r: r.auto_modelled_s),
               "auto_measured": plain_measured / auto_ratio}
    print("all prompts, time-weighted: " + ", ".join(f"{k} {v:.2f}x" for k, v in summary.items()))
    if args.out:
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or
                                        platform.machine(), "config": str(args.config), "split": args.split,
                                        "max_tokens": args.max_tokens, "temperature": args.temperature,
                                        "llama_server_sampler": args.llama_server_sampler,
                                        "seed": args.seed, "target": cfg.target, "draft": cfg.draft,
                                        "summary": summary, "prompts": [asdict(r) for r in results]}, indent=1))


if __name__ == "__main__":
    main()
