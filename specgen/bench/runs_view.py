"""Several runs of one setting, published together: each figure's median over the runs and their
range, with each run's own value and its file named (`<!-- bench-table: --runs FILE FILE ... -->`;
each file stays checked in and may have its own table elsewhere on the page)."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Sequence

from specgen.bench.captions import run_caption
from specgen.errors import ConfigError

OVERALL = "overall"
LLAMA_CPP_PLAIN = "llama.cpp plain"
# Settings two runs of one setting may differ in: whether a run was cut short is shown, not compared.
_PER_RUN = {"interrupted"}


def median_range(xs: Sequence[float], fmt: str = "{:.2f}x") -> str:
    """The median over the runs, then their range in brackets."""
    low = fmt.format(min(xs))
    return f"{fmt.format(median(xs))} ({low.removesuffix('x') if fmt.endswith('x') else low}-{fmt.format(max(xs))})"


def _same_setting(datas: Sequence[dict], names: Sequence[str]) -> None:
    first = datas[0]
    for data, name in zip(datas[1:], names[1:]):
        keys = set(first["settings"]) | set(data["settings"])
        differ = sorted(k for k in keys - _PER_RUN if first["settings"].get(k) != data["settings"].get(k))
        target = ((first.get("models") or {}).get("target") or {}).get("sha256"), \
            ((data.get("models") or {}).get("target") or {}).get("sha256")
        if target[0] != target[1]:
            differ.append("the target's sha256")
        if differ:
            raise ConfigError(f"--runs: {name} is not a run of {names[0]}'s setting (differs in {', '.join(differ)})")


def _overall(data: dict) -> dict[str, dict]:
    return {r["method"]: r for r in data["summary"] if r["group"] == OVERALL and r.get("turn") is None}


def _label(method: str) -> str:
    return method if method.startswith("llama.cpp") else f"specgen `{method}`"


def across_runs(datas: Sequence[dict], links: Sequence[str]) -> str:
    """The markdown of several runs of one setting (`links`: each file as the page links it)."""
    names = [Path(link).name for link in links]
    if len(datas) < 2:
        raise ConfigError(f"--runs needs two runs or more of one setting, found {len(datas)}")
    if any(d["settings"].get("suite") == "agent" for d in datas):
        raise ConfigError("--runs: agent bench files give their spread in a block of their own (without --runs)")
    _same_setting(datas, names)
    overall = [_overall(d) for d in datas]
    methods = [m for m in datas[0]["settings"].get("methods") or list(overall[0]) if all(m in o for o in overall)]
    runs = "; ".join(f"[{name}]({link}): {run_caption(d.get('run') or {})}" for d, name, link in zip(datas, names, links))
    sampled = any(d["settings"].get("temperature") for d in datas)
    lines = [f"*{len(datas)} runs of one setting, in this order: {runs}. Each figure is the median over the runs "
             "and, in brackets, their range; then each run's own.*", "",
             "| | over specgen plain | each run | tok/s | each run | identical to plain, each run |",
             "|---|---|---|---|---|---|"]
    for m in methods:
        rows = [o[m] for o in overall]
        ratio = "1.00x" if m == "plain" else median_range([r["speedup"] for r in rows])
        if m == "auto":
            ratio = f"**{ratio.split(' ')[0]}** {ratio.split(' ', 1)[1]}"
        each = "" if m == "plain" else ", ".join(f"{r['speedup']:.2f}x" for r in rows)
        same = "" if m == "plain" or (sampled and m.startswith("llama.cpp")) or \
            any(r.get("lossless_mismatches") is None for r in rows) else ", ".join(
                f"{r['n_prompts'] * (d['settings'].get('repeats') or 1) - r['lossless_mismatches']}/"
                f"{r['n_prompts'] * (d['settings'].get('repeats') or 1)}" for r, d in zip(rows, datas))
        rates = [r["tokens_per_s"] for r in rows]
        lines.append(f"| {_label(m)} | {ratio} | {each} | {median_range(rates, '{:.1f}')} | "
                     + ", ".join(f"{x:.1f}" for x in rates) + f" | {same} |")
    lines.append("")
    if all("auto" in o and o.get(LLAMA_CPP_PLAIN, {}).get("speedup") for o in overall):
        leads = [o["auto"]["speedup"] / o[LLAMA_CPP_PLAIN]["speedup"] for o in overall]
        lines += [f"`auto` against llama.cpp plain: {median_range(leads)}; each run "
                  + ", ".join(f"{x:.2f}x" for x in leads) + ".", ""]
    versus = [next((h for h in d.get("head_to_head") or [] if h["method"] == "auto"), None) for d in datas]
    if all(versus):
        lines += ["`auto` as fast as or faster than the fastest llama.cpp row, each run: "
                  + ", ".join(f"on {h['wins']} of {h['n_prompts']} prompts" for h in versus) + ".", ""]
    return "\n".join(lines[:-1]) + "\n"
