"""Batch invariance and specgen's few-column kernels (specgen/llama/native) on the real models.

A token's logits must be the same bits whether the target decoded it alone or as any row of a
verification batch, with one thread or two: that is what makes greedy speculative decoding equal
plain decoding on quantized targets. Each check runs in a child process so that SPECGEN_KERNELS
(read once per process by llama.cpp) can differ between runs. Without specgen's patch in the build
these fail inside `make test` and are skipped elsewhere (tests/invariance.py)."""

import functools
import json
import os
import platform
import subprocess
import sys

import pytest

from invariance import invariant_build, needs_invariance  # noqa: F401 (a fixture, and the mark that uses it)
from specgen.models import resolve as models
from specgen.host import cpu_flags
from specgen.llama import tools

pytestmark = pytest.mark.real

X86_WITH_KERNELS = platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "f16c", "fma"} <= cpu_flags()

# Prefills a prompt of 600 tokens (past the 512 cells from which llama.cpp splits one-token attention
# over threads), then decodes 128 tokens one at a time with 2 threads, in batches of 2..128 rows (at two
# offsets where they fit), and one at a time again with 1 thread on the same cache (as the backend changes its thread
# count mid-context when other processes take a core: backend._follow_free_cores; one prefill, where
# a second context prefilled again with 1 thread took half the time). Prints each row's sha256 per
# way of decoding it. The context holds every way's tokens in fresh cells (2,048; the ways take about
# 1,300): a cache that wraps puts a row's cells out of position order, which changes its sums' order.
SCRIPT = r"""
import hashlib, json, sys
import llama_cpp
if sys.argv[2] == "no-repack":  # every weight in ggml's own layout, read by ggml's vec_dot
    default_params = llama_cpp.llama_model_default_params
    def no_repack():
        params = default_params()
        params.use_extra_bufts = False
        return params
    llama_cpp.llama_model_default_params = no_repack
from specgen.llama.backend import LlamaModel
from specgen.core.protocol import Batch
model = LlamaModel(sys.argv[1])
text = "The history of the city begins with a small settlement on the river, traders of salt and wool. "
prompt = model.tokenize(text * 40)[:600]
toks = model.tokenize(" and the people who lived there were farmers, fishers and traders of salt, wine and cloth" * 8,
                      add_special=False)[:128]
assert len(toks) == 128
P = len(prompt)
out = {}
ctx = model.new_context(2048, n_seq_max=1, n_threads=2, n_outputs=128)  # no wrap: every way in fresh cells
for c0 in range(0, P, 256):
    b = Batch()
    for i in range(c0, min(c0 + 256, P)):
        b.add(prompt[i], i, (0,), i == P - 1)
    ctx.decode(b)
def decode(start, rows):
    b = Batch()
    for i in range(start, start + rows):
        b.add(toks[i], P + i, (0,), True)
    return [hashlib.sha256(r.tobytes()).hexdigest() for r in ctx.decode(b)]
out["alone, 2 threads"] = [decode(i, 1)[0] for i in range(len(toks))]
ctx.seq_rm(0, P, -1)
for rows in (2, 3, 4, 8, 16, 17, 33, 128):  # up to FEW_COLUMNS, the largest invariant decode
    for start in (0, 5):
        if start + rows > len(toks):
            continue
        for i in range(start):
            decode(i, 1)
        out[f"batch of {rows} from {start}"] = [None] * start + decode(start, rows)
        ctx.seq_rm(0, P, -1)
llama_cpp.llama_set_n_threads(ctx._ctx, 1, 1)
out["alone, 1 threads"] = [decode(i, 1)[0] for i in range(len(toks))]
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=None)  # the two tests below read specgen's own rows of each model: decode them once
def rows_by_way(path, kernels: str, layout: str = "as-loaded") -> dict[str, list]:
    env = dict(os.environ, SPECGEN_KERNELS=kernels)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(path), layout], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def differing(ways: dict[str, list]) -> list[str]:
    """Every (way, row) whose logits differ from the row decoded alone with 2 threads."""
    alone = ways["alone, 2 threads"]
    return [f"{way}: row {i}" for way, rows in ways.items() for i, h in enumerate(rows)
            if h is not None and h != alone[i]]


MODELS = ["smollm2-135m-instruct-q4_1",  # Q4_1 layers, Q8_0 output
          "gemma-3-270m-q4_k_m",         # Q5_0, Q4_K (repacked by llama.cpp), Q6_K (tiled from 8 rows), Q8_0
          "smollm2-135m-instruct-q4_0",  # Q4_0 (repacked by llama.cpp)
          "smollm2-135m-instruct-q5_1"]  # Q5_1


@needs_invariance
@pytest.mark.parametrize("name", MODELS)
def test_a_tokens_logits_do_not_depend_on_the_batch_or_the_threads(name):
    ways = rows_by_way(models.resolve(name), "1")
    assert len(ways) == 17 and len(set(ways["alone, 2 threads"])) == 128  # real, distinct rows
    assert differing(ways) == []


@needs_invariance
def test_with_llama_cpps_own_kernels_the_batch_changes_the_bits():
    # What the test above guards against, so that it can fail: SPECGEN_KERNELS=0 is llama.cpp as it is.
    assert len(differing(rows_by_way(models.resolve("gemma-3-270m-q4_k_m"), "0"))) > 20


# Every product kernel with ggml's vec_dot arithmetic, attention through ggml's per-row loop.
PRODUCTS = "q8_0,q4_0,q4_1,q5_0,q5_1,q2_k,q3_k,q4_k,q5_k,q6_k,f16,f32"
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= cpu_flags()


@pytest.fixture(scope="module")
def retyped(tmp_path_factory):
    """smollm2 with the weight types no shipped model has, quantized by ggml from the F32 weights:
    `ffn_down` (the one matrix with rows of 256-value blocks) Q2_K, Q5_K and Q6_K by layer (no llama.cpp
    file type gives Q2_K to a matrix of these shapes: its Q2_K files make ffn_down Q3_K), the attention
    matrices F16, the feed-forward ones Q8_0; the token embedding (the output layer) stays F32."""
    path = tmp_path_factory.mktemp("retyped") / "smollm2-135m-instruct-retyped.gguf"
    types = {f"blk.{i}.ffn_down.": ("Q2_K", "Q5_K", "Q6_K")[i % 3] for i in range(30)}
    changed = tools.retype(models.resolve("smollm2-135m-instruct-f32"), path, {**types, "attn_": "F16", "ffn_": "Q8_0"})
    assert len(changed) == 210 and sum("ffn_down" in name for name in changed) == 30
    return path


def products_equal_ggmls(path):
    # SPECGEN_KERNELS=ggml: the same invariance through ggml's own vec_dot for every type (no repacking,
    # which would hand Q4_K and Q2_K to llama.cpp's repacked GEMV, itself rounded differently from vec_dot).
    ours = rows_by_way(path, PRODUCTS)
    assert len(set(ours["alone, 2 threads"])) == 128 and differing(ours) == []
    assert ours == rows_by_way(path, "ggml", "no-repack")


@needs_invariance
@pytest.mark.skipif(not X86_WITH_KERNELS, reason="specgen's kernels are built for x86-64 with AVX2, F16C and FMA")
@pytest.mark.parametrize("name", MODELS + [
    "smollm2-135m-instruct-f32",  # F32: every product, the output layer included
    "gemma-3-270m-q2_k",          # Q3_K (its attn_output and ffn_down), Q4_0, Q5_0
])
def test_specgens_product_kernels_equal_ggmls_one_row_code_bit_for_bit(name):
    products_equal_ggmls(models.resolve(name))


@needs_invariance
@pytest.mark.skipif(not X86_WITH_KERNELS, reason="specgen's kernels are built for x86-64 with AVX2, F16C and FMA")
def test_the_q2_k_q5_k_and_f16_kernels_equal_ggmls_one_row_code_bit_for_bit(retyped):
    products_equal_ggmls(retyped)


# SCRIPT's prompt prefilled as SCRIPT does, then its first 16 tokens decoded one at a time (2 threads),
# their logits saved to argv[2] (.npy).
LOGITS = SCRIPT.split("def decode(")[0] + r"""
import numpy as np
rows = []
for i, t in enumerate(toks[:16]):
    b = Batch()
    b.add(t, P + i, (0,), True)
    rows.append(np.array(ctx.decode(b)[0], dtype=np.float32))
np.save(sys.argv[2], np.stack(rows))
"""


@functools.lru_cache(maxsize=None)  # the tests below compare the same model's rows under several settings
def logits_by(name: str, kernels: str):
    """LOGITS's 16 rows of model `name` decoded with SPECGEN_KERNELS=kernels, in a child process."""
    import tempfile

    import numpy as np

    with tempfile.TemporaryDirectory(prefix="specgen-logits-") as tmp:
        out = f"{tmp}/rows.npy"
        done = subprocess.run([sys.executable, "-c", LOGITS, str(models.resolve(name)), out],
                              env=dict(os.environ, SPECGEN_KERNELS=kernels), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return np.load(out)


@needs_invariance
@pytest.mark.skipif(not X86_WITH_KERNELS, reason="specgen's kernels are built for x86-64 with AVX2, F16C and FMA")
@pytest.mark.parametrize("name", MODELS[:2])
def test_specgens_attention_moves_the_logits_no_more_than_llama_cpps_own_kernels_do(name):
    # specgen's attention (native/attention.h) keeps the query and the weighted sum of V in F32 where
    # ggml's per-row loop rounds both to F16: its bits differ from that loop's (so the kernel is really
    # in use), by rounding only, which 30 layers of a 4-bit model amplify. The yardstick is llama.cpp as
    # it is (SPECGEN_KERNELS=0: its one-token attention split over threads, its repacked products),
    # against the same loop. Measured (2026-11-27, AMD EPYC, AVX-512), the largest logit moved per row:
    # specgen's attention median 0.55 (smollm2) and 0.87 (gemma), llama.cpp's 0.57 and 0.93, on logits
    # spread over 30-50; the argmax stayed on 16/16 and 16/16 rows, llama.cpp's on 15/16 and 14/16.
    import numpy as np

    loop = logits_by(name, PRODUCTS)
    ours = np.abs(logits_by(name, PRODUCTS + ",attention") - loop).max(axis=1)
    theirs = np.abs(logits_by(name, "0") - loop).max(axis=1)
    assert len(ours) == 16 and (ours > 0).all(), "specgen's attention gave ggml's bits: is it built in and on?"
    assert np.median(ours) <= 1.5 * np.median(theirs), (ours, theirs)
    assert (ours < 0.1 * (loop.max(axis=1) - loop.min(axis=1))).all(), ours


@needs_invariance
@pytest.mark.skipif(not X86_WITH_KERNELS, reason="specgen's kernels are built for x86-64 with AVX2, F16C and FMA")
@pytest.mark.parametrize("name, layout", [("smollm2-135m-instruct-q4_1", "q4_1x16"),
                                          ("smollm2-135m-instruct-q4_0", "q4_0x16"),
                                          ("smollm2-135m-instruct-q5_1", "q5_1x16"),
                                          ("smollm2-135m-instruct-q5_k_m", "q5_1x16,q5_kx16"),
                                          ("gemma-3-270m-q2_k", "q3_kx16")])
def test_specgens_packed_arithmetic_moves_the_logits_about_as_far_as_llama_cpps_own_kernels_do(name, layout):
    # Q4_1, Q4_0, Q5_1, Q5_K and Q3_K weights repacked into specgen's layouts (native/packed_q4_1.h,
    # packed_q4_0.h, packed_q5_1.h, packed_q5_k.h, packed_q3_k.h: one integer sum per block, the scales
    # applied once; smollm2 Q5_K_M's Q5_1 and Q5_K matrices, its Q6_K left on vec_dot; gemma-3-270m-q2_k's
    # Q3_K, its Q4_0 and Q5_0 left on vec_dot) round apart from ggml's
    # eight-lane vec_dot by summation order only. Their bits must differ from vec_dot's (so the layout
    # is built in and on), about as far as llama.cpp's own kernels move them from vec_dot (for Q4_0 its
    # own repacked GEMV and GEMM), and keep the argmax about as often. Measured (2026-11-29, AMD EPYC,
    # AVX-512) on these 16 rows, the largest logit moved per row, specgen's against llama.cpp's own:
    # Q4_1 median 0.49 (max 1.14) against 0.56 (max 1.09), argmax kept on 16/16 and 15/16 rows; Q4_0
    # 0.62 (0.87) against 0.63 (0.90), 15/16 and 15/16; Q5_1 0.69 (1.19) against 0.64 (0.96), 16/16
    # and 16/16; Q5_K_M (Q5_1 and Q5_K together) 0.89 (1.11) against 0.75 (1.05), 15/16 and 15/16;
    # on logits spread over ~32-35; gemma-3-270m-q2_k's Q3_K 1.28 (1.55) against 1.13 (1.78), 15/16
    # and 15/16, on logits spread over ~45. An AVX2 build on the same CPU (specgen's bits the same,
    # vec_dot's and llama.cpp's their AVX2 ones): Q4_0 0.56 against 0.53, 14/16 and 14/16; Q5_1 0.57
    # against 0.51, 15/16 and 16/16; Q5_K_M 0.77 against 0.83, 14/16 and 16/16; Q3_K 1.05 against
    # 1.29, 15/16 and 14/16.
    import numpy as np

    vec_dot = logits_by(name, PRODUCTS)
    packed, stock = logits_by(name, f"{PRODUCTS},{layout}"), logits_by(name, "0")
    ours, theirs = np.abs(packed - vec_dot).max(axis=1), np.abs(stock - vec_dot).max(axis=1)
    assert len(ours) == 16 and (ours > 0).all(), f"{layout} gave vec_dot's bits: is it built in and on?"
    assert np.median(ours) <= 1.5 * np.median(theirs), (ours, theirs)  # the same order (llama.cpp's own moves by CPU)
    # near ties flip either way (a broken kernel would keep few): within two rows of llama.cpp's own
    kept = lambda rows: int((rows.argmax(axis=1) == vec_dot.argmax(axis=1)).sum())  # noqa: E731
    assert kept(packed) >= kept(stock) - 2, (kept(packed), kept(stock))


@needs_invariance
@pytest.mark.skipif(not X86_WITH_KERNELS, reason="specgen's kernels are built for x86-64 with AVX2, F16C and FMA")
def test_specgens_q8_0_arithmetic_reaches_a_tied_output_layer_and_rounds_only():
    # smollm2's output matrix is its Q8_0 embedding matrix, which llama.cpp loads a second time for
    # its products: with q8_0x16 on (native/packed_q8_0.h: one integer sum per block, the scales
    # applied once) that copy is repacked, and only the output layer's summation order changes (the
    # Q4_1 body stays on vec_dot's kernels in both runs). So the bits differ from vec_dot's on every
    # row (the layout is really in use), by float rounding alone, and no argmax moves. Measured
    # (2026-11-29, AMD EPYC, AVX-512): the largest logit moved 6e-6 to 9e-6 per row, on logits spread
    # over 30-41.
    import numpy as np

    name = "smollm2-135m-instruct-q4_1"
    vec_dot, packed = logits_by(name, PRODUCTS), logits_by(name, PRODUCTS + ",q8_0x16")
    moved, spread = np.abs(packed - vec_dot).max(axis=1), vec_dot.max(axis=1) - vec_dot.min(axis=1)
    assert len(moved) == 16 and (moved > 0).all(), "specgen's Q8_0 arithmetic gave vec_dot's bits: is it on?"
    assert (moved < 1e-4 * spread).all(), (moved, spread)
    assert (packed.argmax(axis=1) == vec_dot.argmax(axis=1)).all(), (packed.argmax(axis=1), vec_dot.argmax(axis=1))


@needs_invariance
@pytest.mark.skipif(not X86_WITH_KERNELS, reason="specgen's kernels are built for x86-64 with AVX2, F16C and FMA")
def test_specgens_k_quant_arithmetic_moves_the_logits_no_more_than_llama_cpps_own_kernels_do():
    # gemma Q4_K_M's Q4_K (attn_output, half of ffn_down) and Q6_K (the other half) weights repacked
    # into specgen's layouts (native/packed_q4_k.h, packed_q6_k.h: one integer sum per super-block, the
    # scales applied once) round apart from ggml's vec_dot by summation order only. Each layout alone
    # moves every row's bits (each is really in use); both together move the logits about as far as
    # llama.cpp's own kernels move them from vec_dot (30 layers of rounding, amplified), and keep the
    # argmax about as often as they do (one row of 16 either way: near-ties differ by CPU). Measured (2026-11-29, AMD EPYC, AVX-512), the largest logit
    # moved per row: q4_kx16 alone median 0.86, q6_kx16 alone 0.83, both 0.86 (max 1.91); llama.cpp's
    # own 0.93 (max 1.72), on logits spread over ~42; the argmax stayed on 16/16 rows, llama.cpp's on
    # 14/16. In an AVX2 build on the same CPU: both 0.91, llama.cpp's 0.97; argmax 14/16 and 13/16.
    import numpy as np

    name = "gemma-3-270m-q4_k_m"
    vec_dot, stock = logits_by(name, PRODUCTS), logits_by(name, "0")
    for layout in ("q4_kx16", "q6_kx16"):
        alone = np.abs(logits_by(name, f"{PRODUCTS},{layout}") - vec_dot).max(axis=1)
        assert len(alone) == 16 and (alone > 0).all(), f"{layout} gave vec_dot's bits: is it built in and on?"
    packed = logits_by(name, PRODUCTS + ",q4_kx16,q6_kx16")
    ours, theirs = np.abs(packed - vec_dot).max(axis=1), np.abs(stock - vec_dot).max(axis=1)
    assert np.median(ours) <= 1.25 * np.median(theirs), (ours, theirs)
    kept = lambda rows: int((rows.argmax(axis=1) == vec_dot.argmax(axis=1)).sum())  # noqa: E731
    assert kept(packed) >= kept(stock) - 1, (kept(packed), kept(stock))


@needs_invariance
@pytest.mark.skipif(not (X86_WITH_KERNELS and AVX512), reason="specgen's F32 arithmetic is AVX-512 code (AVX2 keeps ggml's)")
def test_specgens_f32_arithmetic_is_batch_invariant_and_moves_the_logits_by_rounding_only():
    # F32 weights through specgen's 16-lane arithmetic (native/few_float.h, `lanes`), every product of
    # smollm2's F32 copy, the output layer included: the same bits alone, in any batch and with either
    # thread count; bits unlike ggml's vec_dot (so the kernel is in use) by F32 rounding only: it moves
    # no argmax, and the logits less than llama.cpp as it ships moves them from vec_dot. Measured
    # (2026-11-29, AMD EPYC, AVX-512), the largest logit moved per row: median 0.010 (max 0.023),
    # llama.cpp's own 0.077 (max 0.099), on logits spread over ~34; argmax 16/16 for both.
    import numpy as np

    name = "smollm2-135m-instruct-f32"
    ours = rows_by_way(models.resolve(name), PRODUCTS + ",f32x16")
    assert len(set(ours["alone, 2 threads"])) == 128 and differing(ours) == []
    assert set(ours["alone, 2 threads"]).isdisjoint(rows_by_way(models.resolve(name), PRODUCTS)["alone, 2 threads"])
    vec_dot, lanes, stock = logits_by(name, PRODUCTS), logits_by(name, PRODUCTS + ",f32x16"), logits_by(name, "0")
    moved, theirs = np.abs(lanes - vec_dot).max(axis=1), np.abs(stock - vec_dot).max(axis=1)
    assert (moved > 0).all() and (lanes.argmax(axis=1) == vec_dot.argmax(axis=1)).all(), moved
    assert np.median(moved) <= np.median(theirs), (moved, theirs)


@needs_invariance
@pytest.mark.skipif(not X86_WITH_KERNELS, reason="specgen's kernels are built for x86-64 with AVX2, F16C and FMA")
def test_the_build_names_its_kernels_for_this_cpu():
    info = tools.build_info().system_info
    isa = "avx512vnni" if AVX512 else "avx2"
    names = PRODUCTS.replace("f16,f32", "f16x16,f32x16,f16,f32" if AVX512 else "f16,f32").replace(",", " ")
    assert f"SPECGEN_KERNELS = {isa}: {names} q4_0x16 q4_1x16 q5_0x16 q5_1x16 q8_0x16 q3_kx16 q4_kx16 q5_kx16 q6_kx16 |" in info, info
    assert "SPECGEN_ATTENTION = rows |" in info, info
