"""The per-op profile (specgen/llama/profile.py, scripts/op_profile.py): every node of a decode is
timed and put in one category; the counts are the model's own (one product per weight matrix per
layer, one output layer, one attention per layer), whatever B is."""

import pytest

from specgen.llama.profile import category, profile


def test_categories_name_products_by_weight_type_and_the_output_layer_apart():
    assert category("MUL_MAT", "ffn_up-3", "q4_1") == "matmul q4_1"
    assert category("MUL_MAT", "result_output", "q8_0") == "output layer (q8_0)"
    assert category("FLASH_ATTN_EXT", "__fattn__-0", "f32") == "attention"
    assert category("MUL_MAT", "kq-0", "f16") == "attention products"
    # an F32 model's attention output projection is a weight's product, not the cache's
    assert category("MUL_MAT", "kqv_out-3", "f32", "blk.3.attn_output.weight") == "matmul f32"
    assert category("MUL_MAT", "kq-3", "f16", "cache_k_l3 (view)") == "attention products"
    assert category("RMS_NORM", "norm-0", "f32") == "norms" and category("ROPE", "Qcur-0", "f32") == "rope"


@pytest.mark.real
def test_every_node_of_a_decode_is_timed_once_in_its_category(smollm2):
    n_layer = int(smollm2.meta("llama.block_count"))
    out = profile(smollm2, (1, 4), n_past=32, repeats=1, threads=1, token=100)
    for size in (1, 4):
        nodes, ms = out[size]["nodes"], out[size]["ms"]
        assert nodes["matmul q4_1"] == 7 * n_layer  # q, k, v, o, gate, up, down in each layer
        assert nodes["output layer (q8_0)"] == 1 and nodes["attention"] == n_layer
        assert sum(ms.values()) <= out[size]["instrumented_ms"] and out[size]["plain_ms"] > 0
