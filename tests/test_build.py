import pytest

from specgen.llama import build, build_cuda, patching


def plan_for(monkeypatch, flags, system="Linux", machine="x86_64", nvcc=False, gpu=False, env=None):
    monkeypatch.setattr(build.platform, "system", lambda: system)
    monkeypatch.setattr(build.platform, "machine", lambda: machine)
    monkeypatch.setattr(build, "cpu_flags", lambda: set(flags))
    monkeypatch.setattr(build.shutil, "which", lambda name: "/usr/bin/nvcc" if nvcc and name == "nvcc" else None)
    monkeypatch.setattr(build, "has_nvidia_gpu", lambda: gpu)
    return build.plan_build(env or {})


def test_x86_flags_follow_the_cpu_and_amx_stays_off(monkeypatch):
    plan = plan_for(monkeypatch, {"avx", "avx2", "fma", "f16c", "amx_tile", "amx_int8"})
    args = set(plan.cmake_args)
    assert "-DGGML_NATIVE=OFF" in args
    assert {"-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"} <= args
    assert {"-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_BMI2=OFF"} <= args
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= args
    assert "-DGGML_RPC=ON" in args  # --rpc and `specgen rpc-server` work with every build


def test_cuda_only_with_nvcc_and_a_gpu(monkeypatch):
    assert plan_for(monkeypatch, {"avx2"}, nvcc=True, gpu=True).cmake_args == ["-DGGML_CUDA=ON", "-DGGML_RPC=ON"]
    assert "-DGGML_CUDA=ON" not in plan_for(monkeypatch, {"avx2"}, nvcc=True, gpu=False).cmake_args


def test_macos_metal_and_override(monkeypatch):
    assert plan_for(monkeypatch, set(), system="Darwin", machine="arm64").cmake_args == ["-DGGML_METAL=ON", "-DGGML_RPC=ON"]
    plan = plan_for(monkeypatch, {"avx2"}, env={"SPECGEN_CMAKE_ARGS": "-DGGML_VULKAN=ON -DX=1"})
    assert plan.cmake_args == ["-DGGML_VULKAN=ON", "-DX=1"]


def test_cache_key_changes_with_flags(monkeypatch):
    a = plan_for(monkeypatch, {"avx2"})
    b = plan_for(monkeypatch, {"avx2", "avx512f"})
    assert a.key != b.key and a.key == plan_for(monkeypatch, {"avx2"}).key


def test_doctor_flags_amx_and_missing_isas():
    from specgen.app.doctor import build_warnings, enabled_features

    info = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | REPACK = 0 |"
    assert enabled_features(info) == ["SSE3", "AVX", "AVX2", "AVX512", "AMX_INT8", "LLAMAFILE"]
    warnings = build_warnings(info, {"avx", "avx2", "amx_int8"})
    assert any("AMX" in w and "#20824" in w for w in warnings)
    assert any("AVX512, which this CPU lacks" in w for w in warnings)
    assert build_warnings("CPU : AVX = 1 | AVX2 = 1 |", {"avx", "avx2"}) == []


def fake_sdist(root, edit=None):
    """The vendored llama.cpp files specgen's patches change, cut down to their hunks' old lines (each
    hunk's between lines of other code); `edit(target, text)` may change a file as upstream might."""
    for patch in patching.patches():
        text = "".join(f"// vendored code {i}\n" + "\n".join(hunk.old) + "\n" for i, hunk in enumerate(patch.hunks))
        text = edit(patch.target, text) if edit else text
        path = root / build.LLAMA_CPP / patch.target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / build.LLAMA_CPP / "ggml/CMakeLists.txt").write_text(
        "set(GGML_VERSION_MAJOR 0)\nset(GGML_VERSION_MINOR 25)\nset(GGML_VERSION_PATCH 3)\n")
    return root


def test_the_kernels_are_hooked_in_before_llama_cpps_and_named_in_the_features(tmp_path):
    source = build.patch_llama_cpp(fake_sdist(tmp_path))
    for header in build.native_headers():
        assert (source / build.NATIVE_IN_SDIST / header.name).read_bytes() == header.read_bytes()
    cpu_dir = source / build.CPU_DIR
    sgemm = (cpu_dir / "llamafile/sgemm.cpp").read_text()
    assert sgemm.index('#include "specgen/few_columns.h"') < sgemm.index("specgen_few::matmul(")
    # a kernel first, then ggml's one-row code for few columns, and only then tinyBLAS
    assert sgemm.index("specgen_few::matmul(") < sgemm.index("if (specgen::invariant(n))")
    assert sgemm.index("if (specgen::invariant(n))") < sgemm.index("// only enable sgemm for prompt processing")
    repack = (cpu_dir / "repack.cpp").read_text()
    assert repack.count("specgen_rows4") == 6 and "nrows > 3" not in repack
    assert repack.index('#include "specgen/kernels.h"') < repack.index("specgen_kernels::layout<")
    tiled = (cpu_dir / "tiled/tiled.cpp").read_text()
    assert tiled.count("|| specgen::invariant(") == 2
    ops = (cpu_dir / "ops.cpp").read_text()
    assert "nek1 >= 512 && !specgen::invariant(1);" in ops and "!specgen::invariant(neq1)" in ops
    assert ops.index('#include "specgen/attention.h"') < ops.index("specgen_attention::run(params, dst)")
    kv = (source / build.LLAMA_CPP / "src/llama-kv-cache.cpp").read_text()
    assert kv.count("&& !specgen::invariant(1)) {") == 4
    cpu = (cpu_dir / "ggml-cpu.cpp").read_text()
    assert cpu.index('"SPECGEN_INVARIANT"') < cpu.index('"SPECGEN_KERNELS"') < cpu.index("{ nullptr, nullptr }")


def test_every_include_of_specgen_names_a_header_in_native(tmp_path):
    # the patched files include specgen's headers by the names they have in native/
    source = build.patch_llama_cpp(fake_sdist(tmp_path))
    names = {header.name for header in build.native_headers()}
    included = set()
    for patch in patching.patches():
        text = (source / build.LLAMA_CPP / patch.target).read_text()
        included |= {line.split("specgen/")[1].rstrip('"') for line in text.splitlines()
                     if line.startswith("#include") and "specgen/" in line}
    assert included and included <= names


def test_a_changed_llama_cpp_fails_the_build_naming_the_hunk_the_file_and_the_version(tmp_path):
    def upstream(target, text):
        return text.replace("// only enable sgemm for prompt processing", "// changed upstream")

    with pytest.raises(SystemExit) as exc:
        build.patch_llama_cpp(fake_sdist(tmp_path, upstream))
    message = str(exc.value)
    assert "sgemm.cpp.patch, hunk 2 of 2" in message and "found them 0 times" in message
    assert "'// only enable sgemm for prompt processing' is not there" in message
    assert "ggml/src/ggml-cpu/llamafile/sgemm.cpp" in message
    assert f"llama-cpp-python {build.LLAMA_CPP_PYTHON_VERSION}'s llama.cpp (ggml 0.25.3)" in message


def test_a_hunk_whose_lines_occur_twice_fails_too(tmp_path):
    def twice(target, text):
        return text + text if target.endswith("tiled.cpp") else text

    with pytest.raises(SystemExit, match=r"tiled.cpp.patch, hunk 1 of 3 .*found them 2 times"):
        build.patch_llama_cpp(fake_sdist(tmp_path, twice))


def test_the_patches_read_as_diffs_of_the_files_they_name():
    found = patching.patches()
    assert {p.path.name for p in found} == {"sgemm.cpp.patch", "repack.cpp.patch", "tiled.cpp.patch", "ops.cpp.patch",
                                            "llama-kv-cache.cpp.patch", "ggml-cpu.cpp.patch"}
    for patch in found:
        assert patch.path.name == patch.target.rsplit("/", 1)[1] + ".patch"
        assert all(hunk.old != hunk.new for hunk in patch.hunks)


def test_cache_key_changes_with_the_kernel(monkeypatch):
    a = plan_for(monkeypatch, {"avx2"}).key
    monkeypatch.setattr(build, "kernel_digest", lambda: "something else")
    assert plan_for(monkeypatch, {"avx2"}).key != a


def test_doctor_names_the_kernels_state():
    from specgen.app.doctor import kernels

    on = kernels("CPU : AVX2 = 1 | SPECGEN_INVARIANT = on | SPECGEN_KERNELS = avx2: q8_0 q4_1 | REPACK = 1 |")
    assert on.startswith("batch-invariant") and "kernels for avx2: q8_0 q4_1;" in on
    assert on.endswith("attention through ggml's per-row loop")  # a build or setting without it
    rows = kernels("CPU : SPECGEN_INVARIANT = on | SPECGEN_ATTENTION = rows | SPECGEN_KERNELS = avx2: q8_0 |")
    assert rows.endswith("specgen's attention (F32, several rows per pass)")
    assert "no specgen kernel" in kernels("CPU : SPECGEN_INVARIANT = on | SPECGEN_KERNELS = off |")
    assert "no specgen kernel" in kernels("CPU : SPECGEN_INVARIANT = on |")  # a CPU without AVX2
    assert "SPECGEN_KERNELS=0" in kernels("CPU : AVX2 = 1 | SPECGEN_INVARIANT = off | SPECGEN_KERNELS = off |")
    assert kernels("CPU : AVX2 = 1 | REPACK = 1 |").startswith("not in this build")


# --- CUDA builds for named architectures, on a host with nvcc and no driver (build_cuda.py) --------

def fake_toolkit(root, cublas_in_toolkit=False):
    """A CUDA toolkit as this host has it (nvcc, no cuBLAS) and a `pip install --target` of nvidia-cublas."""
    (root / "cuda/bin").mkdir(parents=True)
    (root / "cuda/bin/nvcc").write_text("")
    (root / "cuda/include").mkdir()
    if cublas_in_toolkit:
        (root / "cuda/include/cublas_v2.h").write_text("")
    lib, inc = root / "cublas/nvidia/cu13/lib", root / "cublas/nvidia/cu13/include"
    lib.mkdir(parents=True)
    inc.mkdir(parents=True)
    for name in ("libcublas.so.13", "libcublasLt.so.13"):
        (lib / name).write_text("")
    (inc / "cublas_v2.h").write_text("")
    return {"CUDA_HOME": str(root / "cuda"), "SPECGEN_CUBLAS_DIR": str(root / "cublas")}


def test_a_cuda_build_for_named_architectures_needs_no_driver(monkeypatch, tmp_path):
    env = fake_toolkit(tmp_path)
    monkeypatch.setattr(build, "has_nvidia_gpu", lambda: pytest.fail("a named-architecture build probed for a GPU"))
    plan = plan_for(monkeypatch, {"avx2", "avx512f"}, nvcc=True, gpu=False, env={**env, "SPECGEN_CUDA_ARCH": "90-real"})
    args = plan.cmake_args
    assert args[:2] == ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90-real"]
    assert {"-DGGML_CUDA_FA_QUANTS=f16-f16", "-DGGML_CUDA_NO_VMM=ON", "-DGGML_RPC=ON"} <= set(args)
    # the CPU part is portable (the runner's CPU is not the builder's): AVX2, never AVX-512 or AMX
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_AVX512=OFF", "-DGGML_AMX_INT8=OFF"} <= set(args)
    cublas = tmp_path / "cublas/nvidia/cu13"
    assert plan.cuda_toolkit
    assert build_cuda.local_args(env) == [f"-DCUDAToolkit_ROOT={tmp_path / 'cuda'}",
                                          f"-DCMAKE_CUDA_COMPILER={tmp_path / 'cuda/bin/nvcc'}",
                                          f"-DCUDA_cublas_LIBRARY={cublas / 'lib/libcublas.so.13'}",
                                          f"-DCUDA_cublasLt_LIBRARY={cublas / 'lib/libcublasLt.so.13'}",
                                          f"-DCMAKE_CUDA_FLAGS=-I{cublas / 'include'}"]


def test_a_cuda_wheel_has_its_own_key_and_the_cpu_key_stays(monkeypatch, tmp_path):
    env = fake_toolkit(tmp_path)
    cpu = plan_for(monkeypatch, {"avx2"}, env=env)
    cuda = plan_for(monkeypatch, {"avx2"}, env={**env, "SPECGEN_CUDA_ARCH": "90-real"})
    other_arch = plan_for(monkeypatch, {"avx2"}, env={**env, "SPECGEN_CUDA_ARCH": "89-real;90-real"})
    assert len({cpu.key, cuda.key, other_arch.key}) == 3
    assert not cpu.cuda_toolkit and "-DGGML_CUDA=ON" not in cpu.cmake_args
    # where this host keeps its toolkit reaches CMake, not the key; nor is it looked for by the plan
    # (`specgen doctor` asks for it), only by the build
    nowhere = plan_for(monkeypatch, {"avx2"}, env={"CUDA_HOME": str(tmp_path / "none"), "SPECGEN_CUDA_ARCH": "90-real"})
    assert nowhere.key == cuda.key
    moved = fake_toolkit(tmp_path / "elsewhere", cublas_in_toolkit=True)
    assert build_cuda.local_args(moved) != build_cuda.local_args(env)
    assert not any("cublas" in a for a in build_cuda.local_args(moved))  # the toolkit's own cuBLAS: nothing to add


def test_cuda_build_inputs_are_checked_in_one_line(monkeypatch, tmp_path):
    env = fake_toolkit(tmp_path)
    with pytest.raises(SystemExit, match="not a CUDA architecture list"):
        plan_for(monkeypatch, {"avx2"}, env={**env, "SPECGEN_CUDA_ARCH": "hopper"})
    (tmp_path / "cublas/nvidia/cu13/include/cublas_v2.h").unlink()
    with pytest.raises(SystemExit, match="no cuBLAS.*SPECGEN_CUBLAS_DIR"):
        build_cuda.local_args(env)
    with pytest.raises(SystemExit, match="needs CUDA's compiler"):
        build_cuda.local_args({"CUDA_HOME": str(tmp_path / "none")})
    monkeypatch.setattr(build, "has_nvidia_gpu", lambda: False)
    with pytest.raises(SystemExit, match="needs --cuda-arch"):
        build.main(["--cuda"])


def test_cuda_without_a_driver_builds_the_wheel_and_installs_nothing(monkeypatch, tmp_path, capsys):
    env = fake_toolkit(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECGEN_CMAKE_ARGS", raising=False)
    monkeypatch.setattr(build, "has_nvidia_gpu", lambda: False)
    built = []
    monkeypatch.setattr(build, "build_wheel", lambda plan, cache: built.append((plan, cache)) or cache / "x.whl")
    monkeypatch.setattr(build.subprocess, "run", lambda *a, **k: pytest.fail("installed a CUDA wheel without a driver"))
    build.main(["--cuda", "--cuda-arch", "90-real"])
    (plan, cache), = built
    assert "-DCMAKE_CUDA_ARCHITECTURES=90-real" in plan.cmake_args and cache.name.endswith(plan.key)
    assert capsys.readouterr().out.strip() == str(cache / "x.whl")  # the path, for scripts/gpu-check.sh


def test_the_build_passes_the_toolkits_place_to_cmake(monkeypatch, tmp_path):
    env = fake_toolkit(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen = {}

    def run(cmd, env, log_path):
        seen.update(env)
        log_path.write_text("stopped here\n")
        return 1

    monkeypatch.setattr(build, "fetch_sdist", lambda tmp: tmp)
    monkeypatch.setattr(build, "patch_llama_cpp", lambda source: source)
    monkeypatch.setattr(build, "_run_with_progress", run)
    plan = build.plan_build({"SPECGEN_CUDA_ARCH": "90-real"})
    with pytest.raises(SystemExit, match="build failed"):
        build.build_wheel(plan, tmp_path / "wheels" / plan.key)
    cmake = seen["CMAKE_ARGS"].split()
    assert cmake[:len(plan.cmake_args)] == plan.cmake_args
    assert cmake[len(plan.cmake_args):] == build_cuda.local_args(env)


def test_the_patches_touch_no_cuda_source_and_apply_the_same_to_a_cuda_build(tmp_path):
    """specgen's kernels and invariance are the CPU backend's (docs/gpu.md); the KV cache's cell order
    is llama.cpp's own code, so a CUDA build keeps it too. Nothing under ggml-cuda is changed."""
    targets = {patch.target for patch in patching.patches()}
    assert all("ggml-cuda" not in target for target in targets)
    assert build.NATIVE_IN_SDIST.startswith(build.CPU_DIR)
    outside_cpu = {t for t in targets if not f"{build.LLAMA_CPP}/{t}".startswith(build.CPU_DIR)}
    assert outside_cpu == {"src/llama-kv-cache.cpp"}
    cuda_file = tmp_path / "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu"
    cuda_file.parent.mkdir(parents=True)
    cuda_file.write_text("// untouched\n")
    build.patch_llama_cpp(fake_sdist(tmp_path))
    assert cuda_file.read_text() == "// untouched\n"
    assert (tmp_path / build.LLAMA_CPP / "src/llama-kv-cache.cpp").read_text().count("!specgen::invariant(1)") == 4


def test_a_plan_keeps_the_key_of_the_headers_it_was_made_from(monkeypatch):
    # The marker of the installed build is written when the build ends; a header edited meanwhile
    # once made it name headers that were never built, and the next `make` skipped a needed build.
    plan = plan_for(monkeypatch, {"avx2"})
    key = plan.key
    monkeypatch.setattr(build, "kernel_digest", lambda: "edited while building")
    assert plan.key == key and plan_for(monkeypatch, {"avx2"}).key != key
