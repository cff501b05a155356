"""Several agent conversations through one `specgen serve`, one at a time against interleaved.

Agent frameworks run several conversations at once (a planner and sub-agents, parallel tool
loops), so one server sees their requests alternate. The prompt cache keeps several prefixes
(`--prompt-cache-mb`); this measures whether it holds them: the agent suite's conversations (report
half, hermes model, greedy, answers asking tool_choice none as in docs/agent-bench.md) sent to a
fresh `specgen serve --method auto` (its cache on) one conversation at a time, then in groups of 2
and of 4 whose requests take turns. Every request goes to a cold server too (the same method with
--no-prompt-cache), whose replies build every conversation's history: each schedule sends the same
requests, and every cached reply must equal the cold one.

    python scripts/interleave_bench.py OUT.json [--threads 1] [--limit N]
    python scripts/interleave_bench.py OUT.json --render     # its table, as docs/agent-bench.md shows it
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from specgen.bench.agent import ANSWER, CALL, Row, request_body, start_all, stop_all
from specgen.bench.agent_http import ChatCompletion, chat
from specgen.bench.agent_suite import AgentConversation, load_agent_suite, tool_result
from specgen.bench.results import machine_info
from specgen.host import cpu_sample, others_cores
from specgen.llama import tools

MODEL = "smollm2-135m-instruct-hermes"
MAX_TOKENS = 128


def requests_of(conv: AgentConversation) -> Iterator[dict]:
    """The conversation's request bodies in order; each `send()` takes the cold server's reply,
    from which the history goes on (as bench/agent.run_conversation does from its reference)."""
    messages: list[dict] = [{"role": "system", "content": conv.system}]
    for user in conv.turns:
        messages.append({"role": "user", "content": user})
        for kind in (CALL, ANSWER):
            reference: ChatCompletion = yield request_body(conv, messages, kind, MAX_TOKENS, "none")
            messages.append(reference.message())
            for i, call in enumerate(reference.runnable):
                messages.append({"role": "tool", "tool_call_id": f"call_{i}", "name": call["name"],
                                 "content": tool_result(conv, call["name"], call["arguments"])})
            if not reference.runnable:
                break


def run_schedule(convs: list[AgentConversation], group: int, rows: list[Row], logs: Path) -> list[dict]:
    """Fresh servers; conversations in groups of `group` whose requests take turns."""
    servers = start_all(rows, logs)
    records = []
    try:
        for start in range(0, len(convs), group):
            live = {c.prompt_id: requests_of(c) for c in convs[start:start + group]}
            bodies = {pid: next(gen) for pid, gen in live.items()}
            while bodies:
                for pid in list(bodies):
                    cold = chat(servers["cold"].url, bodies[pid])
                    cached = chat(servers["cached"].url, bodies[pid])
                    records.append(dict(group=group, prompt_id=pid, wall_s=cached.wall_s, prompt_n=cached.prompt_n,
                                        cache_n=cached.cache_n, completion_tokens=cached.completion_tokens,
                                        identical=cached.same_as(cold) and not cached.error and not cold.error,
                                        error=cached.error or cold.error))
                    try:
                        bodies[pid] = live[pid].send(cold)
                    except StopIteration:
                        del bodies[pid]
    finally:
        stop_all(servers)
    return records


def summary(records: list[dict]) -> dict:
    return dict(requests=len(records), wall_s=round(sum(r["wall_s"] for r in records), 3),
                prompt_n=sum(r["prompt_n"] for r in records), cache_n=sum(r["cache_n"] for r in records),
                completion_tokens=sum(r["completion_tokens"] for r in records),
                identical=sum(r["identical"] for r in records))


def by_schedule(records: list[dict], groups=(1, 2, 4)) -> dict:
    """Per group size: the totals, and wall time and prompt tokens read against one at a time."""
    out = {str(g): summary([x for x in records if x["group"] == g]) for g in groups}
    one = out["1"]
    return {g: {**s, "wall_over_one": round(s["wall_s"] / one["wall_s"], 3),
                "prompt_over_one": round(s["prompt_n"] / one["prompt_n"], 3),
                "identical_of": f"{s['identical']}/{s['requests']}"} for g, s in out.items()}


def render(result: dict) -> str:
    """The markdown table docs/agent-bench.md shows (`--render FILE.json`)."""
    names = {"1": "one at a time", "2": "2 interleaved", "4": "4 interleaved"}
    lines = ["| schedule | requests | wall (s) | against one at a time | prompt tokens read | against one at a time "
             "| kept from the cache | identical to the cold server |", "|---|---|---|---|---|---|---|---|"]
    for g, s in result["summary"].items():
        lines.append(f"| {names.get(g, g)} | {s['requests']} | {s['wall_s']} | {s['wall_over_one']} | {s['prompt_n']} "
                     f"| {s['prompt_over_one']} | {s['cache_n']} | {s['identical_of']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2, help="each schedule this many times, rotating their order")
    ap.add_argument("--render", action="store_true", help="print the table of OUT (a results file) and stop")
    args = ap.parse_args()
    if args.render:
        print(render(json.loads(Path(args.out).read_text())))
        return
    convs = load_agent_suite("report")[:args.limit]
    base = [sys.executable, "-m", "specgen", "serve", "-m", MODEL, "--no-store", "--threads", str(args.threads),
            "--method", "auto"]
    rows = [Row("cold", [*base, "--no-prompt-cache"], "specgen"), Row("cached", base, "specgen")]
    before = cpu_sample()
    groups, records = (1, 2, 4), []
    with tempfile.TemporaryDirectory(prefix="specgen-interleave-") as logs:
        for r in range(args.rounds):
            for group in groups[r % 3:] + groups[:r % 3]:  # rotated: drift hits every schedule alike
                records += [dict(rec, round=r) for rec in run_schedule(convs, group, rows, Path(logs))]
                print(group, summary([x for x in records if x["group"] == group and x["round"] == r]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = dict(run=dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           command=["python", "scripts/interleave_bench.py", *sys.argv[1:]], commit=commit),
                  machine={**machine_info(args.threads, tools.build_info()), "others_cores": others_cores(before, cpu_sample())},
                  settings=dict(model=MODEL, method="auto", split="report", conversations=len(convs),
                                max_tokens=MAX_TOKENS, answer_tool_choice="none", temperature=0.0,
                                threads=args.threads, rounds=args.rounds),
                  summary=by_schedule(records, groups),
                  records=records)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
