"""A real GGUF carrying a vocabulary-subset map (specgen.* metadata, written with the gguf package)
loads as a subset draft: llama.cpp decodes through the adapter, every method stays lossless on an
F32 target, and a map that disagrees with the tokenizers is refused in one line."""

from pathlib import Path

import numpy as np
import pytest

from clihelp import assert_one_line_error, specgen
from specgen.vocab import SUBSET_IDS_KEY, SUBSET_UNK_KEY

pytestmark = pytest.mark.real

TARGET = "smollm2-135m-instruct-f32"


def with_subset_map(src: Path, dst: Path, target_ids: list[int], unk: int) -> Path:
    """A copy of `src` whose metadata says draft id i is target id target_ids[i], right or wrong
    (subset.cut_vocabulary only writes maps that are right)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    arch = reader.get_field("general.architecture").contents()
    writer = GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_array(SUBSET_IDS_KEY, target_ids)
    writer.add_uint32(SUBSET_UNK_KEY, unk)
    for tensor in reader.tensors:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                               tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data)
    writer.close()
    return dst


@pytest.fixture(scope="module")
def subset_drafts(tmp_path_factory, smollm2_path):
    from specgen.backend import LlamaModel

    n = LlamaModel(smollm2_path).n_vocab
    out = tmp_path_factory.mktemp("subset")
    from specgen.subset import cut_vocabulary

    good = out / "identity.gguf"
    cut_vocabulary(smollm2_path, good, np.arange(n))  # a cut that keeps everything: the map is the identity
    swapped = list(range(n))
    swapped[1000], swapped[1001] = 1001, 1000
    bad = with_subset_map(smollm2_path, out / "swapped.gguf", swapped, 0)
    return good, bad


def test_the_map_is_read_from_the_gguf(subset_drafts):
    from specgen.backend import LlamaModel

    model = LlamaModel(subset_drafts[0])
    assert model.subset_of_target.unk == 0
    assert np.array_equal(model.subset_of_target.target_ids, np.arange(model.n_vocab))


@pytest.mark.parametrize("method", ["chain", "staged", "auto"])
def test_a_subset_draft_keeps_every_method_lossless(subset_drafts, method):
    import json

    args = ["generate", "-m", TARGET, "-d", str(subset_drafts[0]), "-n", "24", "--no-chat", "--json",
            "The three primary colours are"]
    plain = specgen(*args, "--method", "plain")
    spec = specgen(*args, "--method", method)
    assert spec.returncode == 0, spec.stderr
    record = json.loads(spec.stdout)
    assert record["text"] == json.loads(plain.stdout)["text"]
    if method == "chain":
        assert record["accepted"] > 0  # the draft really drafted through the adapter


def test_a_map_that_disagrees_with_the_tokenizers_is_one_line(subset_drafts):
    proc = specgen("generate", "-m", TARGET, "-d", str(subset_drafts[1]), "--method", "chain", "-n", "4", "hi")
    assert_one_line_error(proc, "(a vocabulary subset) does not match target")


def test_self_draft_is_derived_once_and_keeps_every_method_lossless():
    """`-d self`: gemma's F32 target with its own derived draft (Q2_K, vocabulary cut to the tokens
    it writes most). Derived on first use (about a minute on 2 cores), then cached."""
    import json

    derive = specgen("draft", "derive", "gemma-3-270m-f32")
    assert derive.returncode == 0, derive.stderr
    path = Path(derive.stdout.strip())
    from specgen.backend import LlamaModel

    draft = LlamaModel(path)
    assert 256 < draft.n_vocab < 64_000 and draft.subset_of_target is not None  # cut from 262,144
    args = ["generate", "-m", "gemma-3-270m-f32", "-d", "self", "-n", "32", "--json",
            "The history of the city begins in the twelfth century, when"]
    plain = json.loads(specgen(*args, "--method", "plain").stdout)
    for method in ("chain", "tree", "staged", "auto"):
        proc = specgen(*args, "--method", method)
        assert proc.returncode == 0, proc.stderr
        record = json.loads(proc.stdout)
        assert record["text"] == plain["text"], method
        if method == "chain":
            assert record["accepted"] > 0
    assert specgen("draft", "derive", "gemma-3-270m-f32").stdout.strip() == str(path)  # cached
