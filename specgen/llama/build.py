"""Build and install llama-cpp-python for this host (stdlib only: runs before anything is installed).

`python -m specgen.llama.build` chooses CMake flags from the host, adds specgen's batch invariance
and few-column kernels (native/) to the pinned sdist, builds it once per (version, python, flags,
kernel), caches the wheel under ``$SPECGEN_HOME/wheels`` (``~/.cache/specgen``) and installs it
into the running interpreter's environment. pip caches wheels by name and
version only, never by CMAKE_ARGS, so pip's own cache is bypassed and ours is keyed by flags.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from specgen.host import cpu_flags, has_nvidia_gpu, specgen_home
from specgen.llama import build_cuda, patching


def pinned_llama_version() -> str:
    """The llama-cpp-python version specgen pins: pyproject.toml's dependency, the one place it is
    written (read from the installed package's metadata where there is no source tree)."""
    pin = re.compile(r"llama-cpp-python\s*==\s*([0-9][0-9A-Za-z.]*)")
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        found = pin.search(pyproject.read_text(encoding="utf-8"))
    else:
        from importlib.metadata import PackageNotFoundError, requires

        try:
            found = next(filter(None, map(pin.search, requires("specgen") or [])), None)
        except PackageNotFoundError:
            found = None
    if found is None:
        sys.exit("specgen: cannot find the llama-cpp-python pin (pyproject.toml or specgen's metadata)")
    return found.group(1)


LLAMA_CPP_PYTHON_VERSION = pinned_llama_version()

# /proc/cpuinfo flag -> ggml CMake option. Each option is set explicitly ON or OFF so a build never
# enables an ISA the CPU lacks. (AVX-VNNI is left at ggml's default, off: AVX512-VNNI covers it.)
X86_FEATURES = [
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("bmi2", "GGML_BMI2"),
    ("avx512f", "GGML_AVX512"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
]
# AMX stays off even where the CPU has it: ggml's AMX kernels segfault on first decode on some
# Xeons (upstream llama.cpp #20824), which is also why GGML_NATIVE (which would pick AMX) is off.
# llama.cpp's RPC backend (`specgen generate --rpc`, `specgen rpc-server`): a small extra library.
RPC_ON = "-DGGML_RPC=ON"
AMX_OFF = ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


# specgen's batch invariance and kernels, compiled into llama.cpp's CPU backend: native/ (C++ headers,
# see invariant.h for why and few_columns.h for the kernels) is copied into ggml-cpu as specgen/, and
# patches/ (one unified diff per llama.cpp file, applied by patching.py) hooks it in.
NATIVE = Path(__file__).resolve().parent / "native"
LLAMA_CPP = "vendor/llama.cpp"
CPU_DIR = f"{LLAMA_CPP}/ggml/src/ggml-cpu"
NATIVE_IN_SDIST = f"{CPU_DIR}/specgen"


def native_headers() -> list[Path]:
    return sorted(NATIVE.glob("*.h"))


def kernel_digest() -> str:
    """What the patch adds, for the wheel cache's key: the headers and the patches."""
    files = [*native_headers(), *sorted(patching.PATCHES.glob("*.patch"))]
    blob = b"".join(path.name.encode() + b"\0" + path.read_bytes() for path in files)
    return hashlib.sha256(blob).hexdigest()[:12]


@dataclass(frozen=True)
class BuildPlan:
    cmake_args: list[str]
    reason: str
    # A CUDA build for named architectures (build_cuda.py): where this host keeps its toolkit is
    # found when building (build_cuda.local_args), passed to CMake and not in the key.
    cuda_toolkit: bool = False
    # The kernels' digest when the plan was made: a header edited while a build runs must not give
    # the installed-build marker, written at the end, the key of headers that were not built.
    digest: str = field(default_factory=lambda: kernel_digest())

    @property
    def key(self) -> str:
        blob = "\n".join([LLAMA_CPP_PYTHON_VERSION, sys.implementation.cache_tag, platform.machine(),
                          *self.cmake_args, self.digest])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def plan_cuda(arch: str) -> BuildPlan:
    """A CUDA build that needs no driver: the architectures are named, not probed."""
    arch = build_cuda.check_arch(arch)
    return BuildPlan([*build_cuda.cuda_args(arch), *AMX_OFF, RPC_ON],
                     f"CUDA build for architectures {arch} (no driver needed to build)", cuda_toolkit=True)


def plan_build(env: dict[str, str] | None = None) -> BuildPlan:
    """Choose CMake flags for this host; SPECGEN_CMAKE_ARGS overrides everything."""
    env = os.environ if env is None else env
    override = env.get("SPECGEN_CMAKE_ARGS")
    if override is not None:
        return BuildPlan(override.split(), "SPECGEN_CMAKE_ARGS is set")
    if env.get("SPECGEN_CUDA_ARCH"):  # a CUDA build for named GPUs, driver or not (build_cuda.py)
        return plan_cuda(env["SPECGEN_CUDA_ARCH"])
    system, machine = platform.system(), platform.machine().lower()
    if system == "Darwin":
        return BuildPlan(["-DGGML_METAL=ON", RPC_ON], "macOS: Metal (llama.cpp's default there)")
    # Said in the plan's reason (printed by whoever builds), not printed here: `specgen doctor`
    # also asks for the plan and builds nothing.
    no_gpu = ""
    if shutil.which("nvcc"):
        if has_nvidia_gpu():
            return BuildPlan(["-DGGML_CUDA=ON", RPC_ON], "nvcc and an NVIDIA driver found: CUDA build")
        no_gpu = "nvcc found but no NVIDIA driver/GPU, so "
    if machine in ("x86_64", "amd64"):
        flags = cpu_flags()
        args = ["-DGGML_NATIVE=OFF"]
        args += [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in X86_FEATURES]
        args += AMX_OFF + [RPC_ON]
        have = [flag for flag, _ in X86_FEATURES if flag in flags]
        return BuildPlan(args, f"{no_gpu}x86-64 CPU build with {', '.join(have) or 'no SIMD extensions'}; AMX off")
    return BuildPlan([RPC_ON], f"{no_gpu}{system} {machine}: llama.cpp defaults")


def _installed_marker() -> Path:
    return Path(sys.prefix) / "specgen-llama-build.txt"


def installed_for(plan: BuildPlan) -> bool:
    """Whether this environment's llama-cpp-python is specgen's build for `plan`."""
    marker = _installed_marker()
    return marker.exists() and marker.read_text().strip() == plan.key


def _run_with_progress(cmd: list[str], env: dict[str, str], log_path: Path) -> int:
    """Run a pip build, keep the full log, and show ninja/make's [i/n] counter as progress."""
    step = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]|\[\s*(\d+)%\]")
    tty = sys.stderr.isatty()
    started, last_print = time.time(), 0.0
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            m = step.search(line)
            if not m:
                continue
            pct = int(m.group(3)) if m.group(3) else 100 * int(m.group(1)) // max(1, int(m.group(2)))
            now = time.time()
            if tty:
                print(f"\r  compiling llama.cpp: {pct:3d}%  ({now - started:.0f}s)", end="", file=sys.stderr)
            elif now - last_print > 30:
                print(f"  compiling llama.cpp: {pct}% ({now - started:.0f}s)", file=sys.stderr)
                last_print = now
        rc = proc.wait()
    if tty:
        print(file=sys.stderr)
    return rc


def sdist_archive() -> Path:
    """The pinned llama-cpp-python sdist, kept under ``$SPECGEN_HOME/sdist`` once pip has fetched it
    (pip's index and proxy settings apply): the wheel's source, and the headers that
    tests/test_native_headers.py compiles specgen's own against."""
    cache = specgen_home() / "sdist"
    archive = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", tmp,
               f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"]
        fetched = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"), None) if subprocess.run(cmd).returncode == 0 else None
        if fetched is None:
            sys.exit(f"specgen: cannot download the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist "
                     "(pip download failed; see its messages above)")
        shutil.move(str(fetched), archive)  # same filesystem: the cache never holds half an archive
    return archive


def fetch_sdist(tmp: Path) -> Path:
    """The pinned llama-cpp-python sdist, unpacked under `tmp`."""
    archive = sdist_archive()
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, filter="data")
        else:  # Python < 3.11.4: no extraction filters; the archive comes from our pinned index
            tar.extractall(tmp)
    return tmp / archive.name[: -len(".tar.gz")]


def llama_cpp_versions(source: Path) -> str:
    """Which llama.cpp `source` (an unpacked sdist) holds, in words: llama-cpp-python's version and
    ggml's, as its CMakeLists.txt sets it."""
    words = f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}'s llama.cpp"
    cmake = source / LLAMA_CPP / "ggml/CMakeLists.txt"
    if cmake.is_file():
        parts = dict(re.findall(r"set\(GGML_VERSION_(MAJOR|MINOR|PATCH) (\d+)\)", cmake.read_text(encoding="utf-8")))
        if len(parts) == 3:
            words += f" (ggml {parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']})"
    return words


def patch_llama_cpp(source: Path) -> Path:
    """Add specgen's batch invariance and kernels to the unpacked sdist: native/ copied into ggml-cpu
    as specgen/, then each patch applied. A hunk whose lines do not occur exactly once fails the
    build loudly, naming the patch, the llama.cpp file and its version, rather than building without
    specgen's kernels."""
    target = source / NATIVE_IN_SDIST
    target.mkdir(parents=True, exist_ok=True)
    for header in native_headers():
        shutil.copyfile(header, target / header.name)
    versions = llama_cpp_versions(source)
    try:
        for patch in patching.patches():
            patching.apply(patch, source / LLAMA_CPP, versions)
    except patching.PatchError as error:
        sys.exit(f"specgen: cannot add its kernels to llama.cpp: {error}")
    return source


def build_wheel(plan: BuildPlan, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("llama_cpp_python-*.whl"))
    if wheels:
        return wheels[0]
    print(f"specgen: building llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} from source "
          f"(no wheel cached for these flags; takes minutes)", file=sys.stderr)
    print(f"  CMAKE_ARGS={' '.join(plan.cmake_args)}", file=sys.stderr)
    local: list[str] = []
    if plan.cuda_toolkit:
        local = build_cuda.local_args(dict(os.environ))
    env = dict(os.environ, CMAKE_ARGS=" ".join([*plan.cmake_args, *local]), FORCE_CMAKE="1")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    with tempfile.TemporaryDirectory(dir=cache.parent) as tmp:
        source = patch_llama_cpp(fetch_sdist(Path(tmp)))
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-v", "-w", tmp, str(source)]
        log_path = cache.parent / f"build-{plan.key}.log"
        if _run_with_progress(cmd, env, log_path) != 0:
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            sys.exit("specgen: llama-cpp-python build failed; last lines of "
                     f"{log_path}:\n" + "\n".join(tail))
        built = next(Path(tmp).glob("llama_cpp_python-*.whl"))
        final = cache / built.name
        shutil.move(str(built), final)  # same filesystem: the cache never holds a half wheel
    (cache / "build.txt").write_text(" ".join(plan.cmake_args) + "\n")
    return final


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specgen.llama.build", description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="a CUDA build, with or without a driver here")
    parser.add_argument("--cuda-arch", metavar="ARCHS", help="CMAKE_CUDA_ARCHITECTURES, e.g. 90-real "
                        "(H100/H200); needed without a driver (env: SPECGEN_CUDA_ARCH)")
    parser.add_argument("--wheel-only", action="store_true", help="build and cache the wheel, print its "
                        "path, install nothing (implied by --cuda on a host without an NVIDIA driver)")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if args.cuda_arch or args.cuda:
        env["SPECGEN_CUDA_ARCH"] = args.cuda_arch or env.get("SPECGEN_CUDA_ARCH") or (
            "native" if has_nvidia_gpu() else "")
        if not env["SPECGEN_CUDA_ARCH"]:
            sys.exit("specgen: --cuda on a host without an NVIDIA driver needs --cuda-arch (e.g. 90-real "
                     "for H100/H200)")
    plan = plan_build(env)
    wheel_only = args.wheel_only or ("-DGGML_CUDA=ON" in plan.cmake_args and not has_nvidia_gpu())
    if wheel_only:
        cache = specgen_home() / "wheels" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}-{plan.key}"
        print(f"specgen: llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}: {plan.reason}; wheel only", file=sys.stderr)
        print(build_wheel(plan, cache))
        return
    if installed_for(plan):
        print(f"specgen: llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} already built for this host "
              f"({plan.reason})", file=sys.stderr)
        return
    print(f"specgen: llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}: {plan.reason}", file=sys.stderr)
    cache = specgen_home() / "wheels" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}-{plan.key}"
    wheel = build_wheel(plan, cache)
    print(f"specgen: installing {wheel.name} (cached in {cache})", file=sys.stderr)
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--force-reinstall", "--no-deps", str(wheel)], check=True)
    subprocess.run([*pip, str(wheel)], check=True)  # its dependencies (numpy, jinja2, ...)
    _installed_marker().write_text(plan.key + "\n")


if __name__ == "__main__":
    main()
