"""How `specgen bench` shows its results: a Rich table and a speedup chart (.svg, or .png via matplotlib)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Sequence
from xml.sax.saxutils import escape

from rich.table import Table

from specgen.bench.summary import JUMP, LOSS_MARGIN, OVERALL, HeadToHead, SummaryRow
from specgen.errors import ConfigError
from specgen.files import check_writable, replacing, write_text

PLOT_SUFFIXES = (".svg", ".png")
# Colour-blind-safe palette (Okabe-Ito), one colour per method.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442")


def _cell(row: SummaryRow, n_trials: int) -> str:
    if row.method == "plain":
        return f"{row.tokens_per_s:.1f} tok/s"
    noise = " [yellow]~noise[/yellow]" if row.within_noise else ""
    lines = [f"[bold]{row.speedup:.2f}x[/bold]{noise}"]
    if row.speedup_low < row.speedup_high:  # one prompt has no spread to show
        lines.append(f"{row.speedup_low:.2f}-{row.speedup_high:.2f} med {row.median_speedup:.2f}")
    if row.repeat_speedups:  # several repeats: each one's speedup, beside the interval over prompts
        lines.append("each run " + " ".join(f"{x:.2f}" for x in row.repeat_speedups))
    lines.append(f"{row.tokens_per_s:.1f} tok/s")
    if row.method != JUMP:  # jump drafts nothing of its own: τ 1.00, no acceptance
        lines.append(f"τ{row.mean_accepted:.2f} {row.acceptance_rate:.0%}")
    if row.forced_drafted:
        lines.append(f"forced {row.forced_accepted}/{row.forced_drafted}")
    if row.over_jump is not None and row.method != JUMP:
        lines.append(f"{row.over_jump:.2f}x jump")
    if row.lossless_mismatches is not None:  # say how many texts equal plain's, always
        same = n_trials - row.lossless_mismatches
        colour = "green" if row.lossless_mismatches == 0 else "red"
        lines.append(f"[{colour}]={same}/{n_trials}[/{colour}]")
    return "\n".join(lines)


def summary_table(rows: Sequence[SummaryRow], methods: Sequence[str], header: str, trials_per_prompt: int) -> Table:
    """Rows = groups (+ overall); one column per method: speedup (with its 90% interval and the
    median per-prompt speedup), tok/s, τ · acceptance, mismatches."""
    table = Table(title=header, title_justify="left", show_lines=True,
                  caption="speedup vs plain (~noise: its 90% bootstrap interval holds 1.0) · interval, "
                          "median per-prompt speedup · each run: the speedup in each repeat · tok/s · τ (tokens per target call) and acceptance, the "
                          "drafters' · forced A/D: tokens a grammar forced, accepted/drafted · Nx jump: speed "
                          "over jump-forward (what drafting adds) · =k/n: texts identical to plain (sampled: same seed)",
                  caption_justify="left")
    table.add_column("group", no_wrap=True)
    table.add_column("n", justify="right", min_width=2)
    for m in methods:
        table.add_column(m, justify="right", no_wrap=True)
    by_group: dict[tuple[str, int | None], dict[str, SummaryRow]] = defaultdict(dict)
    for r in rows:
        by_group[(r.group, r.turn)][r.method] = r
    for (group, turn), cells in by_group.items():
        n = next(iter(cells.values())).n_prompts
        label = f"[bold]{group}[/bold]" if group == OVERALL else group if turn is None else f"  turn {turn}"
        table.add_row(label, str(n), *(_cell(cells[m], n * trials_per_prompt) for m in methods))
    return table


def head_to_head_line(h: HeadToHead, rivals: Sequence[str]) -> str:
    """One line under the table: how a method fared against the fastest rival on each prompt."""
    tools = {r.split()[0] for r in rivals}
    against = f"the fastest {tools.pop()} row" if len(tools) == 1 else "the fastest other row"
    line = (f"{h.method} against {against} on each prompt: as fast or faster on {h.wins} of {h.n_prompts}; "
            f"slower by more than {LOSS_MARGIN:.0%} on ")
    if not h.losses:
        return line + "none"
    return line + f"{len(h.losses)}: " + ", ".join(
        f"prompt {x.prompt_id} at {x.ratio:.2f}x ({x.rival}; target calls {x.calls} against {x.rival_calls})"
        for x in h.losses)


def check_plot_path(path: Path) -> None:
    """Fail before a long run, not after it."""
    suffix = path.suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise ConfigError(f"--plot expects a .svg or .png file name, found {path.name!r}")
    if suffix == ".png":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot .png needs matplotlib (pip install 'specgen[plot]'); "
                              "or write .svg, which needs nothing") from None
    check_writable(path, "--plot")


def _bars(rows: Sequence[SummaryRow]) -> tuple[list[str], list[str], dict[tuple[str, str], float]]:
    rows = [r for r in rows if r.turn is None]  # a chart shows groups; the table shows their turns too
    groups = list(dict.fromkeys(r.group for r in rows))
    methods = [m for m in dict.fromkeys(r.method for r in rows) if m != "plain"]
    return groups, methods, {(r.group, r.method): r.speedup for r in rows}


def write_plot(rows: Sequence[SummaryRow], path: Path, title: str) -> None:
    """Speedup over plain per group per method, with a line at 1.0 (plain)."""
    if path.suffix.lower() == ".png":
        _write_png(rows, path, title)
    else:
        write_text(path, svg_chart(rows, title))


def svg_chart(rows: Sequence[SummaryRow], title: str) -> str:
    groups, methods, speedup = _bars(rows)
    bar_w, gap, left, top, height = 14, 18, 50, 40, 220
    group_w = max(1, len(methods)) * bar_w + gap
    width = left + len(groups) * group_w + 20 + 110
    top_value = max([1.0, *speedup.values()]) * 1.1
    y = lambda v: top + height * (1 - v / top_value)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + height + 60}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="20" font-size="13">{escape(title)}</text>']
    for tick in range(0, int(top_value) + 1):
        out.append(f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick}x</text>')
    for gi, group in enumerate(groups):
        x0 = left + gi * group_w + gap / 2
        for mi, method in enumerate(methods):
            v = speedup.get((group, method), 0.0)
            out.append(f'<rect x="{x0 + mi * bar_w:.1f}" y="{y(v):.1f}" width="{bar_w - 2}" '
                       f'height="{top + height - y(v):.1f}" fill="{PALETTE[mi % len(PALETTE)]}">'
                       f'<title>{escape(group)} {escape(method)}: {v:.2f}x</title></rect>')
        out.append(f'<text x="{x0 + len(methods) * bar_w / 2:.1f}" y="{top + height + 16}" '
                   f'text-anchor="middle">{escape(group)}</text>')
    right = left + len(groups) * group_w
    out.append(f'<line x1="{left}" x2="{right}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}" stroke="black" '
               f'stroke-dasharray="4 3"><title>plain = 1.0x</title></line>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + height}" stroke="black"/>')
    for mi, method in enumerate(methods):
        ly = top + 14 * mi
        out.append(f'<rect x="{right + 16}" y="{ly}" width="10" height="10" fill="{PALETTE[mi % len(PALETTE)]}"/>')
        out.append(f'<text x="{right + 30}" y="{ly + 9}">{escape(method)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _write_png(rows: Sequence[SummaryRow], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    groups, methods, speedup = _bars(rows)
    fig, ax = plt.subplots(figsize=(max(6, len(groups) * 1.2), 4))
    width = 0.8 / max(1, len(methods))
    for mi, method in enumerate(methods):
        xs = [gi + (mi - (len(methods) - 1) / 2) * width for gi in range(len(groups))]
        ax.bar(xs, [speedup.get((g, method), 0.0) for g in groups], width, label=method,
               color=PALETTE[mi % len(PALETTE)])
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)), groups, rotation=20)
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
