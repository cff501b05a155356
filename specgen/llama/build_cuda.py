"""A CUDA build of llama-cpp-python for named GPU architectures, on a host with nvcc and no driver.

`python -m specgen.llama.build --cuda --cuda-arch 90-real` (or SPECGEN_CUDA_ARCH=90-real) builds
the pinned sdist with GGML_CUDA=ON, specgen's patches applied as for every build, and caches the
wheel beside the CPU ones under its own key. The CPU part of such a build targets a portable
x86-64 (AVX2, no AVX-512): the machine that runs it is not the one that built it. See docs/gpu.md
for what specgen's patches do and do not do on the CUDA backend.

Flags that only say where this host keeps its toolkit (nvcc's path, a cuBLAS from the
nvidia-cublas wheel) are `local_args`, found when building (not when `specgen doctor` asks for the
plan): they reach CMake but not the wheel cache's key.
"""

from __future__ import annotations

import re
import site
import sys
from pathlib import Path

# Every x86-64 host of a datacenter GPU has these (x86-64-v3); AVX-512 is left off since the
# builder cannot see the runner's CPU. With every layer offloaded the CPU does little.
PORTABLE_X86 = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_VBMI=OFF",
                "-DGGML_AVX512_BF16=OFF"]
# Flash attention's vector kernels only for f16 K and V, the KV cache specgen makes (llama.cpp's
# default also builds q4_0, q8_0 and bf16 pairs); NCCL only serves several GPUs. No VMM: its memory
# pool is the only user of the driver API (libcuda), which a builder without a driver or the
# toolkit's stubs cannot link; without it ggml's pool takes device memory with cudaMalloc.
CUDA_TRIMS = ["-DGGML_CUDA_FA_QUANTS=f16-f16", "-DGGML_CUDA_NCCL=OFF", "-DGGML_CUDA_NO_VMM=ON"]
ARCH = re.compile(r"^(native|all|all-major|\d+[af]?(-real|-virtual)?)$")
CUBLAS_HEADER = "cublas_v2.h"


def check_arch(arch: str) -> str:
    """CMAKE_CUDA_ARCHITECTURES from --cuda-arch ('90', '90-real', '89;90-real', 'native'), or exit."""
    parts = [p.strip() for p in re.split(r"[;,]", arch) if p.strip()]
    if not parts or not all(ARCH.match(p) for p in parts):
        sys.exit(f"specgen: --cuda-arch {arch!r} is not a CUDA architecture list (e.g. 90, 90-real, 86;90-real)")
    return ";".join(parts)


def cuda_args(arch: str) -> list[str]:
    """The CMake flags that make a build a CUDA build for `arch` (build.plan_cuda adds the ones every
    build shares; together, and only they, key its wheel)."""
    return ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={check_arch(arch)}", *CUDA_TRIMS, *PORTABLE_X86]


def toolkit_root(env: dict[str, str]) -> Path:
    for name in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT"):
        if env.get(name):
            return Path(env[name])
    return Path("/usr/local/cuda")


def _site_dirs() -> list[Path]:
    dirs = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    return [Path(d) for d in dirs if d]


def find_cublas(env: dict[str, str], toolkit: Path) -> tuple[Path, Path] | None:
    """(include dir, lib dir) of a cuBLAS the toolkit lacks: $SPECGEN_CUBLAS_DIR (a `pip install
    --target` of nvidia-cublas) or an installed nvidia-cublas wheel. None where the toolkit has one."""
    if any((toolkit / sub / CUBLAS_HEADER).is_file() for sub in ("include", "targets/x86_64-linux/include")):
        return None
    roots = [Path(env["SPECGEN_CUBLAS_DIR"])] if env.get("SPECGEN_CUBLAS_DIR") else _site_dirs()
    for root in roots:
        for sub in ("nvidia/cu13", "nvidia/cublas", "nvidia/cu12", "."):
            base = root / sub
            if (base / "include" / CUBLAS_HEADER).is_file() and any((base / "lib").glob("libcublas.so*")):
                return base / "include", base / "lib"
    sys.exit(f"specgen: the CUDA toolkit at {toolkit} has no cuBLAS ({CUBLAS_HEADER}); install it, or "
             "`pip install --target DIR nvidia-cublas` and set SPECGEN_CUBLAS_DIR=DIR")


def _library(lib: Path, name: str) -> Path:
    found = sorted(lib.glob(f"lib{name}.so*"), key=lambda p: len(p.name))
    if not found:
        sys.exit(f"specgen: no lib{name}.so in {lib}")
    return found[0]


def local_args(env: dict[str, str]) -> list[str]:
    """Where this host's toolkit is: nvcc by its real path (a wrapper script on PATH hides the
    toolkit from CMake) and, where the toolkit has none, the cuBLAS of an nvidia-cublas wheel."""
    toolkit = toolkit_root(env)
    nvcc = toolkit / "bin" / "nvcc"
    if not nvcc.is_file():
        sys.exit(f"specgen: --cuda needs CUDA's compiler; no {nvcc} (set CUDA_HOME to the toolkit)")
    args = [f"-DCUDAToolkit_ROOT={toolkit}", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    cublas = find_cublas(env, toolkit)
    if cublas is not None:
        include, lib = cublas
        args += [f"-DCUDA_cublas_LIBRARY={_library(lib, 'cublas')}",
                 f"-DCUDA_cublasLt_LIBRARY={_library(lib, 'cublasLt')}",
                 f"-DCMAKE_CUDA_FLAGS=-I{include}"]
    return args
