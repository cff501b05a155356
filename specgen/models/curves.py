"""A loaded model's cost curve on this machine: from the calibration cache, else measured and
cached; and how a curve was measured, in words."""

from __future__ import annotations

import os
from datetime import datetime

from specgen.core.protocol import Context, Model
from specgen.costs.cache import cache_key, load_cached, save_cached
from specgen.costs.curve import BUSY_CORES, MEASURE_BUDGET_S, CostCurve
from specgen.costs.measure import measure
from specgen.host import cpu_name, specgen_home
from specgen.reporter import reporter


def build_key(info) -> str:
    """The build, for the calibration cache: its words (system info) and its files (a rebuilt library
    whose words read the same, faster kernels under the same names, is measured afresh)."""
    return f"{info.system_info}|{info.library}"


def cost_curve(model: Model, ctx: Context, refresh: bool = False, budget_s: float = MEASURE_BUDGET_S) -> CostCurve:
    """c(B) for a model on this machine: from the calibration cache, else measured (a few seconds)
    and cached, unless other processes kept the machine busy meanwhile (then it serves this run
    only, and says so on stderr)."""
    from specgen.llama import tools  # loads llama.cpp: not at start-up, for commands without a model

    key = cache_key(model.path, build_key(tools.build_info()), ctx.n_threads, ctx.n_ctx, cpu_name())
    path = specgen_home() / "calibration" / f"{key}.json"
    curve = None if refresh else load_cached(path)
    if curve is None:
        ctx.clear()
        token = model.tokenize("The", add_special=False)[0]
        curve = measure(ctx, 0, token, budget_s=budget_s)
        ctx.clear()
        if curve.busy:
            reporter().warn(f"other processes used {curve.busy_cores:.1f} of {os.cpu_count()} cores while "
                            f"timing {model.name}'s decodes; the costs are used for this run only, not cached")
        save_cached(path, curve)
    curve.cache_path = path
    return curve


CALIBRATE_BUDGET_S = 8.0  # `specgen calibrate` times more passes than a first run of auto does


def calibration_summary(curve, threads: int) -> tuple[str, str | None]:
    """One line on how the curve was measured, how noisy and how busy the machine was then; and a
    warning when it was busy or noisy (None when not)."""
    when = datetime.fromtimestamp(curve.measured_at).strftime("%Y-%m-%d %H:%M") if curve.measured_at else "unknown"
    line = f"measured {when} with {threads} threads, {curve.passes} passes; median spread ±{curve.noise * 100:.0f}%"
    if curve.busy_cores is not None:
        line += f"; other processes used {curve.busy_cores:.2f} of {os.cpu_count()} cores"
    warning = None
    if curve.busy:
        warning = (f"the machine was busy (other processes above {BUSY_CORES} cores): this curve "
                   "is not cached; run `specgen calibrate --refresh` again when it is quiet")
    elif curve.noise > NOISY_SPREAD:
        warning = (f"timings spread by ±{curve.noise * 100:.0f}% between passes (more than "
                   f"±{NOISY_SPREAD * 100:.0f}%): is something else running?")
    return line, warning


NOISY_SPREAD = 0.10
