"""Published tables: markdown rendered from checked-in `specgen bench --json` files (`specgen bench-report`).

A page holds a table between two markers naming the results files it is rendered from, relative to
the page:

    <!-- bench-table: results/2026-11-26-pair-a.json -->
    ...what render_files() writes...
    <!-- bench-table:end -->

A marker whose first word is `--runs` names several runs of one setting, shown together as each
figure's median over the runs and their range (runs_view.py). Spreads are computed from the records
(spreads.py): with several repeats per prompt, prompts are resampled whole with their repeats.

`specgen bench-report --update PAGE` rewrites every such block from its files, `--check PAGE` fails
where a block and its files disagree (tests/test_bench_report.py checks every page in docs/ and
README.md so; markers shown as examples in fenced code are not read), and `--publish OUT` writes
a results file fit to check in: the generated texts replaced by their sha256 (they may quote the
benchmark's prompts, whose text stays out of the repository; their lengths, counters and
identical-to-plain counts stay).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Sequence

from specgen.bench.captions import machine_caption, run_caption
from specgen.bench.run import UNSCREENED
from specgen.bench.spreads import Spread, repeats_of, spread
from specgen.drafting.methods import JUMP
from specgen.errors import ConfigError

START, END = "<!-- bench-table:", "<!-- bench-table:end -->"
_BLOCK = re.compile(r"^<!-- bench-table: (?P<files>[^>]*?) -->\n(?P<body>.*?)<!-- bench-table:end -->", re.S | re.M)
_FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$", re.S | re.M)
OVERALL = "overall"
LLAMA_CPP_PLAIN = "llama.cpp plain"
RUNS = "--runs"  # a marker's option: its files are runs of one setting (runs_view)
def load(path: Path) -> dict:
    """A bench --json file, or a one-line ConfigError saying what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read bench results {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"bench results {path} are not JSON: {e}") from None
    if not is_results(data):
        raise ConfigError(f"{path} is not a `specgen bench --json` file (expected summary, settings and models)")
    return data


def is_results(data) -> bool:
    """Whether parsed JSON is a `specgen bench --json` file (not some other script's)."""
    return isinstance(data, dict) and {"summary", "settings", "models"} <= set(data)


def publish(data: dict) -> dict:
    """`data` with each record's generated text replaced by its sha256 (see the module's note)."""
    records = [{k: v for k, v in r.items() if k != "text"}
               | ({"text_sha256": hashlib.sha256(r["text"].encode()).hexdigest()} if "text" in r else {})
               for r in data.get("records", [])]
    return {**data, "records": records}


def _sha(model: dict | None) -> str:
    return f"sha256 `{model['sha256']}`" if model and model.get("sha256") else "sha256 not recorded"


def _model_line(role: str, model: dict | None) -> str | None:
    if not model:
        return None
    facts = [model.get("file_type")]
    if model.get("head_type") and model.get("head_type") != model.get("file_type"):
        facts.append(f"embedding/output {model['head_type']}")
    if model.get("n_vocab"):
        facts.append(f"vocabulary cut to {model['n_vocab']:,} tokens" if model.get("vocabulary_cut")
                     else f"{model['n_vocab']:,} tokens")
    what, name = ", ".join(f for f in facts if f), model.get("name", "?")
    if what and name.endswith(")"):  # "NAME (how it was made)": one bracket for both
        return f"- {role}: {name[:-1]}; {what}), {_sha(model)}"
    return f"- {role}: {name}{f' ({what})' if what else ''}, {_sha(model)}"


def _suite(settings: dict, n_turns: int | None) -> str:
    suite = Path(str(settings.get("suite", "?"))).name
    split = settings.get("split", "all")
    half = "" if split in (None, "all") else f", {split} half"
    per_group = settings.get("per_group")
    how = f"{per_group} prompts per group, " if per_group else ""
    if settings.get("category"):
        how = f"category {settings['category']}, {how}"
    turns = f", {n_turns} turns" if n_turns and n_turns != settings.get("n_prompts") else ""
    return f"{suite}{half}: {how}{settings.get('n_prompts', '?')} prompts{turns}"


def _sampling(settings: dict) -> str:
    t = settings.get("temperature", 0.0) or 0.0
    runs = settings.get("repeats", 1)
    return (f"{settings.get('max_tokens', '?')} tokens, {'greedy' if t == 0 else f'T={t:g}'}, "
            f"{'one run' if runs == 1 else f'{runs} runs'}")


def _cell_interval(row: dict) -> str:
    low, high = row.get("speedup_low", 0.0), row.get("speedup_high", 0.0)
    return f"{low:.2f}-{high:.2f}x" if low < high else ""


def _name(method: str, llama_cpp_draft: dict | None) -> str:
    """The row's name; a llama.cpp draft mode always names its draft (files from before rows did
    for the bench's own draft take its name from models.llama_cpp_draft)."""
    if not method.startswith("llama.cpp"):
        return f"specgen `{method}`"
    if method.startswith("llama.cpp draft") and "(" not in method and llama_cpp_draft:
        return f"{method} ({llama_cpp_draft.get('name', '?')})"
    return method


def _table(rows: dict[str, dict], methods: Sequence[str], n_trials: int,
           llama_cpp_draft: dict | None = None, sampled: bool = False,
           spreads: dict[str, Spread] | None = None) -> list[str]:
    """A row per method. Results with forced tokens (constrained, recorded since they were counted
    apart from τ and acceptance) add a `forced` column (accepted/drafted), and with a `jump` row an
    `over jump` column: each method's speed over jump-forward's, what drafting adds. `spreads`
    (runs with several repeats per prompt): each method's interval from its records, prompts
    resampled whole, with its median over prompts and its ratio in each repeat."""
    forced = any(r.get("forced_drafted") for r in rows.values())
    jump = JUMP in rows
    extra = [*(["forced"] if forced else []), *(["over jump"] if jump else [])]
    spread_cols = ["median over prompts", "each repeat"] if spreads else []
    out = ["| | tok/s | over specgen plain | 90% interval | " + "".join(f"{c} | " for c in spread_cols)
           + "τ | accepted | " + "".join(f"{c} | " for c in extra) + "identical to plain |",
           "|---|---|---|---|" + "---|" * len(spread_cols) + "---|---|" + "---|" * len(extra) + "---|"]
    for m in methods:
        r = rows.get(m)
        if r is None:
            continue
        ratio = "1.00x" if m == "plain" else f"{r['speedup']:.2f}x"
        if m == "auto":
            ratio = f"**{ratio}**"
        drafted = m not in ("plain", UNSCREENED, LLAMA_CPP_PLAIN, JUMP)
        # Sampled, llama.cpp's rows sample with its own sampler: their texts are not compared.
        other_sampler = sampled and m.startswith("llama.cpp")
        same = "" if m == "plain" or other_sampler or r.get("lossless_mismatches") is None else \
            f"{n_trials - r['lossless_mismatches']}/{n_trials}"
        tau = f"{r['mean_accepted']:.2f}" if drafted else ""
        accepted = f"{r['acceptance_rate']:.0%}" if drafted else ""
        interval = "" if m == "plain" else _cell_interval(r)
        spread = (spreads or {}).get(m) if m != "plain" else None
        if spread:
            interval = _cell_interval({"speedup_low": spread.low, "speedup_high": spread.high})
        by_repeat = [f"{spread.median:.2f}x", ", ".join(f"{x:.2f}x" for x in spread.per_repeat)] if spread else \
            ["", ""] if spreads else []
        cells = [f"{r['forced_accepted']}/{r['forced_drafted']}" if r.get("forced_drafted") else ""] if forced else []
        if jump:
            cells.append(f"{r['over_jump']:.2f}x" if r.get("over_jump") is not None and drafted else "")
        out.append(f"| {_name(m, llama_cpp_draft)} | {r['tokens_per_s']:.1f} | {ratio} | {interval} | "
                   + "".join(f"{c} | " for c in by_repeat) + f"{tau} | {accepted} | "
                   + "".join(f"{c} | " for c in cells) + f"{same} |")
    return out


def _groups(summary: list[dict], method: str) -> str:
    """`method`'s speedup per group (and turn), as one line."""
    parts, by_group = [], {}
    for r in summary:
        if r["method"] == method and r["group"] != OVERALL:
            by_group.setdefault(r["group"], {})[r.get("turn")] = r["speedup"]
    for group, turns in by_group.items():
        extra = ", ".join(f"turn {t} {v:.2f}x" for t, v in sorted((t, v) for t, v in turns.items() if t is not None))
        parts.append(f"{group} {turns.get(None, 0.0):.2f}x" + (f" ({extra})" if extra else ""))
    return ", ".join(parts)


def _versus(h: dict) -> str:
    line = (f"`{h['method']}` against the fastest llama.cpp row on each prompt: as fast or faster on {h['wins']} of "
            f"{h['n_prompts']}; slower by more than 5% on ")
    losses = h.get("losses") or []
    if not losses:
        return line + "none."
    return line + f"{len(losses)}: " + ", ".join(f"{x['prompt_id']} at {x['ratio']:.2f}x ({x['rival']})"
                                                  for x in losses) + "."


def _spreads(data: dict, methods: Sequence[str]) -> dict[str, Spread] | None:
    """Each method's spread over plain from the records, for a run with several repeats per prompt."""
    if repeats_of(data) < 2:
        return None
    found = {m: spread(data, m) for m in methods if m != "plain"}
    return {m: x for m, x in found.items() if x is not None} or None


def _lead_interval(lead: Spread | None) -> str:
    """The lead's 90% interval over prompts (each resampled with its repeats), from the records."""
    if lead is None or not lead.low < lead.high:
        return ""
    return f" (90% interval over prompts: {lead.low:.2f}-{lead.high:.2f}x)"


def _lead(rows: dict[str, dict], models: dict, lead: Spread | None = None) -> str | None:
    """auto's lead over llama.cpp's plain decoding as the product of its two parts: specgen's plain
    against llama.cpp's (where the target was screened, that part holds screening, and the file says
    whether a `plain, unscreened` row separates it) and auto against specgen's plain (speculation);
    `lead`: auto against llama.cpp plain from the records, for the lead's interval."""
    auto, theirs = rows.get("auto"), rows.get(LLAMA_CPP_PLAIN)
    if not auto or not theirs or not theirs.get("speedup"):
        return None
    plain_part, target = 1.0 / theirs["speedup"], models.get("target") or {}
    if models.get("target_screened"):
        why = (f"specgen's plain is screened: a Q8_0 copy of the target's {target.get('head_type') or '?'} output "
               "layer picks the candidates, recomputed exactly, where llama.cpp decodes that layer in full; "
               + (f"`{UNSCREENED}` runs at {rows[UNSCREENED]['speedup']:.2f}x specgen's plain: screening "
                  f"{1.0 / rows[UNSCREENED]['speedup']:.2f}x, the two plain decoders' other differences "
                  f"{plain_part * rows[UNSCREENED]['speedup']:.2f}x" if UNSCREENED in rows else
                  f"this run has no `{UNSCREENED}` row, so it does not tell screening apart from the two plain "
                  "decoders' other differences"))
    else:
        why = f"nothing screened; the target's output layer is {target.get('head_type') or '?'}"
    what = "jump-forward and drafting: see `over jump`" if JUMP in rows else "speculation"
    return (f"`auto` against llama.cpp plain, by its parts: {auto['speedup'] * plain_part:.2f}x"
            f"{_lead_interval(lead)} = specgen `plain` at "
            f"{plain_part:.2f}x llama.cpp plain ({why}) × `auto` at {auto['speedup']:.2f}x specgen `plain` ({what}).")


def render(data: dict, link: str) -> str:
    """The markdown of one results file: a caption (date, commit, machine, suite, settings), a row per
    method over the whole suite, auto's speedup per group, its head-to-head line, and the models with
    their sha256; `link`: the results file as the page links it. An agent bench's file (`--suite
    agent`) is rendered by agent_view."""
    if data["settings"].get("suite") == "agent" and "rows" in data:
        from specgen.bench.agent_view import render as render_agent

        return render_agent(data, link)
    settings, models, run = data["settings"], data["models"], data.get("run") or {}
    methods = settings.get("methods") or list(dict.fromkeys(r["method"] for r in data["summary"]))
    rows = {r["method"]: r for r in data["summary"] if r["group"] == OVERALL and r.get("turn") is None}
    repeats = settings.get("repeats", 1) or 1
    n_trials = (rows.get("plain") or {}).get("n_prompts", settings.get("n_prompts", 0)) * repeats
    plain_turns = [len(r.get("turns") or [0]) for r in data.get("records", []) if r.get("method") == "plain"]
    interrupted = " · **interrupted: only the prompts every method finished**" if settings.get("interrupted") else ""
    lines = [f"*{run_caption(run)} · {machine_caption(data.get('machine', {}))} · "
             f"{_suite(settings, sum(plain_turns) // repeats if plain_turns else None)}, {_sampling(settings)}"
             f"{interrupted} · results: [{Path(link).name}]({link})*", "",
             *_table(rows, methods, n_trials, models.get("llama_cpp_draft"),
                     bool(settings.get("temperature")), _spreads(data, methods)), ""]
    if repeats > 1:
        lines += [f"With {repeats} repeats of each prompt, the interval and the median are over the prompts, each "
                  f"resampled with all its repeats (not as {repeats} times as many prompts), from the records; "
                  "each repeat: the ratio over that repeat's prompts.", ""]
    if "auto" in rows:
        lines += [f"`auto` by group: {_groups(data['summary'], 'auto')}.", ""]
    lead = _lead(rows, models, spread(data, "auto", LLAMA_CPP_PLAIN))
    if lead:
        lines += [lead, ""]
    for h in data.get("head_to_head") or []:
        lines += [_versus(h), ""]
    lines += [line for line in (_model_line("target", models.get("target")),
                                _model_line("specgen's draft", models.get("draft")),
                                _model_line("llama.cpp's draft", models.get("llama_cpp_draft"))) if line]
    return "\n".join(lines) + "\n"


def render_files(paths: Sequence[Path], base: Path, runs: bool = False) -> str:
    """render() of each file, linked relative to the folder `base` of the page that shows them;
    several agent-bench runs of one suite and half end with their spread (agent_view.across).
    `runs`: the files are runs of one setting, shown together as medians and ranges (runs_view)."""
    datas = [load(p) for p in paths]
    links = [Path(os.path.relpath(Path(p).resolve(), Path(base).resolve())).as_posix() for p in paths]
    if runs:
        from specgen.bench.runs_view import across_runs

        return across_runs(datas, links)
    text = "\n".join(render(d, link) for d, link in zip(datas, links))
    agent = [d for d in datas if d["settings"].get("suite") == "agent" and "rows" in d]
    if len(agent) >= 2 and len(agent) == len(datas) and len({d["settings"].get("split") for d in agent}) == 1:
        from specgen.bench.agent_view import across

        text += "\n" + across(agent)
    return text


def unfenced(text: str) -> str:
    """`text` with each fenced code block blanked to spaces (same length, same lines): a page may show
    markers there as examples, which are not its own. Markers count only at the start of a line, so
    inline code quoting one is not read either."""
    return _FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def blocks(page: Path) -> list[tuple[list[Path], str, str]]:
    """Each bench-table block of a markdown page: (its files, resolved from the page's folder; the
    body as it stands; the body its files render)."""
    try:
        text = Path(page).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {page}: {e.strerror or e}") from None
    found = []
    for m in _BLOCK.finditer(unfenced(text)):
        words = m.group("files").split()
        files = [Path(page).parent / f for f in words if not f.startswith("--")]
        options = [w for w in words if w.startswith("--")]
        if not files:
            raise ConfigError(f"{page}: a bench-table marker names no results file")
        if set(options) - {RUNS}:
            raise ConfigError(f"{page}: a bench-table marker's option {', '.join(sorted(set(options) - {RUNS}))} "
                              f"is none it knows ({RUNS}: several runs of one setting, their medians and ranges)")
        found.append((files, text[m.start("body"):m.end("body")],
                      render_files(files, Path(page).parent, runs=RUNS in options)))
    if not found and re.search(f"^{START}", unfenced(text), re.M):
        raise ConfigError(f"{page}: a bench-table block without its end marker ({END})")
    return found


def updated(page: Path) -> str:
    """The page's text with every bench-table block rendered anew from its files."""
    text = Path(page).read_text(encoding="utf-8")
    out, at = [], 0
    for m, (_, _, body) in zip(_BLOCK.finditer(unfenced(text)), blocks(page)):
        out += [text[at:m.start()], f"<!-- bench-table: {m.group('files')} -->\n{body}{END}"]
        at = m.end()
    return "".join(out) + text[at:]


def stale(page: Path) -> list[str]:
    """The files of each block of `page` that does not show what its files render."""
    return [" ".join(str(f) for f in files) for files, body, fresh in blocks(page) if body != fresh]
