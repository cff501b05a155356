"""The agent bench's results file as markdown (`specgen bench-report` renders it, published.py
hands it here): the caption, a row per server over the whole loop, and per turn."""

from __future__ import annotations

from pathlib import Path

from specgen.bench.captions import machine_caption, run_caption


def _caption(data: dict, link: str) -> str:
    run, settings = data.get("run") or {}, data["settings"]
    half = settings.get("split") or "all"
    target = (data.get("models") or {}).get("target") or {}
    n_requests = next((r["n_requests"] for r in data["summary"] if r["turn"] is None and r["prompt_id"] is None), 0)
    cut = " · **interrupted: the requests every row answered**" if settings.get("interrupted") else ""
    n_convs = len({r["prompt_id"] for r in data["summary"] if r["prompt_id"] is not None})
    return (f"*{run_caption(run)} · {machine_caption(data.get('machine', {}))} · "
            f"suite agent{'' if half == 'all' else f', {half} half'}: {n_convs} of {settings.get('n_prompts', '?')} conversations, "
            f"{n_requests} requests per row, greedy, at most {settings.get('max_tokens', '?')} tokens a request"
            f"{_answers(settings)} · "
            f"target {target.get('name', '?')}{_template(settings)}{cut} · results: [{Path(link).name}]({link})*")


def _template(settings: dict) -> str:
    name = settings.get("llama_cpp_template")
    return f" · llama-server's chat template {name}" if name else ""


def _answers(settings: dict) -> str:
    choice = settings.get("answer_tool_choice") or "auto"
    return "" if choice == "auto" else f", answers with tool_choice {choice}"


def _new_line(data: dict, names: list[str], overall: dict) -> list[str]:
    """Prompt tokens read against the tokens new to each request (agent_summary.new_tokens), where
    the file has them: every request, then past each conversation's first."""
    from specgen.bench.agent_summary import PromptTokens, past_the_first

    rows = [overall[n] for n in names if n in overall and "prompt_new" in overall[n]]
    if not rows:
        return []
    return ["", "Prompt tokens read / new to each request (new: its prompt less the previous request's prompt and "
            "reply, where the history holds that reply as written), over all requests, then past each "
            "conversation's first: " +
            "; ".join(f"{r['row']} {PromptTokens(r['prompt_read'], r['prompt_new'])}, "
                      f"{past_the_first(data['records'], r['row'])}" for r in rows) + "."]


def _per_token_ms(r: dict) -> float:
    """The loop's wall time per token the row decoded: rows that wrote more (a model cut by the
    token limit more often, say) are not faster for it."""
    return 1000 * r["wall_s"] / max(r["decode_tokens"], 1)


def _interval(records: list[dict], rival: str) -> str:
    """The loop ratio's 90% interval over conversations, each resampled with all its requests."""
    from specgen.bench.agent_summary import loop_spread

    spread = loop_spread(records, rival, "auto") if records and "wall_s" in records[0] else None
    return f" (90% interval over conversations {spread[0]:.2f}-{spread[1]:.2f}x)" if spread else ""


def _lead(names: list[str], overall: dict, records: list[dict] | None = None) -> list[str]:
    """First, what a user compares: specgen's `auto` with its cache against llama-server as it runs
    (its cache on), and against specgen's own cached plain: the whole loop's time (with its interval
    over conversations, from `records`) and, since the rows need not write the same tokens, its time
    per decoded token."""
    auto = overall.get("auto")
    rivals = [n for n in names if n in overall and (n.startswith("llama-server") or n == "plain")]
    if auto is None or not rivals:
        return []
    parts = [f"{n} {overall[n]['wall_s'] / auto['wall_s']:.2f}x{_interval(records or [], n)} and "
             f"{_per_token_ms(overall[n]) / _per_token_ms(auto):.2f}x ({overall[n]['decode_tokens']} "
             f"tokens decoded against auto's {auto['decode_tokens']}"
             + (f"; its histories are the baseline's replies, and {overall[n]['identical']} of its "
                f"{overall[n]['n_requests']} replies were the same" if n.startswith("llama-server") else "") + ")"
             for n in rivals]
    return ["`auto` (prompt cache on) ran, over the whole loop and per decoded token, this many times as fast "
            "as " + "; as ".join(parts) + ".", ""]


def render(data: dict, link: str) -> str:
    summary = data["summary"]
    names = data["settings"].get("methods") or list(dict.fromkeys(r["row"] for r in summary))
    overall = {r["row"]: r for r in summary if r["turn"] is None and r["prompt_id"] is None}
    base = data["settings"].get("baseline")
    lines = [_caption(data, link), "", *_lead(names, overall, data.get("records")),
             "| row | loop s | speedup | decoded tokens | loop ms / decoded token | TTFT call s | TTFT answer s "
             "| decode tok/s | decode ratio | prompt read / cached | identical | calls valid |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        r = overall.get(name)
        if r is None:
            continue
        same = "" if name == base else f"{r['identical']}/{r['n_requests']}"
        errors = f" ({r['errors']} errors)" if r.get("errors") else ""
        lines.append(f"| {name} | {r['wall_s']:.1f} | {r['speedup']:.2f}x | {r['decode_tokens']} | "
                     f"{_per_token_ms(r):.1f} | {r['ttft_call_s']:.2f} | "
                     f"{r['ttft_answer_s']:.2f} | {r['tokens_per_s']:.1f} | {r['decode_ratio']:.2f}x | "
                     f"{r['prompt_read']} / {r['prompt_cached']} | {same} | {r['calls_valid']}/{r['call_requests']}"
                     f"{errors} |")
    lines += _new_line(data, names, overall)
    turns = sorted({r["turn"] for r in summary if r["turn"] is not None})
    if turns:
        lines += ["", "Per turn: the turn's wall time in seconds (speedup over the baseline) · the call's time to "
                  "first token:", "", "| row | " + " | ".join(f"turn {t}" for t in turns) + " |",
                  "|---|" + "---|" * len(turns)]
        cell = {(r["row"], r["turn"]): r for r in summary if r["turn"] is not None}
        for name in names:
            cells = [cell.get((name, t)) for t in turns]
            lines.append(f"| {name} | " + " | ".join(
                f"{c['wall_s']:.1f} ({c['speedup']:.2f}x) · {c['ttft_call_s']:.2f}" if c else "" for c in cells) + " |")
    convs = [r for r in summary if r["prompt_id"] is not None]
    if convs:
        lines += ["", "Per conversation, the loop's speedup over the baseline: " + "; ".join(
            f"{name} " + ", ".join(f"{r['prompt_id']} {r['speedup']:.2f}x" for r in convs if r["row"] == name)
            for name in names if name != base) + "."]
    return "\n".join(lines) + "\n"


TTFT_TURN = 4  # issue 56's aim: the call's time to first token at turn 4


def _spread(xs: list[float], fmt: str = "{:.2f}x") -> str:
    """The median over runs, and the range when there are several."""
    xs = sorted(xs)
    mid = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    return fmt.format(mid) + ("" if len(xs) < 2 else f" ({fmt.format(xs[0])}-{fmt.format(xs[-1])})")


def across(runs: list[dict]) -> str:
    """Several runs of the same conversations: each row's ratios as the median over the runs (the
    range across them), and per conversation, in how many runs a row was faster over the whole loop
    than every llama-server row."""
    names = list(dict.fromkeys(n for d in runs for n in d["settings"].get("methods") or ()))
    base = runs[0]["settings"].get("baseline")
    over = [{r["row"]: r for r in d["summary"] if r["turn"] is None and r["prompt_id"] is None} for d in runs]
    at_turn = [{r["row"]: r for r in d["summary"] if r["turn"] == TTFT_TURN and r["prompt_id"] is None}
               for d in runs]
    lines = [f"Across the {len(runs)} runs above: each ratio's median (and range), against {base} on the same "
             f"requests; TTFT at turn {TTFT_TURN} is the call request's time to first token over the baseline's "
             "(lower: sooner).", "",
             f"| row | loop speedup | decode ratio | lowest decode ratio of a conversation | TTFT call, turn {TTFT_TURN} "
             "| wins over every llama-server row, per conversation |", "|---|---|---|---|---|---|"]
    for name in names:
        if name == base or not all(name in o for o in over):
            continue
        wins = []
        for d in runs:
            convs = {}
            for r in d["summary"]:
                if r["prompt_id"] is not None and r["turn"] is None:
                    convs.setdefault(r["prompt_id"], {})[r["row"]] = r["wall_s"]
            theirs = [n for n in d["settings"].get("methods") or () if n.startswith("llama-server")]
            wins.append(f"{sum(all(c[name] < c[t] for t in theirs) for c in convs.values())}/{len(convs)}"
                        if theirs and not name.startswith("llama-server") else "")
        ttft = [a[name]["ttft_call_ratio"] for a in at_turn if name in a]
        lowest = [min((r["decode_ratio"] for r in d["summary"] if r["row"] == name and r["prompt_id"] is not None
                       and r["turn"] is None), default=0.0) for d in runs]
        lines.append(f"| {name} | {_spread([o[name]['speedup'] for o in over])} | "
                     f"{_spread([o[name]['decode_ratio'] for o in over])} | {_spread(lowest)} | "
                     f"{_spread(ttft) if ttft else ''} | "
                     f"{', '.join(w for w in wins if w)} |")
    return "\n".join(lines) + "\n"
