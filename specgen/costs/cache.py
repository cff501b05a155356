"""The calibration cache: one curve per (model file, llama.cpp build, threads, context size, CPU),
kept as JSON unless it was measured on a busy machine."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from specgen.costs.curve import CostCurve
from specgen.files import write_text


# bump when what a cached curve means changes (2: every row outputs logits; 3: one-output cost;
# 4: passes in random order, noise dips removed, how busy the machine was; 5: a dip may lose one pass;
# 6: rechecks checked against a reference size: curves cached before may hold false dips from them;
# 7: timed up to 80 tokens; 8: a slow model's largest size timed too, linear up to it)
CURVE_VERSION = 8


def cache_key(model_path: str, build: str, threads: int, n_ctx: int, cpu: str = "") -> str:
    st = os.stat(model_path)
    blob = json.dumps([CURVE_VERSION, os.path.abspath(model_path), st.st_size, int(st.st_mtime), build, threads,
                       n_ctx, cpu])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_cached(path: Path) -> CostCurve | None:
    """The cached curve, or None (none, unreadable, or taken on a busy machine)."""
    try:
        data = json.loads(path.read_text())
        curve = CostCurve(list(data["sizes"]), list(data["seconds"]), source="cached",
                          per_context=float(data.get("per_context", 0.0)),
                          per_context_at=int(data.get("per_context_at", 0)),
                          per_token_one_output=float(data.get("per_token_one_output", 0.0)),
                          spread=list(data.get("spread", [])), raw=list(data.get("raw", [])),
                          passes=int(data.get("passes", 0)), busy_cores=data.get("busy_cores"),
                          measured_at=float(data.get("measured_at", 0.0)), between=data.get("between", "linear"),
                          linear_from=int(data.get("linear_from", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None if curve.busy else curve


def save_cached(path: Path, curve: CostCurve) -> None:
    """Keep the curve as this machine's truth, unless it was measured on a busy machine."""
    if curve.busy:
        return
    write_text(path, json.dumps(curve.to_json()))
