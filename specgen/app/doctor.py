"""`specgen doctor`: what llama.cpp build is installed, whether it suits this CPU, what is cached, how fast.

The checks are pure functions over strings (system_info, /proc/cpuinfo flags) so they are testable
anywhere; only `speed_check` touches a model (through the session, like `generate`).
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from specgen import __version__
from specgen.models import integrity
from specgen.app.config import RunConfig, read_yaml
from specgen.models.manifest import human_size, load_manifest
from specgen.app.prompts import Prompt
from specgen.app.runner import Runner
from specgen.app.session import load_session
from specgen.host import DEFAULT_CONFIG, cpu_flags, cpu_name, specgen_home

# llama.cpp's system_info feature name -> the /proc/cpuinfo flag the CPU needs for it.
SYSTEM_INFO_FLAGS = {
    "AVX": "avx", "AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "BMI2": "bmi2", "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}
AMX_CRASH = ("the build enables AMX: ggml's AMX kernels segfault on first decode on some Xeons "
             "(llama.cpp #20824); reinstall specgen's build, which turns AMX off: python -m specgen.llama.build")


def enabled_features(system_info: str) -> list[str]:
    """'CPU : AVX = 1 | AVX2 = 1 | AMX_INT8 = 0 |' -> ['AVX', 'AVX2']."""
    return [name for name, on in re.findall(r"([A-Z0-9_]+) = (\d+)", system_info) if on != "0"]


def kernels(system_info: str) -> str:
    """Batch invariance and specgen's few-column kernels in this build (specgen/llama/native), in
    words for `doctor`."""
    invariant = re.search(r"SPECGEN_INVARIANT = (\w+)", system_info)
    if invariant is None:
        return ("not in this build (llama.cpp's own kernels: a batch may round differently from one-token "
                "decodes; python -m specgen.llama.build adds them)")
    if invariant.group(1) == "off":
        return "built in, turned off by SPECGEN_KERNELS=0 (llama.cpp's own kernels)"
    found = re.search(r"SPECGEN_KERNELS = ([^|]*)", system_info)
    have = found.group(1).strip() if found else "off"
    which = (f"specgen's kernels for {have}" if have != "off" else
             "no specgen kernel on this build or setting")
    attention = re.search(r"SPECGEN_ATTENTION = (\w+)", system_info)
    attends = ("specgen's attention (F32, several rows per pass)" if attention and attention.group(1) == "rows"
               else "attention through ggml's per-row loop")
    return (f"batch-invariant decoding for up to 128 rows; {which}; other weight types through ggml's "
            f"one-row code; {attends}")


def build_warnings(system_info: str, host_flags: set[str]) -> list[str]:
    """Problems with the installed build on this host: AMX (known crash), ISAs the CPU lacks."""
    warnings = []
    features = enabled_features(system_info)
    if any(f.startswith("AMX") for f in features):
        warnings.append(AMX_CRASH)
    if host_flags:  # unknown host (no /proc/cpuinfo): nothing to compare against
        missing = [f for f in features if f in SYSTEM_INFO_FLAGS and SYSTEM_INFO_FLAGS[f] not in host_flags]
        if missing:
            warnings.append(f"the build uses {', '.join(missing)}, which this CPU lacks (illegal instruction "
                            "likely); reinstall a build for this CPU: python -m specgen.llama.build")
    return warnings


@dataclass(frozen=True)
class SpeedCheck:
    model_file: str
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


SPEED_CHECK_TOKENS = 48


def speed_check(model: str, n_threads: int | None = None) -> SpeedCheck:
    """Plain decoding of a short continuation through the same loop as `generate`: tokens per second."""
    cfg = RunConfig(target=model, draft=None, method="plain", max_tokens=SPEED_CHECK_TOKENS, chat=False,
                    threads=n_threads, ctx=512)
    session = load_session(cfg.loading)
    runner = Runner(cfg, session)
    done = runner.run(runner.ask(Prompt(0, "The quick brown fox")))
    return SpeedCheck(Path(session.target.path).name, done.stats.n_tokens, done.stats.decode_s)


@dataclass(frozen=True)
class CachedModels:
    present: list[tuple[str, Path]]  # (name, file) of every model present
    damaged: dict[str, str]  # name -> the one-line problem, for those that do not match models.txt

    @property
    def usable(self) -> list[tuple[str, Path]]:
        return [(name, path) for name, path in self.present if name not in self.damaged]


def cached_models() -> CachedModels:
    """The models present, each checked cheaply (by its record; hashed only when that is missing or stale)."""
    present, damaged = [], {}
    for entry in load_manifest().values():
        if not entry.present:
            continue
        present.append((entry.name, entry.path))
        found = integrity.check(entry)
        if found.status == integrity.MISMATCH:
            damaged[entry.name] = integrity.mismatch_message(entry, found)
    return CachedModels(present, damaged)


def model_line(name: str, path: Path, cached: CachedModels) -> str:
    return f"  model {name}: {human_size(path.stat().st_size)}" + (" (damaged)" if name in cached.damaged else "")


def human_dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


@dataclass
class Report:
    lines: list[str]  # what the check found, in order
    warnings: list[str]  # problems: `specgen doctor` exits 1 when there are any


def report(model: str | None, speed: bool, threads: int | None) -> Report:
    """Every check `specgen doctor` prints: the build and its flags, the host, the cache, and (with
    `speed`) plain decoding's speed on `model` (default: the default target if present, else the
    smallest model present)."""
    from specgen.llama import backend, build, tools  # loads llama.cpp: only this command needs it

    info = tools.build_info()
    plan = build.plan_build()
    features = enabled_features(info.system_info)
    lines = [f"specgen {__version__} · Python {platform.python_version()} · llama-cpp-python {info.llama_cpp_python}",
             f"llama.cpp build: {', '.join(features) or 'no CPU extensions'}; computes on {info.accelerator}; "
             f"RPC backend {'yes' if info.rpc else 'no'}",
             f"  built by specgen for this host: {'yes' if build.installed_for(plan) else 'no'} ({plan.reason})",
             f"  specgen's kernels: {kernels(info.system_info)}",
             f"host: {cpu_name()} · {os.cpu_count()} cores · {threads or backend.default_threads()} threads used "
             f"· {platform.system()} {platform.machine()}"]
    home = specgen_home()
    cached = cached_models()
    present = cached.usable  # a damaged model is a problem, not the speed check's subject
    lines.append(f"cache: {home} · {human_size(human_dir_size(home))}")
    lines += [model_line(name, path, cached) for name, path in cached.present]
    if not cached.present:
        lines.append("  no models present: specgen models pull NAME (see specgen models list)")
    warnings = build_warnings(info.system_info, cpu_flags()) + list(cached.damaged.values())
    if speed:
        if model is None and present:
            default = read_yaml(DEFAULT_CONFIG).get("target") if DEFAULT_CONFIG.exists() else None
            smallest = min(present, key=lambda item: item[1].stat().st_size)[0]
            model = default if default in dict(present) else smallest
        if model is None:
            lines.append("speed check: skipped (no model present)")
        else:
            check = speed_check(model, n_threads=threads)
            lines.append(f"speed check: {check.model_file}: {check.tokens_per_s:.1f} tok/s plain decoding "
                         f"({check.tokens} tokens in {check.seconds:.1f} s)")
    return Report(lines, warnings)
