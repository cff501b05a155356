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
from specgen.llama import build_cuda


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


# specgen's batch invariance and few-column kernels, compiled into llama.cpp's CPU backend: see
# the headers' comments (native/invariant.h for why, native/few_columns.h for the kernels).
NATIVE = Path(__file__).resolve().parent / "native"
CPU_DIR = "vendor/llama.cpp/ggml/src/ggml-cpu"
# (source under native/, where it goes in the sdist)
HEADERS = [
    (NATIVE / "invariant.h", f"{CPU_DIR}/specgen_invariant.h"),
    (NATIVE / "few_columns.h", f"{CPU_DIR}/llamafile/specgen_few_columns.h"),
    *((NATIVE / f"few_{part}.h", f"{CPU_DIR}/llamafile/specgen_few_{part}.h")
      for part in ("q8_0", "low_bits", "float", "k_quants")),
    (NATIVE / "attention.h", f"{CPU_DIR}/specgen_attention.h"),
    (NATIVE / "packed_q4_1.h", f"{CPU_DIR}/specgen_packed_q4_1.h"),
    (NATIVE / "packed_q5_0.h", f"{CPU_DIR}/specgen_packed_q5_0.h"),
    (NATIVE / "packed_common.h", f"{CPU_DIR}/specgen_packed_common.h"),
    (NATIVE / "packed_traits.h", f"{CPU_DIR}/specgen_packed_traits.h"),
]
SGEMM = f"{CPU_DIR}/llamafile/sgemm.cpp"
CPU_BACKEND = f"{CPU_DIR}/ggml-cpu.cpp"
OPS = f"{CPU_DIR}/ops.cpp"
REPACK = f"{CPU_DIR}/repack.cpp"
TILED = f"{CPU_DIR}/tiled/tiled.cpp"
KV_CACHE = "vendor/llama.cpp/src/llama-kv-cache.cpp"
# Where they are hooked in: (file, anchor, replacement[, how many times the anchor occurs, else once]).
HOOKS = [
    # Products: a specgen kernel first; for few columns without one, ggml's one-column code.
    (SGEMM, '#include "simd-mappings.h"\n', '#include "simd-mappings.h"\n#include "specgen_few_columns.h"\n'),
    (SGEMM, "    // only enable sgemm for prompt processing\n",
     "#ifdef SPECGEN_FEW\n"
     "    if (Ctype == GGML_TYPE_F32 && specgen_few::matmul(m, n, k, A, lda, B, ldb, (float *) C, ldc,\n"
     "            (ggml_type) Atype, (ggml_type) Btype, params->ith, params->nth))\n"
     "        return true;\n"
     "#endif\n"
     "    if (specgen::invariant(n))\n"
     "        return false;\n"
     "    // only enable sgemm for prompt processing\n"),
    # Repacked weights (Q4_0, Q4_K, IQ4_NL on AVX2): few columns through the one-column GEMV, each
    # quantized as one row is (not in the 4-row interleaved layout the GEMM reads).
    (REPACK, '#include "repack.h"\n',
     '#include "repack.h"\n#include "specgen_invariant.h"\n'
     '#ifdef GGML_USE_LLAMAFILE\n#include "llamafile/specgen_few_columns.h"\n#endif\n'),
    # Q4_1 and Q5_0 weights repacked into specgen's layout and arithmetic for every product
    # (packed_q4_1.h, packed_q5_0.h);
    # Q4_0 and Q4_K weights stay in ggml's layout where a specgen kernel reads them (prompts then go
    # through tinyBLAS and the tiled K-quant matmul instead of the repacked GEMM).
    (REPACK, "static const ggml::cpu::tensor_traits * ggml_repack_get_optimal_repack_type(const struct ggml_tensor * cur) {\n",
     "#if defined(SPECGEN_FEW) && defined(GGML_USE_LLAMAFILE)\n"
     '#include "specgen_packed_q4_1.h"\n'
     '#include "specgen_packed_q5_0.h"\n'
     "#endif\n"
     "static const ggml::cpu::tensor_traits * ggml_repack_get_optimal_repack_type(const struct ggml_tensor * cur) {\n"
     "#if defined(SPECGEN_FEW) && defined(SPECGEN_PACKED)\n"
     "    if (const ggml::cpu::tensor_traits * packed = specgen_packed::traits_for(cur)) {\n"
     "        return packed;\n"
     "    }\n"
     "#endif\n"
     "#if defined(SPECGEN_FEW) && defined(SPECGEN_PACKED_Q5_0)\n"
     "    if (const ggml::cpu::tensor_traits * packed = specgen_packed_q5_0::traits_for(cur)) {\n"
     "        return packed;\n"
     "    }\n"
     "#endif\n"
     "#if defined(SPECGEN_FEW) && defined(GGML_USE_LLAMAFILE)\n"
     "    if (specgen_few::keeps_layout(cur->type)) {\n"
     "        return nullptr;\n"
     "    }\n"
     "#endif\n"),
    (REPACK, "            for (int64_t i11 = ith * 4; i11 < ne11 - ne11 % 4; i11 += nth * 4) {\n",
     "            const int64_t specgen_rows4 = specgen::invariant(ne11) ? 0 : ne11 - ne11 % 4;\n"
     "            for (int64_t i11 = ith * 4; i11 < specgen_rows4; i11 += nth * 4) {\n"),
    (REPACK, "            const int64_t i11_processed = ne11 - ne11 % 4;\n",
     "            const int64_t i11_processed = specgen_rows4;\n"),
    (REPACK, "        if (nrows > 3) {\n",
     "        const int64_t specgen_rows4 = specgen::invariant(ne11) ? 0 : nrows - (nrows % 4);\n"
     "        if (specgen_rows4 > 0) {\n"),
    (REPACK, "        for (int iter = nrows - (nrows % 4); iter < nrows; iter++) {\n",
     "        for (int iter = specgen_rows4; iter < nrows; iter++) {\n"),
    # The tiled K-quant matmul (from 8 columns): few columns go on to ggml's one-column code.
    (TILED, '#include "tiled-kernel.h"\n', '#include "tiled-kernel.h"\n#include "../specgen_invariant.h"\n'),
    (TILED, "    if (!ggml_tiled_min_batch(dst->src[1]->ne[1])) {\n",
     "    if (!ggml_tiled_min_batch(dst->src[1]->ne[1]) || specgen::invariant(dst->src[1]->ne[1])) {\n"),
    (TILED, "    if (!ggml_tiled_min_batch(cne1)) {\n",
     "    if (!ggml_tiled_min_batch(cne1) || specgen::invariant(cne1)) {\n"),
    # Attention: few query rows through the per-row loop over the whole cache (no KV split over
    # threads for one row, no tiles).
    (OPS, '#include "vec.h"\n', '#include "vec.h"\n#include "specgen_invariant.h"\n'),
    (OPS, "&& q->type == GGML_TYPE_F32 && nek1 >= 512;\n",
     "&& q->type == GGML_TYPE_F32 && nek1 >= 512 && !specgen::invariant(1);\n"),
    (OPS, "                                neq1 >= Q_TILE_SZ);\n",
     "                                neq1 >= Q_TILE_SZ && !specgen::invariant(neq1));\n"),
    # ... and several of those rows per pass over the cache, each row's arithmetic ggml's (attention.h).
    (OPS, "static void ggml_compute_forward_flash_attn_ext_f16(\n",
     '#include "specgen_attention.h"\n\nstatic void ggml_compute_forward_flash_attn_ext_f16(\n'),
    (OPS, "    } else {\n\n        // total rows in q\n",
     "    } else if (specgen_attention::run(params, dst)) {\n"
     "        // specgen's attention for few rows did it\n"
     "    } else {\n\n        // total rows in q\n"),
    # The KV cache: flash attention sums a row's cells in cell order, so a committed token must never
    # land in a cell before earlier ones (a hole left by a rejected draft), which plain decoding
    # never does. Cells freed by dropped drafts are not reused before the cache wraps around.
    (KV_CACHE, '#include "llama-kv-cache.h"\n',
     '#include "llama-kv-cache.h"\n#include "../ggml/src/ggml-cpu/specgen_invariant.h"\n'),
    (KV_CACHE, "new_head != cells.size() && new_head < head) {\n",
     "new_head != cells.size() && new_head < head && !specgen::invariant(1)) {\n", 3),
    (KV_CACHE, "        if (head_cur > cells.get_used() + 2*n_tokens) {\n",
     "        if (head_cur > cells.get_used() + 2*n_tokens && !specgen::invariant(1)) {\n"),
    # What the build has, in llama.cpp's system info (`specgen doctor` reads it).
    (CPU_BACKEND, '#include "amx/amx.h"\n',
     '#include "amx/amx.h"\n#include "specgen_invariant.h"\n'
     '#ifdef GGML_USE_LLAMAFILE\n#include "llamafile/specgen_few_columns.h"\n#endif\n'),
    (CPU_BACKEND, "        features.push_back({ nullptr, nullptr });\n",
     "        features.push_back({ \"SPECGEN_INVARIANT\", specgen::current().invariant ? \"on\" : \"off\" });\n"
     "        features.push_back({ \"SPECGEN_ATTENTION\", specgen::current().invariant && specgen::kernel_on(\"attention\") ? \"rows\" : \"off\" });\n"
     "    #ifdef SPECGEN_FEW\n"
     "        features.push_back({ \"SPECGEN_KERNELS\", specgen_few::describe() });\n"
     "    #endif\n"
     "        features.push_back({ nullptr, nullptr });\n"),
]


def kernel_digest() -> str:
    """What the patch adds, for the wheel cache's key: the headers and where they are hooked in."""
    blob = b"".join(source.read_bytes() for source, _ in HEADERS) + repr(HOOKS).encode()
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


def fetch_sdist(tmp: Path) -> Path:
    """The pinned llama-cpp-python sdist, unpacked under `tmp` (pip fetches it, so pip's index and
    proxy settings apply)."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(tmp),
           f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"]
    if subprocess.run(cmd).returncode != 0:
        sys.exit(f"specgen: cannot download the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist "
                 "(pip download failed; see its messages above)")
    archive = next(tmp.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, filter="data")
        else:  # Python < 3.11.4: no extraction filters; the archive comes from our pinned index
            tar.extractall(tmp)
    archive.unlink()
    return tmp / archive.name[: -len(".tar.gz")]


def patch_llama_cpp(source: Path) -> Path:
    """Add specgen's batch invariance and kernels to the unpacked sdist. Each hook replaces an anchor
    line that must occur exactly once, so a changed llama.cpp fails the build loudly rather than
    building without them."""
    for header, rel in HEADERS:
        shutil.copyfile(header, source / rel)
    for rel, anchor, replacement, *times in HOOKS:
        path = source / rel
        text = path.read_text(encoding="utf-8")
        expected = times[0] if times else 1
        if text.count(anchor) != expected:
            sys.exit(f"specgen: cannot add its kernels to llama.cpp: expected the line {anchor.strip()!r} "
                     f"{'once' if expected == 1 else f'{expected} times'} in {rel}, found it {text.count(anchor)} times")
        path.write_text(text.replace(anchor, replacement), encoding="utf-8")
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
