#!/usr/bin/env python3
"""`specgen serve` with `auto` against a plain server, first sight of the prompts and again: the
client behind docs/serve.md's figures.

It starts two servers on the same model, `--method plain` and `--method auto` (both `--no-store`),
or uses two already running (--plain-url, --auto-url), and sends each Spec-Bench prompt to both
through OpenAI's client, interleaved request by request, greedy. A prompt with two turns (MT-bench)
sends its second turn after plain's first answer, to both servers. Speed is each response's
`timings.predicted_per_second` (decode only, the prompt excluded), as llama-server reports it.

Pass 1 is **first sight**: neither server has seen the prompts. Pass 2 (and later) sends the very
same requests again: greedy answers repeat, and `auto` drafts from the answers it wrote on pass 1,
which it keeps in the process, so a repeat measures a **cache** (what an agent that re-sends the same
request, or a retried request, meets), not speculative decoding on new text. The table prints both.

    pip install openai          # the client; the servers need only specgen
    python scripts/serve_bench.py --suite PATH/TO/spec-bench/question.jsonl -m smollm2-135m-instruct-q4_1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

from specgen.bench.suites import load_suite, select, split_half

WARMUP = [{"role": "user", "content": "Say hello."}]


def start_server(args: argparse.Namespace, method: str, port: int, stack: ExitStack) -> str:
    """`specgen serve` on `port` with `method`; its base URL once /health answers."""
    cmd = [sys.executable, "-m", "specgen", "serve", "-m", args.model, "--method", method, "--no-store",
           "--port", str(port), *(["-d", args.draft] if args.draft else []),
           *(["--threads", str(args.threads)] if args.threads else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stack.callback(_stop, proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"serve_bench: the {method} server exited ({proc.returncode}): "
                     f"{(proc.stderr.read() or '').strip().splitlines()[-1:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return url + "/v1"
        except OSError:
            time.sleep(0.5)
    sys.exit(f"serve_bench: the {method} server did not answer /health within {args.start_timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: the server ends cleanly
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def ask(client, messages: list[dict], max_tokens: int) -> tuple[str, float, dict]:
    """One greedy chat request: its answer, decode tok/s, and the server's `speculative` object."""
    response = client.chat.completions.create(model="served", messages=messages, max_tokens=max_tokens,
                                              temperature=0)
    extra = response.model_extra or {}
    return (response.choices[0].message.content or "", float(extra["timings"]["predicted_per_second"]),
            extra.get("speculative") or {})


def run_pass(clients: dict, prompts, max_tokens: int, pass_no: int) -> list[dict]:
    """Every prompt's turns to both servers, plain first; one row per request."""
    rows = []
    for prompt in prompts:
        messages = []
        for turn_no, question in enumerate(prompt.turns, 1):
            messages.append({"role": "user", "content": question})
            answers = {}
            for name, client in clients.items():
                text, tps, spec = ask(client, messages, max_tokens)
                answers[name] = text
                rows.append({"pass": pass_no, "prompt_id": prompt.prompt_id, "group": prompt.group,
                             "turn": turn_no if len(prompt.turns) > 1 else None, "server": name,
                             "tokens_per_s": tps, "mean_accepted": spec.get("mean_accepted"),
                             "same_as_plain": text == answers["plain"]})
            messages.append({"role": "assistant", "content": answers["plain"]})
        print(f"pass {pass_no}: {prompt.prompt_id} done", file=sys.stderr)
    return rows


def ratios(rows: list[dict]) -> dict[str, tuple[float, float, float]]:
    """Per group (MT-bench per turn) and overall: (auto tok/s mean, plain tok/s mean, ratio)."""
    speeds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for key in (r["group"] if r["turn"] is None else f"{r['group']} t{r['turn']}", "overall"):
            speeds[key][r["server"]].append(r["tokens_per_s"])
    out = {}
    for key, by in speeds.items():
        auto, plain = (sum(by[s]) / len(by[s]) for s in ("auto", "plain"))
        out[key] = (auto, plain, auto / plain if plain else 0.0)
    return out


def table(rows: list[dict], passes: int) -> str:
    per_pass = [ratios([r for r in rows if r["pass"] == p]) for p in range(1, passes + 1)]
    keys = [k for k in per_pass[0] if k != "overall"] + ["overall"]
    lines = ["| pass | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for p, found in enumerate(per_pass, 1):
        label = "first sight" if p == 1 else f"repeat {p - 1} (the same requests again: a cache)"
        cells = [f"{found[k][2]:.2f}x" for k in keys[:-1]]
        auto, plain, ratio = found["overall"]
        cells.append(f"{ratio:.2f}x ({auto:.1f} vs {plain:.1f} tok/s)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    same = [r["same_as_plain"] for r in rows if r["server"] == "auto"]
    lines.append(f"\nauto's answers identical to plain's: {sum(same)} of {len(same)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", required=True, help="Spec-Bench's question.jsonl (or any bench suite)")
    parser.add_argument("-m", "--model", default="smollm2-135m-instruct-q4_1")
    parser.add_argument("-d", "--draft", help="a draft model for both servers (default: none)")
    parser.add_argument("--per-group", type=int, default=5, help="prompts per group [5: the quick subset]")
    parser.add_argument("--split", default="all", choices=["all", "tune", "report"])
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=2, help="1: first sight only; 2+: then repeats [2]")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--port", type=int, default=8091, help="the plain server's port; auto's is the next")
    parser.add_argument("--plain-url", help="a running plain server's /v1 URL (then --auto-url too)")
    parser.add_argument("--auto-url", help="a running auto server's /v1 URL")
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--json", type=Path, help="write every request's row to this file")
    args = parser.parse_args()
    try:
        from openai import OpenAI
    except ImportError:
        sys.exit("serve_bench: needs OpenAI's client: pip install openai")
    _, pool = load_suite(args.suite)
    prompts = select(split_half(pool, args.split), args.per_group)
    with ExitStack() as stack:
        if args.plain_url and args.auto_url:
            urls = {"plain": args.plain_url, "auto": args.auto_url}
        else:
            urls = {"plain": start_server(args, "plain", args.port, stack),
                    "auto": start_server(args, "auto", args.port + 1, stack)}
        clients = {name: OpenAI(base_url=url, api_key="none", timeout=600) for name, url in urls.items()}
        for client in clients.values():
            ask(client, WARMUP, 8)  # not recorded
        rows = [r for p in range(1, args.passes + 1) for r in run_pass(clients, prompts, args.max_tokens, p)]
    print(f"{args.model}, {len(prompts)} prompts, {args.max_tokens} tokens, greedy; auto over plain, "
          f"decode tok/s (timings.predicted_per_second)\n")
    print(table(rows, args.passes))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
