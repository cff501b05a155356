"""specgen's Q8_0 kernel in llama.cpp (specgen/native/q8_0_few_columns.h): present in the build, and
giving the same logits, bit for bit, as llama.cpp's own kernels (vec_dot for one row, tinyBLAS for
more), so that it changes how fast a verification batch runs and nothing else."""

import json
import os
import platform
import subprocess
import sys

import pytest

from specgen.llama import tools
from specgen.host import cpu_flags

pytestmark = pytest.mark.real

X86_WITH_KERNEL = platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "f16c", "fma"} <= cpu_flags()

# Decodes a prompt, then one row and batches of rows with logits on every row; prints each row's
# sha256 (bit-identical rows, equal hashes) and, for the batch of 2, what its first row holds.
SCRIPT = """
import hashlib, json, sys
import numpy as np
from specgen.llama.backend import LlamaModel
from specgen.core.protocol import Batch
model = LlamaModel(sys.argv[1])
ctx = model.new_context(512, n_seq_max=1)
toks = model.tokenize("The quick brown fox jumps over the lazy dog. It was the best of times,", add_special=True)
b = Batch()
for i, t in enumerate(toks):
    b.add(t, i, (0,), i == len(toks) - 1)
ctx.decode(b)
out = {}
for rows in (1, 2, 5, 16, 40, 100):
    b = Batch()
    for i in range(rows):
        b.add(toks[i % len(toks)], len(toks) + i, (0,), True)
    logits = ctx.decode(b)
    out[rows] = [hashlib.sha256(logits[i].tobytes()).hexdigest() for i in range(rows)]
    if rows == 2:
        first = {"size": int(logits[0].size), "finite": bool(np.isfinite(logits[0]).all())}
    ctx.seq_rm(0, len(toks), -1)
print(json.dumps({"rows": out, "first": first}))
"""


def logits_with_kernel(path, on: bool) -> dict:
    env = dict(os.environ, SPECGEN_Q8_0="1" if on else "0")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.skipif(not X86_WITH_KERNEL, reason="the kernel is built for x86-64 with AVX2, F16C and FMA")
def test_the_build_carries_the_kernel_for_this_cpu():
    info = tools.build_info().system_info
    isa = "avx512vnni" if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= cpu_flags() else "avx2"
    assert f"SPECGEN_Q8_0 = {isa}" in info, info


@pytest.mark.skipif(not X86_WITH_KERNEL, reason="the kernel is built for x86-64 with AVX2, F16C and FMA")
def test_logits_are_bit_identical_with_and_without_the_kernel(gemma_path):
    # gemma-3-270m Q4_K_M: a 262,144 x 640 Q8_0 output layer (its token embeddings).
    on, off = logits_with_kernel(gemma_path, True), logits_with_kernel(gemma_path, False)
    assert on["rows"].keys() == off["rows"].keys() == {"1", "2", "5", "16", "40", "100"}
    for rows in on["rows"]:
        for i, (a, b) in enumerate(zip(on["rows"][rows], off["rows"][rows])):
            assert a == b, f"batch of {rows}, row {i}: logits differ"
    # Not a vacuous comparison: the rows are real, distinct logits.
    assert on["first"] == {"size": 262144, "finite": True}
    assert on["rows"]["2"][0] != on["rows"]["2"][1]
