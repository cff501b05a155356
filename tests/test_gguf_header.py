"""specgen's own GGUF header reader (llama/gguf_header.py) reads what gguf's GGUFReader reads, for
every value type, array and tensor type, and refuses what is not a whole GGUF in one line."""

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from specgen.errors import ModelError
from specgen.llama.gguf_header import read_header


def every_kind(path: Path) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "ünïcode ✓")
    w.add_uint64("t.u64", 2 ** 63 + 5)
    w.add_int64("t.i64", -(2 ** 62))
    w.add_float64("t.f64", 1e-300)
    w.add_array("t.ints", [3, -1, 7])
    w.add_array("t.floats", [0.5, 1.5])
    w.add_array("t.strings", ["a", "", "日本", "b" * 300])
    w.add_tensor("a.weight", np.ones((4, 32), dtype=np.float32))
    w.add_tensor("b.weight", np.ones((2, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_every_value_is_read_as_gguf_reads_it(tmp_path):
    path = every_kind(tmp_path / "k.gguf")
    reader = GGUFReader(path)
    keys = [k for k in reader.fields if k.startswith("t.")]
    header = read_header(path, tuple(keys), tensors=True)
    assert [k for k in header.keys if k.startswith("t.")] == keys
    for key in keys:
        want, got = reader.get_field(key).contents(), header.values[key]
        if isinstance(want, list):
            assert list(np.asarray(got).tolist() if isinstance(got, np.ndarray) else got) == want, key
        else:
            assert got == want, key
    assert header.counts["t.strings"] == 4 and header.counts["t.ints"] == 3
    assert header.tensor_types == {t.name: int(t.tensor_type) for t in reader.tensors}
    assert header.tensor_types["b.weight"] == GGMLQuantizationType.F16


def test_only_the_values_asked_for_are_kept(tmp_path):
    header = read_header(every_kind(tmp_path / "k.gguf"), ("t.ints",))
    assert list(header.values) == ["t.ints"] and header.tensor_types == {}


def test_a_real_models_tokenizer_and_tensors_match(smollm2_path):
    reader = GGUFReader(smollm2_path)
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "general.file_type")
    header = read_header(smollm2_path, keys, tensors=True)
    for key in keys:
        assert np.array_equal(np.asarray(header.values[key]), np.asarray(reader.get_field(key).contents()))
    assert header.tensor_types == {t.name: int(t.tensor_type) for t in reader.tensors}


@pytest.mark.parametrize("share", [0.0, 0.01, 0.5, 0.97])
def test_what_is_not_a_whole_gguf_header_is_one_line_naming_the_file(tmp_path, share):
    path = every_kind(tmp_path / "k.gguf")
    header_bytes = min(t.data_offset for t in GGUFReader(path).tensors)  # metadata and tensor infos
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(path.read_bytes()[:int(share * header_bytes)] if share else b"not a gguf at all")
    with pytest.raises(ModelError) as e:
        read_header(bad, ("t.strings",), tensors=True)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_the_bench_records_a_models_facts_from_the_header(smollm2_path, tmp_path, warnings):
    from specgen.bench.drafts import gguf_facts

    assert gguf_facts(smollm2_path) == {"file_type": "Q4_1", "head_type": "Q8_0", "n_vocab": 49152,
                                        "vocabulary_cut": False}
    (tmp_path / "x.gguf").write_text("hello")
    assert gguf_facts(tmp_path / "x.gguf") == {}
    assert len(warnings) == 1 and "x.gguf" in warnings[0] and "not recorded" in warnings[0]
