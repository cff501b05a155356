"""Real llama.cpp: a token tree in one batch with several sequence ids gives each node the logits of
its own root-to-node path, and dropping branches by sequence id leaves a cache equal to a fresh run."""

import numpy as np
import pytest

from specgen.llama import tools
from specgen.llama.backend import LlamaModel, check_gguf_file
from specgen.errors import ModelError
from specgen.core.kv import evaluate
from specgen.core.protocol import Batch

from token_tree import LEAF_SEQ, PARENTS, fresh_logits, node_seqs, path_to, rel_err, tree_tokens

pytestmark = pytest.mark.real


# specgen's build computes every row of a decode of up to 128 tokens as a one-token decode would
# (test_kernels.py), so a tree node's logits equal its path's decoded alone, bit for bit, on F32 and
# quantized weights alike. llama.cpp as it ships (a GPU build, say) rounds rows by their batch: there
# the tree must match to 1e-3 on F32 and 0.15 relative on quantized weights (measured up to ~9e-2
# on smollm2 Q4_1 after the KV edit), with the same argmax.
INVARIANT = "SPECGEN_INVARIANT = on" in tools.build_info().system_info


@pytest.mark.parametrize("name,tol", [("smollm2_f32", 1e-3), ("gemma_f32", 1e-3),
                                      ("smollm2", 0.15), ("gemma", 0.15)])
def test_tree_batch_logits_equal_per_path_logits_and_kv_keep(name, tol, request):
    model: LlamaModel = request.getfixturevalue(name)
    committed, tree = tree_tokens(model)
    n_past = len(committed)
    depth = [len(path_to(i)) - 1 for i in range(len(PARENTS))]

    ctx = model.new_context(256, n_seq_max=4)
    evaluate(ctx, committed, last_logits=False)
    for seq in LEAF_SEQ.values():
        ctx.seq_cp(0, seq, -1, -1)
    batch = Batch()
    for i, tok in enumerate(tree):
        batch.add(tok, n_past + depth[i], node_seqs(i), True)
    assert batch.seq_ids[0] == (1, 2, 3) and batch.seq_ids[1] == (1, 2)
    logits = ctx.decode(batch).copy()

    for i in range(len(tree)):
        ref = fresh_logits(model, committed, [tree[j] for j in path_to(i)], len(tree))
        assert rel_err(logits[i], ref) < tol, f"node {i}"
        assert np.array_equal(logits[i], ref) or not INVARIANT, f"node {i}: not bit-identical"
        assert int(np.argmax(logits[i])) == int(np.argmax(ref))

    # Accept branch seq 2 up to node 4 (root -> 1 -> 4); drop the others by sequence id.
    keep_seq, v = 2, 4
    ctx.seq_rm(keep_seq, n_past + depth[v] + 1, -1)
    ctx.seq_keep(keep_seq)
    ctx.seq_cp(keep_seq, 0, -1, -1)
    ctx.seq_keep(0)
    path = [tree[j] for j in path_to(v)]
    nxt = model.tokenize(" every", add_special=False)[0]
    after = ctx.decode(Batch([nxt], [n_past + len(path)], [(0,)], [True]))[0]
    ref = fresh_logits(model, committed, path, len(tree), then=nxt)
    assert rel_err(after, ref) < tol
    assert np.array_equal(after, ref) or not INVARIANT
    assert int(np.argmax(after)) == int(np.argmax(ref))


def test_sibling_positions_need_sequence_ids(smollm2_f32):
    """Control: if siblings shared one sequence, logits would differ from the per-path reference,
    so the test above can fail when sequence ids are wrong."""
    smollm2 = smollm2_f32
    committed, tree = tree_tokens(smollm2)
    n_past = len(committed)
    ctx = smollm2.new_context(256, n_seq_max=1)
    evaluate(ctx, committed, last_logits=False)
    batch = Batch()
    batch.add(tree[0], n_past, (0,), True)
    batch.add(tree[1], n_past + 1, (0,), True)
    batch.add(tree[2], n_past + 1, (0,), True)  # sibling of node 1, wrongly in the same sequence
    wrong = ctx.decode(batch)[2]
    ref = fresh_logits(smollm2, committed, [tree[0], tree[2]], 3)
    assert rel_err(wrong, ref) > 1e-2


def test_gguf_checks(tmp_path):
    with pytest.raises(ModelError, match="model file not found"):
        check_gguf_file(tmp_path / "missing.gguf")
    with pytest.raises(ModelError, match="got a directory"):
        check_gguf_file(tmp_path)
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ModelError, match=r"not a GGUF file: .*found b'PK\\x03\\x04'"):
        check_gguf_file(bad)


def test_truncated_gguf_is_a_model_error(tmp_path, smollm2_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2_path.read_bytes()[:200_000])
    with pytest.raises(ModelError, match="could not load .*cut.gguf"):
        LlamaModel(cut)


def test_a_context_without_fixed_threads_follows_the_free_cores(smollm2_path, monkeypatch):
    """With a thread per core, a CPU-bound process beside us stalls llama.cpp's thread barriers:
    a context whose threads were not given drops to the cores left free, and comes back when they
    are free again; one given --threads keeps them."""
    import specgen.llama.backend as backend
    import specgen.host as host

    monkeypatch.setattr(backend, "default_threads", lambda: 4)
    clock = {"wall": 0.0, "cpu": 0.0}  # what /proc/stat would say: all processes' CPU seconds

    def sample():
        return clock["wall"], clock["cpu"], 0.0  # (wall, all processes' CPU, ours)

    def tick(others_cores):  # a second in which other processes used `others_cores` cores
        clock["wall"] += 1.0
        clock["cpu"] += others_cores
        ctx._follow_free_cores()

    monkeypatch.setattr(host, "cpu_sample", sample)
    model = LlamaModel(str(smollm2_path))
    ctx = model.new_context(256)
    assert ctx.adaptive and ctx.n_threads == 4
    tick(0.0)
    tick(2.0)  # a compile on two of the four cores
    assert ctx.n_threads == 2 and backend.L.llama_n_threads(ctx._ctx) == 2
    tick(3.9)
    assert ctx.n_threads == 1
    tick(0.1)
    assert ctx.n_threads == 4 and backend.L.llama_n_threads_batch(ctx._ctx) == 4
    fixed = model.new_context(256, n_threads=3)
    assert not fixed.adaptive and fixed.n_threads == 3


def test_a_context_has_room_for_its_largest_decode_from_the_start(smollm2):
    """llama.cpp reallocates and clears its whole logits buffer inside any decode that needs more
    rows than ever before (gemma: 23 ms for 48 rows, 29 for 64): a speculative target asks for its
    largest decode's rows when it is made (n_seq_max sizes that buffer); its own budget of
    sequence ids is unchanged, and rows come back as they did."""
    from specgen.llama import backend

    roomy, plain = smollm2.new_context(256, n_seq_max=4, n_outputs=80), smollm2.new_context(256, n_seq_max=4)
    assert backend.L.llama_n_seq_max(roomy._ctx) == 80 and roomy.n_seq_max == 4
    assert backend.L.llama_n_seq_max(plain._ctx) == 4
    prompt = smollm2.tokenize("The best way to learn a new language is", add_special=True)
    rows = [ctx.decode(Batch(prompt, list(range(len(prompt))), [(0,)] * len(prompt), [True] * len(prompt))).copy()
            for ctx in (roomy, plain)]
    assert rows[0].shape == (len(prompt), smollm2.n_vocab) and np.array_equal(rows[0], rows[1])


def test_a_model_kept_on_the_cpu_keeps_its_batches_there(smollm2, monkeypatch):
    """In a GPU build llama.cpp runs the products of a 32+ token decode on the GPU even for a model
    with no layer offloaded (op offload), which would undo the CPU kernels' invariance."""
    from specgen.llama import backend

    seen = []
    real = backend.L.llama_init_from_model
    monkeypatch.setattr(backend.L, "llama_init_from_model", lambda model, params: seen.append(params.op_offload)
                        or real(model, params))
    smollm2.new_context(64).close()
    assert smollm2.gpu_layers == 0 and seen == [False]
    monkeypatch.setattr(smollm2, "gpu_layers", 99)  # what --gpu-layers 99 loads (the flag alone)
    smollm2.new_context(64).close()
    assert seen == [False, True]
