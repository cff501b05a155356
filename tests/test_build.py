import pytest

from specgen.llama import build


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


def fake_sdist(root, sgemm_anchor=True):
    """The two vendored llama.cpp files specgen.llama.build hooks its kernel into, cut down to their anchors."""
    sgemm = root / build.SGEMM
    sgemm.parent.mkdir(parents=True)
    body = "    // only enable sgemm for prompt processing\n" if sgemm_anchor else "    // changed upstream\n"
    sgemm.write_text('#include "sgemm.h"\nbool llamafile_sgemm(...) {\n' + body + "}\n")
    cpu = root / build.CPU_BACKEND
    cpu.write_text('#include "ggml-cpu.h"\n    auto f = [] {\n        features.push_back({ nullptr, nullptr });\n')
    return root


def test_the_kernel_is_hooked_in_before_tinyblas_and_named_in_the_features(tmp_path):
    source = build.patch_llama_cpp(fake_sdist(tmp_path))
    sgemm = (source / build.SGEMM).read_text()
    kernel = source / build.SGEMM.rsplit("/", 1)[0] / build.KERNEL_NAME
    assert kernel.read_bytes() == build.KERNEL.read_bytes()
    assert sgemm.index(f'#include "{build.KERNEL_NAME}"') < sgemm.index("specgen_q8_0::matmul(")
    assert sgemm.index("specgen_q8_0::matmul(") < sgemm.index("// only enable sgemm for prompt processing")
    cpu = (source / build.CPU_BACKEND).read_text()
    assert cpu.index('"SPECGEN_Q8_0"') < cpu.index("{ nullptr, nullptr }")


def test_a_changed_llama_cpp_fails_the_build_naming_the_missing_line(tmp_path):
    with pytest.raises(SystemExit) as exc:
        build.patch_llama_cpp(fake_sdist(tmp_path, sgemm_anchor=False))
    message = str(exc.value)
    assert "'// only enable sgemm for prompt processing'" in message and "found it 0 times" in message
    assert build.SGEMM in message


def test_cache_key_changes_with_the_kernel(monkeypatch):
    a = plan_for(monkeypatch, {"avx2"}).key
    monkeypatch.setattr(build, "kernel_digest", lambda: "something else")
    assert plan_for(monkeypatch, {"avx2"}).key != a


def test_doctor_names_the_q8_0_kernel_state():
    from specgen.app.doctor import q8_0_kernel

    assert q8_0_kernel("CPU : AVX2 = 1 | SPECGEN_Q8_0 = avx512vnni | REPACK = 1 |").startswith("avx512vnni")
    assert "SPECGEN_Q8_0=0" in q8_0_kernel("CPU : AVX2 = 1 | SPECGEN_Q8_0 = off |")
    assert q8_0_kernel("CPU : AVX2 = 1 | REPACK = 1 |").startswith("not in this build")
