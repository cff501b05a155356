"""scripts/gpu_check.py's packing, without a GPU: the llama_cpp package travels with each library
once and still loads, and the cut model keeps the blocks asked for and decodes."""

import importlib.util
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).parents[1] / "scripts/gpu_check.py")
gpu_check = sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_the_package_travels_with_each_library_once(tmp_path):
    wheel = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llama_cpp/__init__.py", "x = 1\n")
        for name in ("libllama.so", "libllama.so.0", "libllama.so.0.5.0"):
            zf.writestr(f"llama_cpp/lib/{name}", b"ELF" * 1000)
        zf.writestr("lib/libllama.so", b"ELF" * 1000)  # the wheel's second copy, outside the package
        zf.writestr("llama_cpp_python-0.3.36.dist-info/METADATA", "")
    dest = tmp_path / "llama_cpp.tar.xz"
    gpu_check.pack_llama(wheel, dest)
    with tarfile.open(dest) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"llama_cpp/__init__.py", "llama_cpp/lib/libllama.so", "llama_cpp/lib/libllama.so.0"}
        link = members["llama_cpp/lib/libllama.so"]
        assert link.issym() and link.linkname == "libllama.so.0"
        tar.extractall(tmp_path / "site")
    assert (tmp_path / "site/llama_cpp/lib/libllama.so").read_bytes() == b"ELF" * 1000


def test_a_payload_whose_sums_differ_is_refused_in_one_line(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "SHA256SUMS").write_text(f"{gpu_check.sha256(tmp_path / 'model.gguf')}  model.gguf\n")
    gpu_check.check_sums(tmp_path)
    (tmp_path / "model.gguf").write_bytes(b"GGUF damaged")
    with pytest.raises(SystemExit, match="model.gguf is missing or damaged"):
        gpu_check.check_sums(tmp_path)


@pytest.mark.real
def test_the_cut_model_keeps_its_first_blocks_and_decodes(tmp_path):
    from specgen.models import resolve as models
    from specgen.llama.backend import LlamaModel

    src = models.resolve("smollm2-135m-instruct-q4_1")
    gpu_check.keep_layers(src, tmp_path / "cut.gguf", 2)
    cut = LlamaModel(tmp_path / "cut.gguf")
    assert cut.meta("llama.block_count") == "2" and cut.meta("general.name").endswith("(first 2 layers)")
    assert cut.n_vocab == LlamaModel(src).n_vocab
    assert (tmp_path / "cut.gguf").stat().st_size < src.stat().st_size / 2  # the embedding is most of the rest
    ctx = cut.new_context(64)
    from specgen.core.kv import evaluate

    logits = evaluate(ctx, cut.tokenize("The sea is"))
    assert logits is not None and logits.shape == (cut.n_vocab,)
