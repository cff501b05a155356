"""The --json report of a bench run: machine, models, settings, records, summary, calibration and
head-to-head results."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from specgen.app.config import RunConfig, bias_text
from specgen.models.manifest import describe
from specgen.app.session import Session
from specgen.bench.drafts import gguf_facts
from specgen.bench.run import Trial
from specgen.bench.summary import HeadToHead, SummaryRow
from specgen.host import cpu_name


def machine_info(threads: int, build) -> dict:
    """`build`: tools.BuildInfo of the llama.cpp in use."""
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": threads, "load_average": _load(),
            "backend": build.accelerator,
            "llama_cpp": {"llama_cpp_python": build.llama_cpp_python, "system_info": build.system_info}}


def _load() -> list[float] | None:
    """1, 5 and 15-minute load averages: a busy machine shows here (None where unknown)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_info() -> dict:
    """When and from what code a run was made: the date (UTC), specgen's version, and where specgen
    runs from a git checkout, its commit and the tracked files under specgen/ that differ from it
    (None where there is no git or no checkout)."""
    from specgen import __version__

    root = Path(__file__).resolve().parents[2]
    commit = (_git(root, "rev-parse", "HEAD") or "").strip() or None
    changed = _git(root, "status", "--porcelain", "--untracked-files=no", "--", "specgen") if commit else None
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "specgen": __version__,
            "command": ["specgen", *sys.argv[1:]], "commit": commit, "modified": None if changed is None else [line[3:] for line in changed.splitlines() if line]}


def _git(root: Path, *args: str) -> str | None:
    """`git -C root ARGS`'s output; None where git is missing or `root` is no checkout."""
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def report(machine: dict, models: dict, settings: dict, records: list[dict], rows: Sequence[SummaryRow],
           calibration: dict | None = None, versus: Sequence[HeadToHead] = (), run: dict | None = None) -> dict:
    """The `bench --json` object; its keys are a contract (scripts and CI read them)."""
    return {"run": run or run_info(), "machine": machine, "models": models, "settings": settings,
            "calibration": calibration or {}, "records": records, "summary": [dataclasses.asdict(r) for r in rows],
            "head_to_head": [dataclasses.asdict(h) for h in versus]}


def calibration_record(curve, start: dict | None = None) -> dict | None:
    """The cost curve auto planned with (`curve`: a CostCurve, or None): as it was when the
    bench started (`start`: its to_json() then) and what live decodes made of it by the end."""
    if curve is None:
        return None
    return {"source": curve.source, "cache": str(curve.cache_path) if curve.cache_path else None,
            "at_start": start or curve.to_json(), "at_end": curve.to_json(), "scale_at_end": round(curve.scale, 4),
            "batch_scale_at_end": round(curve.batch_scale, 4),
            "rechecked_sizes": dict(curve.rechecked), "threads_at_end": curve.threads}


def trial_record(trial: Trial, base: dict) -> dict:
    """A `generate --json` record plus the bench's own fields."""
    return {**base, "method": trial.method, "text": trial.text, **trial.stats.record_fields(),
            "finish_reason": trial.finish_reason, "group": trial.prompt.group,
            "prompt_id": trial.prompt.prompt_id, "repeat": trial.repeat, "choices": dict(trial.stats.choices),
            **({"turns": [{**st.record_fields(), "choices": dict(st.choices)} for st in trial.turn_stats]}
               if len(trial.turn_stats) > 1 else {})}


def header(machine: dict, cfg: RunConfig, session: Session, suite_name: str) -> str:
    """The table's title: machine, threads, backend, models, sampling, length, suite."""
    return (f"{machine['cpu']} · {machine['threads']} threads · {machine['backend']} · target {cfg.target}"
            f"{f' · draft {session.draft_label}' if session.draft_label else ''} · T={cfg.temperature:g}"
            f" · {cfg.max_tokens} tokens · suite {Path(suite_name).name}")


def bench_report(cfg: RunConfig, session: Session, machine: dict, columns: Sequence[str], suite_name: str,
                 n_prompts: int, repeats: int, interrupted: bool, trials: Sequence[Trial], rows: Sequence[SummaryRow],
                 calibration_at_start: dict, versus: Sequence[HeadToHead], llama_cpp_draft: dict | None = None,
                 run: dict | None = None) -> dict:
    """report() for a finished (or interrupted) `specgen bench` run on `session`; `llama_cpp_draft`:
    what llama.cpp's draft modes loaded (drafts.LlamaCppDraft.record), `run`: run_info() at the start."""
    target = Path(session.target.source_path)
    model_info = {"target": {**describe(cfg.target, target), **gguf_facts(target)},
                  "target_screened": session.target.path if session.target.screen else None,
                  "draft": ({**describe(cfg.draft, Path(session.draft.path)), **gguf_facts(Path(session.draft.path))}
                            if session.draft else None),
                  "llama_cpp_draft": llama_cpp_draft}
    settings = {**dataclasses.asdict(cfg), "logit_bias": bias_text(cfg.logit_bias),  # as a -c file writes it
                "method": None, "methods": list(columns), "suite": suite_name,
                "n_prompts": n_prompts, "repeats": repeats, "interrupted": interrupted}
    base = {"target": cfg.target, "draft": session.draft_label, "temperature": cfg.temperature}
    calibration = {role: calibration_record(curve, calibration_at_start.get(role))
                   for role, curve in (("target", session.costs), ("draft", session.draft_costs))}
    records = [trial_record(t, base) for t in trials]
    return report(machine, model_info, settings, records, rows, calibration, versus, run)
