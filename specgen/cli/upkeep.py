"""The commands around generation: calibrate, doctor, rpc-server, cache clear."""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from specgen.app import doctor as d
from specgen.app.config import RunConfig, check_ctx, check_threads
from specgen.models.curves import CALIBRATE_BUDGET_S, calibration_summary, cost_curve
from specgen.app.session import TARGET_OUTPUTS, TARGET_SEQS, load_target
from specgen.cli.options import Ctx, GpuLayers, Target, Threads
from specgen.cli.render import warn
from specgen.drafting.tuning import LONG_PROMPT
from specgen.errors import ConfigError, SpecgenError
from specgen.host import specgen_home


def rpc_server(
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDR",
                             help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(50052, "--port", metavar="N", help="TCP port."),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N", help="CPU threads [all cores]."),
) -> None:
    """Serve this machine's CPU to other specgen/llama.cpp runs over llama.cpp's RPC protocol.

    The RPC protocol has no authentication: listen on a trusted network only.

    \b
    On this machine:   specgen rpc-server --host 0.0.0.0 --port 50052
    On the other one:  specgen generate --rpc HOST:50052 --gpu-layers 99 "..."
    """
    from specgen.llama import tools  # loads llama.cpp: not at start-up

    if not 0 < port < 65536:
        raise ConfigError(f"--port must be in 1..65535, found {port}")
    check_threads(threads)
    # The server loop runs inside llama.cpp and never returns to Python, so Python's Ctrl-C handler
    # would never run: let SIGINT/SIGTERM end the process directly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    print(f"specgen: serving this CPU over llama.cpp RPC at {host}:{port} (Ctrl-C stops; no authentication: "
          "trusted networks only)", file=sys.stderr, flush=True)
    tools.serve_rpc(f"{host}:{port}", threads)


def calibrate(
    name: Optional[str] = typer.Argument(None, metavar="MODEL", help="GGUF path or models.txt name "
                                         "(or -m MODEL, as in the other commands)."),
    target: Target = None,
    threads: Threads = None,
    ctx: Ctx = None,
    gpu_layers: GpuLayers = None,
    refresh: bool = typer.Option(False, "--refresh", help="Measure again instead of using the cache."),
    kernels: bool = typer.Option(False, "--kernels", help="Time each matrix product of a decode of 1, 2, 4, 8 "
                                 "and 16 tokens by weight type, with specgen's kernels and with llama.cpp's own "
                                 "(SPECGEN_KERNELS=0): the table to paste into a bug report."),
) -> None:
    """Measure (or show the cached) cost of one decode of B tokens, the curve `auto` plans with.

    \b
    Example:
      specgen calibrate -m gemma-3-270m-f32
      specgen calibrate -m smollm2-135m-instruct-q4_1 --kernels
    """
    model = calibrated_model(name, target)
    check_threads(threads)
    if kernels:
        if refresh or gpu_layers:
            raise ConfigError(f"--kernels times the CPU's kernels afresh: it takes -m and --threads, found "
                              f"{'--refresh' if refresh else '--gpu-layers'}")
        return kernel_table(model, threads)
    defaults = RunConfig()
    ctx = defaults.ctx if ctx is None else ctx
    gpu_layers = defaults.gpu_layers if gpu_layers is None else gpu_layers
    check_ctx(ctx)
    # What greedy generation loads (a screened copy where one helps, screen.py): the curve it plans with.
    llm = load_target(RunConfig(target=model, gpu_layers=gpu_layers).loading)
    context = llm.new_context(min(ctx, llm.n_ctx_train or ctx), n_seq_max=TARGET_SEQS, n_threads=threads,
                              n_outputs=TARGET_OUTPUTS)
    curve = cost_curve(llm, context, refresh=refresh, budget_s=CALIBRATE_BUDGET_S)
    summary, warning = calibration_summary(curve, context.n_threads)
    print(summary)
    if warning:
        warn(warning)
    table = Table(title=f"{Path(llm.path).name}: one decode of B tokens ({curve.source})", box=None)
    for col in ("B", "ms", "x B=1", "ms per token", "spread"):
        table.add_column(col, justify="right")
    spread = curve.spread or [None] * len(curve.sizes)
    raw = curve.raw or curve.seconds
    for b, sec, rel, sp, low in zip(curve.sizes, curve.seconds, curve.relative(), spread, raw):
        # A raised size: it measured cheaper than a smaller one, but not consistently (noise).
        note = f" (measured {low * 1000:.1f})" if low < sec * 0.995 else ""
        table.add_row(str(b), f"{sec * 1000:.1f}{note}", f"{rel:.2f}", f"{sec * 1000 / b:.2f}",
                      "" if sp is None else f"±{sp * 100:.0f}%")
    Console(soft_wrap=True).print(table)
    if curve.linear_from:
        print(f"between B={curve.linear_from} and B={curve.sizes[-1]}: not timed (calibration's first pass ran out "
              f"of time), priced on the straight line between them")
    if curve.per_token_one_output:
        print(f"one output row (catching up on text): {curve.seconds[0] * 1000:.1f} ms + "
              f"{curve.per_token_one_output * 1000:.2f} ms per further token (e.g. B=16: "
              f"{curve.at(16, 0, outputs=1) * 1000:.1f} ms)")
    if curve.per_context_at:
        print(f"context: +{curve.per_context * 1e9:.0f} ns per batch token per context token "
              f"(measured after {curve.per_context_at} tokens; e.g. B=8 after 2048: "
              f"+{curve.per_context * 8 * 2048 * 1000:.1f} ms)")
    else:
        print(f"context: not measured yet (auto measures it after its first prompt over {LONG_PROMPT} tokens)")


def kernel_table(model: str, threads: int | None) -> None:
    """calibrate --kernels: per weight type, ms of its products in one decode at each B, specgen's
    kernels against llama.cpp's; then the whole decode's ms and its c(B)/c(1)."""
    from specgen.host import cpu_name
    from specgen.llama import backend, tools
    from specgen.llama.profile import KERNEL_SIZES, kernel_times
    from specgen.models.resolve import resolve

    path = resolve(model)
    n_threads = threads or backend.default_threads()
    print(f"timing the products of one decode of B tokens in {path.name}: {cpu_name()}, {n_threads} thread{'s' if n_threads != 1 else ''}, "
          f"{_kernels_line(tools.build_info().system_info)} (a minute or two)", file=sys.stderr, flush=True)
    got = kernel_times(str(path), KERNEL_SIZES, threads=n_threads)
    table = Table(title=f"{path.name}: ms per decode of B tokens, specgen / llama.cpp (SPECGEN_KERNELS=0)", box=None)
    table.add_column("products", justify="left")
    for b in got["sizes"]:
        table.add_column(f"B={b}", justify="right")
    table.add_column(f"c({got['sizes'][-1]})/c(1)", justify="right")

    def cells(ours: list[float], theirs: list[float]) -> list[str]:
        ratio = lambda xs: f"{xs[-1] / xs[0]:.2f}" if xs[0] > 0 else "-"
        return [f"{a:.2f} / {b:.2f}" for a, b in zip(ours, theirs)] + [f"{ratio(ours)} / {ratio(theirs)}"]

    for name, by in sorted(got["products"].items(), key=lambda kv: -kv[1]["specgen"][-1]):
        table.add_row(name, *cells(by["specgen"], by["llama.cpp"]))
    table.add_row("whole decode", *cells(got["decode_ms"]["specgen"], got["decode_ms"]["llama.cpp"]))
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160).print(table)  # one line a row in a report


def _kernels_line(system_info: str) -> str:
    """The build's own word on its kernels (its SPECGEN_KERNELS feature: the ISA and the types)."""
    found = [part.strip() for part in system_info.split("|") if "SPECGEN_KERNELS" in part]
    return found[0] if found else "SPECGEN_KERNELS = none (not specgen's build)"


def calibrated_model(name: str | None, target: str | None) -> str:
    """The one model calibrate was given, positionally or as -m."""
    if name is None and target is None:
        raise ConfigError("calibrate needs a model: -m MODEL (or MODEL alone), found none")
    if name is not None and target is not None and name != target:
        raise ConfigError(f"calibrate takes one model, found two: {name} and -m {target}")
    return target or name  # type: ignore[return-value]


def doctor(
    model: Optional[str] = typer.Option(None, "-m", "--model", metavar="MODEL", help="Model for the speed check "
                                        "[the default target if present, else the smallest model present]."),
    speed: bool = typer.Option(True, "--speed/--no-speed", help="Run the speed check (a few seconds)."),
    threads: Threads = None,
) -> None:
    """Check the installation: llama.cpp build and flags, CPU, cache, models, and a short speed check.

    Exits 1 when it finds a problem (e.g. a build known to crash on this CPU).
    """
    check_threads(threads)
    found = d.report(model, speed, threads)
    for line in found.lines:
        print(line)
    for w in found.warnings:
        print(f"warning: {w}")
    if found.warnings:
        raise typer.Exit(1)
    print("ok: no problems found")


def cache_clear(
    calibration: bool = typer.Option(False, "--calibration", help="Also the measured decode costs (measured "
                                     "again on next use)."),
    screened: bool = typer.Option(False, "--screened", help="Also the screened copies of F32/F16 targets "
                                  "(made again on the next greedy run)."),
) -> None:
    """Delete the store of past generations that auto drafts from (one file per tokenizer).

    \b
    Example:
      specgen cache clear
    """
    folders = ["history", *(["calibration"] if calibration else []), *(["screened"] if screened else [])]
    for name in folders:
        folder = specgen_home() / name
        # Whatever stands there goes, a file where the folder should be included (it breaks writes).
        entries = list(folder.iterdir()) if folder.is_dir() else [folder] if folder.exists() else []
        size = sum(p.stat().st_size for p in entries if p.is_file())
        try:
            if folder.is_dir():
                shutil.rmtree(folder)
            else:
                folder.unlink(missing_ok=True)
        except OSError as e:
            raise SpecgenError(f"could not remove {e.filename or folder}: {e.strerror or e}") from None
        print(f"{name}: removed {len(entries)} files ({size / 1e6:.1f} MB) from {folder}")
