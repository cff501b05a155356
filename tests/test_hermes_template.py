"""models.txt `template:` entries (a GGUF with a shipped chat template written into it), and the
hermes tool-call path end to end through one: a real `specgen serve` of smollm2 under the shipped
Hermes/Qwen 2.5-style template, driven by OpenAI's client."""

import json

import numpy as np
import pytest

from specgen.app import manifest, models
from specgen.errors import ModelError
from specgen.host import TEMPLATES

HERMES_MODEL = "smollm2-135m-instruct-hermes"
SHIPPED = (TEMPLATES / "hermes-tools.jinja").read_text(encoding="utf-8")

def tiny_gguf(path, template: str | None = "old {{ messages }}"):
    """A small GGUF of the shapes a real one has: strings, numbers, an array, F32 and Q8_0 tensors."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    writer = GGUFWriter(path, arch="llama")
    writer.add_uint32("llama.context_length", 64)
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    if template is not None:
        writer.add_string("tokenizer.chat_template", template)
    writer.add_string("general.name", "tiny")
    rng = np.random.default_rng(0)
    writer.add_tensor("norm.weight", rng.standard_normal(32).astype(np.float32))
    q8 = quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    writer.add_tensor("token_embd.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

def fields(path) -> dict:
    from gguf import GGUFReader

    return {k: f.contents() for k, f in GGUFReader(path).fields.items() if not k.startswith("GGUF.")}

def tensors(path) -> dict:
    from gguf import GGUFReader

    return {t.name: (t.tensor_type, bytes(t.data)) for t in GGUFReader(path).tensors}

@pytest.mark.parametrize("had_template", [True, False])
def test_template_copy_replaces_only_the_template_and_is_deterministic(tmp_path, had_template):
    from specgen.llama import gguf

    src = tiny_gguf(tmp_path / "src.gguf", "old {{ messages }}" if had_template else None)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    for dst in (a, b):
        gguf.with_strings(src, dst, {gguf.CHAT_TEMPLATE_KEY: SHIPPED})
    assert a.read_bytes() == b.read_bytes()  # pinnable: the same input gives the same bytes
    before, after = fields(src), fields(a)
    assert after.pop(gguf.CHAT_TEMPLATE_KEY) == SHIPPED
    before.pop(gguf.CHAT_TEMPLATE_KEY, None)
    assert after == before
    assert tensors(a) == tensors(src)

def test_a_template_entry_is_derived_recorded_and_checked(isolated_home, tmp_path, monkeypatch):
    src = tiny_gguf(tmp_path / "base.gguf")
    txt = tmp_path / "models.txt"
    txt.write_text("base  path:base.gguf  -\nh  template:base:hermes-tools  -\nbad  template:base:nope  -\n"
                   "orphan  template:missing:hermes-tools  -\n")
    monkeypatch.setenv("SPECGEN_MODELS_TXT", str(txt))
    entry = models.load_manifest()["h"]
    assert entry.kind == "template" and entry.template_from() == manifest.TemplateSource("base", "hermes-tools")
    out = models.resolve("h")
    assert fields(out)["tokenizer.chat_template"] == SHIPPED and tensors(out) == tensors(src)
    assert models.expected_sha(entry) == manifest.file_sha256(out)
    with pytest.raises(ModelError, match=r"bad: expected a chat template named 'nope' in .*\(shipped: .*hermes-tools"):
        models.resolve("bad")
    with pytest.raises(ModelError, match="orphan derives from 'missing', which is not in models.txt"):
        models.resolve("orphan")

@pytest.mark.parametrize("source", ["template:base", "template::hermes-tools", "template:a:b:c"])
def test_a_malformed_template_source_is_one_line(source):
    with pytest.raises(ModelError, match=f"models.txt line 1: expected template:BASE:TEMPLATE for x, found '{source}'"):
        manifest.parse_manifest([f"x  {source}  -"])

