"""The calibration cache: one curve per (model file, llama.cpp build, threads, context size, CPU),
kept as JSON unless it was measured on a busy machine."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from specgen.costs.curve import CostCurve
from specgen.files import set_aside, write_text
from specgen.reporter import write_failed


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
    """The cached curve, or None (none, or taken on a busy machine). A file that fails its checks
    is set aside with a warning, and None sends the caller to measure again: a damaged cache may
    cost a calibration, never a crash nor a different text."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        set_aside(path, f"unreadable ({e.strerror or e})")
        return None
    try:
        curve = _curve(json.loads(text))
    except (ValueError, KeyError, TypeError) as e:
        set_aside(path, f"not a valid calibration ({e})")
        return None
    return None if curve.busy else curve


def _curve(data: dict) -> CostCurve:
    """A CostCurve from its JSON, every field checked (ValueError, KeyError or TypeError names the
    first that is wrong)."""
    sizes, seconds = list(data["sizes"]), [float(s) for s in data["seconds"]]
    if not sizes or len(sizes) != len(seconds):
        raise ValueError(f"expected as many seconds as sizes, at least one, found {len(sizes)} and {len(seconds)}")
    if any(type(b) is not int for b in sizes) or sizes[0] < 1 or any(a >= b for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"expected increasing whole sizes from 1 up, found {sizes[:8]}")
    if not all(math.isfinite(s) and s > 0 for s in seconds):
        raise ValueError("expected finite positive seconds")
    spread, raw = [float(x) for x in data.get("spread", [])], [float(x) for x in data.get("raw", [])]
    per_context, one_output = float(data.get("per_context", 0.0)), float(data.get("per_token_one_output", 0.0))
    if not all(math.isfinite(x) and x >= 0 for x in (per_context, one_output, *spread, *raw)):
        raise ValueError("expected finite non-negative per_context, per_token_one_output, spread and raw")
    between = data.get("between", "linear")
    if between not in ("linear", "step"):
        raise ValueError(f"expected between 'linear' or 'step', found {between!r}")
    busy = data.get("busy_cores")
    return CostCurve(sizes, seconds, source="cached", per_context=per_context,
                     per_context_at=int(data.get("per_context_at", 0)), per_token_one_output=one_output,
                     spread=spread, raw=raw, passes=int(data.get("passes", 0)),
                     busy_cores=None if busy is None else float(busy),
                     measured_at=float(data.get("measured_at", 0.0)), between=between,
                     linear_from=int(data.get("linear_from", 0)))


def save_cached(path: Path, curve: CostCurve) -> None:
    """Keep the curve as this machine's truth, unless it was measured on a busy machine."""
    if curve.busy:
        return
    try:
        write_text(path, json.dumps(curve.to_json()))
    except OSError as e:
        write_failed(path, e, "the curve serves this run only")
