"""specgen's own arithmetic for F32 and F16 weights on AVX-512 (few_float.h, namespace `lanes`),
compiled alone and checked bit for bit against a scalar statement of it.

Per (row, column): 16 lane sums, lane l taking the products of elements l, l + 16, l + 32, ... in order
by fused multiply-adds, then lanes l + (l + 8), l + (l + 4), l + (l + 2) and the last two added. The
program multiplies random rows (F32, and F16 widened exactly) by 1 to 130 random columns, the rows split
over three "threads" as ggml splits them, at the widths of the models' matrices (k = 576, 640, 1536,
2048) and the smallest (16), and compares every result with that statement. AVX2 hosts keep ggml's own
arithmetic (`floats`, checked against ggml on the real models in test_kernels.py)."""

import platform
import shutil
import subprocess

import pytest

from specgen.host import cpu_flags
from specgen.llama.build import NATIVE

AVX512 = ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64")
    or not {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"} <= cpu_flags(),
    reason="specgen's F32 arithmetic is AVX-512 code; AVX2 hosts use ggml's")

PROGRAM = r"""
#include "few_float.h"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#ifndef SPECGEN_FEW
#error "few_float.h did not compile for this instruction set"
#endif
using namespace specgen_few;

template <typename W> static float widen(W x);
template <> float widen<float>(float x) { return x; }
template <> float widen<uint16_t>(uint16_t x) { return _cvtsh_ss(x); }

template <typename W>
static float ref(int64_t k, const W * a, const W * y) {
    float lane[16] = {0};
    for (int64_t s = 0; s < k; s += 16)
        for (int l = 0; l < 16; l++) lane[l] = std::fmaf(widen(a[s + l]), widen(y[s + l]), lane[l]);
    for (int width = 8; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) lane[l] = lane[l] + lane[l + width];
    return lane[0];
}

template <typename W>
static void fill(std::vector<W> & v, std::mt19937 & rng, float spread) {
    std::uniform_real_distribution<float> u(-spread, spread);
    for (auto & x : v) {
        if constexpr (sizeof(W) == 4) x = u(rng); else x = _cvtss_sh(u(rng), 0);
    }
}

template <typename W>
static void check(const char * name, std::mt19937 & rng) {
    long checked = 0, mismatches = 0;
    uint64_t hash = 1469598103934665603ull;
    for (int64_t k : {16, 576, 640, 1536, 2048}) {
        const int64_t rows = 37;  // tiles of 8 and of 4 rows, and rows left over
        std::vector<W> a(rows * k), y(130 * k);
        fill(a, rng, 1.0f);
        fill(y, rng, 4.0f);
        for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 130}) {
            std::vector<float> out(n * rows, NAN);
            for (int th = 0; th < 3; th++)
                lanes::matmul<W>(n, k, a.data(), k, y.data(), k, out.data(), rows, rows * th / 3, rows * (th + 1) / 3);
            for (int64_t c = 0; c < n; c++)
                for (int64_t r = 0; r < rows; r++) {
                    const float want = ref(k, &a[r * k], &y[c * k]), got = out[c * rows + r];
                    checked++;
                    if (memcmp(&want, &got, sizeof(float)) != 0) mismatches++;
                    uint32_t bits;
                    memcpy(&bits, &got, sizeof(bits));
                    hash = (hash ^ bits) * 1099511628211ull;
                }
        }
    }
    printf("%s checked %ld mismatches %ld hash %016llx\n", name, checked, mismatches, (unsigned long long) hash);
}

int main() {
    std::mt19937 rng(7);
    check<float>("f32", rng);
    check<uint16_t>("f16", rng);
}
"""

BATCHES = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 130)


def test_avx512_f32_and_f16_products_are_the_documented_arithmetic_at_every_batch_size(tmp_path):
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is needed to build llama-cpp-python, and to check its kernels"
    source, binary = tmp_path / "lanes.cpp", tmp_path / "lanes"
    source.write_text(PROGRAM)
    built = subprocess.run([compiler, "-O2", "-std=c++17", "-ffp-contract=off", *AVX512, f"-I{NATIVE}", str(source),
                            "-o", str(binary)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    done = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()}
    for kind in ("f32", "f16"):
        words = dict(zip(lines[kind][::2], lines[kind][1::2]))
        assert words["checked"] == str(5 * 37 * sum(BATCHES)), words
        assert words["mismatches"] == "0", (kind, words)
