"""specgen's C++ (specgen/llama/native/*.h) compiled header by header, each alone, for AVX2 and for
AVX-512, as `make native-check` runs it: every header includes what it uses by its own name, so a reader
(or an editor's language server) can follow it without the build's copy into llama.cpp.

The kernels' headers need no ggml header at all and are compiled with no include path; the ones that
meet llama.cpp (few_columns.h, attention.h, packed_traits.h, kernels.h) against the headers of the
llama.cpp that the pinned llama-cpp-python vendors (the sdist specgen.llama.build keeps), with ggml-cpu's
include directories. Each header is compiled as a translation unit of its own (-fsyntax-only: every
function and the templates they use checked, nothing linked); kernels.h also instantiates the repack
buffer's traits with a base class like repack.cpp's, as patches/repack.cpp.patch does. Last, each
patched llama.cpp file up to specgen's includes, so that llama.cpp's macros meet specgen's names."""

import platform
import shutil
import subprocess
import tarfile

import pytest

from specgen.llama import build, patching
from specgen.llama.build import NATIVE

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="specgen's kernels are x86-64 code (compiling them needs no AVX at run time)")

ISAS = {
    "avx2": ["-mavx", "-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
               "-mavx512vnni"],
}
# The headers that reach into llama.cpp; every other one is plain C++17 over <immintrin.h>.
WITH_GGML = {"few_columns.h", "attention.h", "packed_traits.h", "kernels.h"}
HEADERS = sorted(path.name for path in NATIVE.glob("*.h"))
# What each ISA must define (a header that compiled to nothing would pass -fsyntax-only vacuously).
DEFINES = {"few_common.h": "SPECGEN_FEW", "packed_q4_0.h": "SPECGEN_PACKED_Q4_0", "packed_q4_1.h": "SPECGEN_PACKED",
           "packed_q5_0.h": "SPECGEN_PACKED_Q5_0", "packed_q5_1.h": "SPECGEN_PACKED_Q5_1",
           "packed_q8_0.h": "SPECGEN_PACKED_Q8_0", "packed_q3_k.h": "SPECGEN_PACKED_Q3_K", "packed_q4_k.h": "SPECGEN_PACKED_Q4_K",
           "packed_q5_k.h": "SPECGEN_PACKED_Q5_K", "packed_q6_k.h": "SPECGEN_PACKED_Q6_K",
           "packed_traits.h": "SPECGEN_PACKED_LAYOUTS"}
# repack.cpp's ggml::cpu::repack::tensor_traits_base, which the patch passes to kernels.h
REPACK_BASE = """
namespace ggml::cpu::repack {
class tensor_traits_base : public ggml::cpu::tensor_traits {
  public:
    virtual int repack(struct ggml_tensor * t, const void * data, size_t data_size) = 0;
};
}
static const ggml::cpu::tensor_traits * specgen_layout(const ggml_tensor * t) {
    const ggml::cpu::tensor_traits * out = nullptr;
    return specgen_kernels::layout<ggml::cpu::repack::tensor_traits_base>(t, out) ? out : nullptr;
}
static const char * specgen_describe() { return specgen_kernels::describe(); }
"""


def compiler() -> str:
    found = shutil.which("g++") or shutil.which("c++")
    assert found, "a C++ compiler is needed to build llama-cpp-python, and to check its kernels"
    return found


@pytest.fixture(scope="module")
def llama_cpp(tmp_path_factory):
    """The pinned sdist's llama.cpp, as far as these tests read it: ggml's headers and the files the
    patches change (test_the_patches_apply_to_the_pinned_llama_cpp patches this copy)."""
    return extracted(tmp_path_factory)


@pytest.fixture(scope="module")
def patched_llama_cpp(tmp_path_factory):
    """Another such copy, every patch applied (its own: the fixture above may be patched or not)."""
    root = extracted(tmp_path_factory)
    versions = build.llama_cpp_versions(root.parents[1])
    for patch in patching.patches():
        patching.apply(patch, root, versions)
    return root


def extracted(tmp_path_factory):
    try:
        archive = build.sdist_archive()
    except SystemExit as error:
        pytest.skip(f"no llama-cpp-python sdist to compile against: {error}")
    root = tmp_path_factory.mktemp("sdist")
    prefix = f"{archive.name[: -len('.tar.gz')]}/{build.LLAMA_CPP}/"
    targets = {prefix + patch.target for patch in patching.patches()}
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and (
            m.name in targets or m.name.startswith(prefix + "ggml/") and m.name.endswith((".h", "CMakeLists.txt")))]
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, members=members, filter="data")
        else:
            tar.extractall(root, members=members)
    return root / prefix


@pytest.fixture(scope="module")
def ggml_include(llama_cpp):
    """ggml-cpu's include directories."""
    ggml = llama_cpp / "ggml"
    return [f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", f"-I{ggml / 'src/ggml-cpu'}"]


def compile_alone(tmp_path, header, isa, include):
    source = tmp_path / f"{header}-{isa}.cpp"
    text = f'#include "{NATIVE / header}"\n'
    if header in DEFINES:
        text += f"#ifndef {DEFINES[header]}\n#error {header} defined nothing for this instruction set\n#endif\n"
    if header == "kernels.h":
        text += REPACK_BASE
    source.write_text(text)
    done = subprocess.run([compiler(), "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                           "-Wno-unused-function", *ISAS[isa], *include, str(source)], capture_output=True, text=True)
    assert done.returncode == 0, f"{header} ({isa}) does not compile alone:\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("isa", sorted(ISAS))
@pytest.mark.parametrize("header", [h for h in HEADERS if h not in WITH_GGML])
def test_a_kernel_header_compiles_alone_without_ggml(tmp_path, header, isa):
    compile_alone(tmp_path, header, isa, [])


@pytest.mark.parametrize("isa", sorted(ISAS))
@pytest.mark.parametrize("header", sorted(WITH_GGML))
def test_a_header_that_meets_llama_cpp_compiles_alone_against_its_headers(tmp_path, header, isa, ggml_include):
    compile_alone(tmp_path, header, isa, ggml_include)


def test_every_header_is_checked_and_shipped():
    assert WITH_GGML <= set(HEADERS) and len(HEADERS) >= 12
    import tomllib

    pyproject = tomllib.loads((NATIVE.parents[2] / "pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]["specgen.llama"]
    assert "native/*.h" in data and "patches/*.patch" in data


def test_the_patches_apply_to_the_pinned_llama_cpp(llama_cpp):
    versions = build.llama_cpp_versions(llama_cpp.parents[1])
    assert versions.endswith("(ggml 0.25.3)")  # the version a failing hunk's message names
    for patch in patching.patches():
        before = (llama_cpp / patch.target).read_text()
        patching.apply(patch, llama_cpp, versions)
        after = (llama_cpp / patch.target).read_text()
        added = sum(len(h.new) - len(h.old) for h in patch.hunks)
        assert after.count("\n") - before.count("\n") == added and "specgen" in after


@pytest.mark.parametrize("isa", sorted(ISAS))
def test_each_header_compiles_where_the_patches_include_it(tmp_path, isa, patched_llama_cpp, ggml_include):
    """What a patched llama.cpp file has before specgen's `#include "specgen/..."` lines, then those
    lines, as one translation unit: the macros of the headers llama.cpp includes first (ggml-common.h
    defines QK_K, QK4_0, ...) meet specgen's names, which a header compiled alone never shows (a
    constant named QK_K broke the wheel's build on 2026-11-29 and passed the tests above)."""
    root = patched_llama_cpp
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "specgen").symlink_to(NATIVE)
    checked = []
    for patch in patching.patches():
        lines = (root / patch.target).read_text().splitlines()
        ours = [i for i, line in enumerate(lines) if line.startswith('#include "specgen/')]
        if not ours:
            continue
        end = ours[-1] + 1
        if end < len(lines) and lines[end].startswith("#endif"):
            end += 1
        source = tmp_path / f"{patch.path.stem}-{isa}.cpp"
        source.write_text("\n".join(lines[:end]) + "\n")
        here = [f"-I{(root / patch.target).parent}"]
        done = subprocess.run([compiler(), "-std=c++17", "-fsyntax-only", "-DGGML_USE_LLAMAFILE", "-Wno-unused-function",
                               *ISAS[isa], *here, f"-I{tmp_path / 'include'}", *ggml_include, str(source)],
                              capture_output=True, text=True)
        assert done.returncode == 0, f"{patch.target} ({isa}) up to specgen's includes:\n{done.stderr[-4000:]}"
        checked.append(patch.target)
    assert len(checked) >= 4, checked  # ggml-cpu.cpp, repack.cpp, ops.cpp, sgemm.cpp, tiled.cpp
