"""This machine and this installation: CPU name and flags, specgen's cache home, the shipped data files.

Stdlib only: `python -m specgen.llama.build` imports it before any dependency is installed.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

# models.txt and configs/ ship inside the package (the repository's top-level copies are links to
# them), so an installed wheel finds them as an editable checkout does.
PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST = PACKAGE_DIR / "models.txt"
DEFAULT_CONFIG = PACKAGE_DIR / "configs" / "default.yaml"
TEMPLATES = PACKAGE_DIR / "templates"  # chat templates that models.txt `template:` entries write into a GGUF


def specgen_home() -> Path:
    """Where models, calibrations and built wheels are cached ($SPECGEN_HOME, else ~/.cache/specgen)."""
    return Path(os.environ.get("SPECGEN_HOME") or Path.home() / ".cache" / "specgen")


def _cpuinfo_field(name: str) -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name):
            return line.split(":", 1)[1].strip()
    return None


def default_threads() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    return set((_cpuinfo_field("flags") or "").split())


def cpu_name() -> str:
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def has_nvidia_gpu() -> bool:
    """nvcc alone is not enough: a CUDA build on a host without a driver cannot even load."""
    if Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists():
        return True
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            return subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False
    return False


# --- how busy the rest of the machine is ---------------------------------------------------------

BUSY_STAT_FIELDS = (0, 1, 2, 5, 6, 7)  # /proc/stat: user nice system [idle iowait] irq softirq steal
MIN_CPU_WINDOW_S = 0.2  # /proc/stat counts in 10 ms ticks


def cpu_sample() -> tuple[float, float, float] | None:
    """(wall seconds, CPU seconds all processes have used, CPU seconds this process and its finished
    children have used); None where /proc/stat cannot be read. Steal counts as used: another VM
    took that core. Children count as ours: bench's llama.cpp runs are not another process's load."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        ticks = sum(int(fields[i]) for i in BUSY_STAT_FIELDS if i < len(fields))
    except (OSError, ValueError, IndexError):
        return None
    own = os.times()
    return (time.monotonic(), ticks / os.sysconf("SC_CLK_TCK"),
            own.user + own.system + own.children_user + own.children_system)


def others_cores(before: tuple[float, float, float] | None, after: tuple[float, float, float] | None) -> float | None:
    """Cores' worth of CPU that other processes used between two cpu_sample()s (None: unknown, or
    too short a time apart for /proc/stat's clock ticks to say)."""
    if before is None or after is None or after[0] - before[0] < MIN_CPU_WINDOW_S:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, others / (after[0] - before[0]))
