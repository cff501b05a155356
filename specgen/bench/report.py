"""The --json report of a bench run: machine, models, settings, records, summary, calibration and
head-to-head results."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Sequence

from specgen.app.config import RunConfig
from specgen.app.manifest import describe
from specgen.app.session import Session
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


def report(machine: dict, models: dict, settings: dict, records: list[dict], rows: Sequence[SummaryRow],
           calibration: dict | None = None, versus: Sequence[HeadToHead] = ()) -> dict:
    """The `bench --json` object; its keys are a contract (scripts and CI read them)."""
    return {"machine": machine, "models": models, "settings": settings, "calibration": calibration or {},
            "records": records, "summary": [dataclasses.asdict(r) for r in rows],
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
                 calibration_at_start: dict, versus: Sequence[HeadToHead]) -> dict:
    """report() for a finished (or interrupted) `specgen bench` run on `session`."""
    model_info = {"target": describe(cfg.target, Path(session.target.source_path)),
                  "target_screened": session.target.path if session.target.screen else None,
                  "draft": describe(cfg.draft, Path(session.draft.path)) if session.draft else None}
    settings = {**dataclasses.asdict(cfg), "method": None, "methods": list(columns), "suite": suite_name,
                "n_prompts": n_prompts, "repeats": repeats, "interrupted": interrupted}
    base = {"target": cfg.target, "draft": session.draft_label, "temperature": cfg.temperature}
    calibration = {role: calibration_record(curve, calibration_at_start.get(role))
                   for role, curve in (("target", session.costs), ("draft", session.draft_costs))}
    records = [trial_record(t, base) for t in trials]
    return report(machine, model_info, settings, records, rows, calibration, versus)
