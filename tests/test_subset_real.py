"""A real GGUF carrying a vocabulary-subset map (specgen.* metadata, written with the gguf package)
loads as a subset draft: llama.cpp decodes through the adapter, every method stays lossless on an
F32 target, and a map that disagrees with the tokenizers is refused in one line."""

from pathlib import Path

import numpy as np
import pytest

from clihelp import assert_one_line_error, specgen
from harness import GEMMA_F32, SMOLLM2, SMOLLM2_F32, generated, model, tokens_of
from specgen.core.vocab import SUBSET_IDS_KEY, SUBSET_UNK_KEY

pytestmark = pytest.mark.real

TARGET = SMOLLM2_F32


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
    n = model(SMOLLM2).n_vocab
    out = tmp_path_factory.mktemp("subset")
    from specgen.llama.gguf import cut_vocabulary

    good = out / "identity.gguf"
    cut_vocabulary(smollm2_path, good, np.arange(n))  # a cut that keeps everything: the map is the identity
    swapped = list(range(n))
    swapped[1000], swapped[1001] = 1001, 1000
    bad = with_subset_map(smollm2_path, out / "swapped.gguf", swapped, 0)
    return good, bad


def test_the_map_is_read_from_the_gguf(subset_drafts):
    from specgen.llama.backend import LlamaModel

    model = LlamaModel(subset_drafts[0])
    assert model.subset_of_target.unk == 0
    assert np.array_equal(model.subset_of_target.target_ids, np.arange(model.n_vocab))


@pytest.mark.parametrize("method", ["chain", "staged", "auto"])
def test_a_subset_draft_keeps_every_method_lossless(subset_drafts, method):
    """Through a Runner on one session (harness.session: the target and the subset draft loaded once
    for the three methods and plain), as generate runs them."""
    from harness import run_of

    ask = dict(target=TARGET, draft=str(subset_drafts[0]), n=24)
    plain = tokens_of("plain", "The three primary colours are", **ask)
    run = run_of(method, "The three primary colours are", **ask)
    assert run.tokens == plain and len(plain) == 24
    if method == "chain":
        assert run.stats.accepted > 0  # the draft really drafted through the adapter


def test_a_map_that_disagrees_with_the_tokenizers_is_one_line(subset_drafts):
    proc = specgen("generate", "-m", TARGET, "-d", str(subset_drafts[1]), "--method", "chain", "-n", "4", "hi")
    assert_one_line_error(proc, "(a vocabulary subset) does not match target")


def test_self_draft_is_derived_once_and_drafts_losslessly():
    """`-d self`: gemma's F32 target with its own derived draft (Q2_K or Q4_K_M, its vocabulary
    cut to the tokens it writes most, or whole, whichever measured faster on this machine: on one
    day the whole vocabulary with a Q4_0 head modelled 42.2 tok/s against 41.9 cut to 65,536, as
    Q2_K). Derived on first use (a few minutes on 2 cores), then cached. Here: the derivation is
    cached, `-d self` drafts through it (chain accepts tokens) and writes plain's text. Every method
    on this very draft (models.txt's gemma-3-270m-f32-self, `self:gemma-3-270m-f32`) over four
    prompts is test_lossless_real.py's; cut drafts are also tested on their own above (subset_drafts)."""
    import json

    derive = specgen("draft", "derive", GEMMA_F32)
    assert derive.returncode == 0, derive.stderr
    path = Path(derive.stdout.strip())
    from specgen.llama.backend import LlamaModel

    draft = LlamaModel(path)
    if draft.n_vocab == 262_144:  # the whole vocabulary measured faster: no adapter between them
        assert draft.subset_of_target is None
    else:  # cut from 262,144: every draft method then works through the subset adapter
        assert 256 < draft.n_vocab < 262_144 and draft.subset_of_target is not None
    from specgen.models import resolve as models

    assert models.resolve(GEMMA_F32 + "-self").samefile(path)  # the draft test_lossless_real.py runs every method on
    args = ["generate", "-m", GEMMA_F32, "-d", "self", "-n", "32", "--json",
            "The history of the city begins in the twelfth century, when"]
    plain = json.loads(specgen(*args, "--method", "plain").stdout)
    proc = specgen(*args, "--method", "chain")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["text"] == plain["text"] and record["accepted"] > 0
    assert specgen("draft", "derive", GEMMA_F32).stdout.strip() == str(path)  # cached


def test_sampled_output_with_a_real_subset_draft_writes_plains_tokens(tmp_path, smollm2_path, smollm2_f32):
    """Rejection sampling with a real cut draft (smollm2 Q4_1 cut to 8,000 tokens, without the
    target's second choice for the next token): seed by seed, chain writes plain sampling's very
    tokens (the race, core/race.py: each token decided by the seed, its position and its row), the
    token the draft cannot propose included. Power: a sampler that never emits that token fails on
    each seed where plain emits it (p = 0.075 under top-k 4 at T = 1; at least 2 of these 80 seeds,
    asserted), so certainly; any other change to what is emitted fails on the seed it shows on.
    (Until 2026-11-28 this compared 300 seeds each by chi-square, which caught that defect in 75% of
    seeds: equality seed by seed is the stronger check, and the product's promise.)"""
    from specgen.core.kv import evaluate
    from specgen.core.sampling import SamplingParams
    from specgen.core.vocab import SubsetContext
    from specgen.drafting.model import ModelDrafter
    from specgen.llama.backend import LlamaModel
    from specgen.llama.gguf import TokenTable, cut_vocabulary

    target, k, n, runs = smollm2_f32, 4, 2, 80
    prompt = target.tokenize("The capital of France is")
    ctx = target.new_context(128, n_seq_max=8)
    second = int(np.argsort(-evaluate(ctx, prompt))[1])
    keep = [int(i) for i in TokenTable.read(smollm2_path).keep(np.arange(8000), 8000) if i != second]
    cut_vocabulary(smollm2_path, tmp_path / "cut.gguf", np.array(keep))
    draft = LlamaModel(tmp_path / "cut.gguf")
    dctx = SubsetContext(draft.new_context(128, n_seq_max=8), draft.subset_of_target, target.n_vocab)
    accepted, seconds = 0, 0
    for seed in range(runs):
        params = SamplingParams(1.0, top_k=k, seed=seed)
        plain = generated(target, ctx, prompt, n, params).tokens
        chain = generated(target, ctx, prompt, n, params, ModelDrafter(dctx, params, branching=1, max_nodes=n,
                                                                        max_depth=n))
        assert chain.tokens == plain, f"seed {seed}: chain wrote {chain.tokens}, plain {plain}"
        accepted += chain.stats.accepted
        seconds += plain[0] == second
    assert accepted > runs // 4  # the cut draft's proposals really were accepted
    assert seconds >= 2  # ... and the token it cannot propose was plain's, and chain's, on some seeds


def test_a_derived_draft_takes_a_q4_1_head_cut_to_whole_row_groups(smollm2_f32, isolated_home, monkeypatch):
    """`specgen draft derive --head Q4_1`: the draft's embedding/output matrix is Q4_1 (the type of
    specgen's packed q4_1x16 kernel) and its cut vocabulary fills whole 16-row groups, which that
    kernel needs. Two ranking prompts instead of the shipped set keep it quick."""
    from specgen.bench.drafts import gguf_facts
    from specgen.models import selfdraft
    from specgen.models.manifest import file_sha256

    source = Path(smollm2_f32.path)
    monkeypatch.setattr(selfdraft, "ranking_prompts", lambda: ["The rain in Spain", "def add(a, b):"])
    path = selfdraft.derive_self_draft(source, file_sha256(source), "Q4_0", 8000, "Q4_1")
    assert path.parent == isolated_home / "drafts" and path.name.startswith(f"{source.stem}-q4_0-Q4_1-v8000-")
    facts = gguf_facts(path)
    assert facts["head_type"] == "Q4_1" and facts["file_type"] == "Q4_0" and facts["vocabulary_cut"]
    assert 8000 < facts["n_vocab"] < 49152 and facts["n_vocab"] % 16 == 0
