"""specgen's own arithmetic for packed weights (specgen/llama/native/packed_*.h), compiled alone and
checked bit for bit.

Each header's kernel part is plain C++ over <immintrin.h>. A small program per weight type packs random
weights, multiplies them by random quantized columns in batches of 1 to 130 columns, split over
"threads" by groups of rows, and compares every result with a scalar statement of the arithmetic the
header documents:
  Q4_1 x Q8_1  per block the exact integer sum of code * y, then fma(isum, d * dy, acc), fma(m, s, acc)
  Q4_0 x Q8_0  per block the exact integer sum of (code - 8) * y, then fma(isum, d * dy, acc); some
               blocks hold the extreme codes (all 15, all 0) and some columns the extreme bytes (all
               +127, all -127, -128); included between packed_q4_1.h and packed_q5_0.h (the three share
               packed_common.h's interleaved 4-bit codes).
  Q5_0 x Q8_0  per block the exact integer sum of (code - 16) * y, then fma(isum, d * dy, acc); some
               blocks hold the extreme codes (all 31, all 0) and some columns the extreme bytes (all
               +127, all -127, -128), so that a 16-bit partial sum that could overflow would show; the
               program includes packed_q4_1.h first, as repack.cpp does, so the headers coexist.
  Q5_1 x Q8_1  per block the exact integer sum of code * y (five-bit codes, Q5_0's layout), then
               fma(isum, d * dy, acc), fma(m, s, acc); extreme codes and bytes as for Q5_0; all four
               4- and 5-bit headers included.
  Q8_0 x Q8_0  per block the exact integer sum of w * y, then fma(isum, d * dy, acc); some blocks hold
               the extreme bytes (all -128, all +127) and some columns all +127 or all -127 (ggml's
               quantize_row_q8_0 never writes -128 into a column); all three headers included.
  Q4_K x Q8_K  per super-block the exact integers sum_c sc_c * sum_i code * y and sum_c m_c * sum_i y
               (ggml's 6-bit scales and mins, decoded as its get_scale_min_k4 does), then fma(isum, d *
               dy, acc), fma(-msum, dmin * dy, acc); some blocks have every code 15 with every scale and
               min 63, some columns are all -128 or all +127 (the largest sums); all four headers.
  Q5_K x Q8_K  as Q4_K with five-bit codes (the fifth bit from ggml's qh, as its dequantize_row_q5_K
               reads it); some blocks every code 31 with every scale and min 63; packed_q5_k.h uses
               packed_q4_k.h's product, included with every other header.
  Q3_K x Q8_K  per super-block the exact integer sum_g s_g * sum_i (code - 4) * y over the 16-value
               groups (scales and codes read as ggml's dequantize_row_q3_K reads them), then fma(isum,
               d * dy, acc); some blocks every code 7 with every scale -32, some every code 0 with every
               scale 31; packed_q3_k.h uses packed_q6_k.h's product.
  Q6_K x Q8_K  per super-block the exact integer sum_g sc_g * (sum_i code * y - 32 * sum_i y) over the
               16-value groups (codes read as ggml's dequantize_row_q6_K reads them), then fma(isum,
               d * dy, acc); some blocks have every code 63 with every scale -128, some columns are all
               -128 or all +127; included after packed_q4_k.h (the two share packed_common.h's Q8_K block).
Compiled for AVX2 and, where this CPU has it, for AVX-512 VNNI: both must equal the scalar statement,
so they equal each other, which is what lets a prompt cache or a draft tree computed on one machine
mean the same on another."""

import platform
import shutil
import subprocess

import pytest

from specgen.host import cpu_flags
from specgen.llama.build import NATIVE

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64")
                                or not {"avx2", "fma", "f16c"} <= cpu_flags(),
                                reason="the kernel is x86-64 code for CPUs with AVX2, F16C and FMA")

CHECK = r"""
// Shared by the programs: multiply in batches of 1 to 130 columns (mul(n, out): every column of the
// batch, the row groups split over three "threads" as ggml splits them) and compare each result
// with the scalar statement ref(row, column), bit for bit; print counts and a hash of the bits.
template <typename Mul, typename Ref>
static int check(int64_t rows, Mul mul, Ref ref) {
    long mismatches = 0, checked = 0;
    uint64_t hash = 1469598103934665603ull;
    for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 130}) {
        std::vector<float> out(n * rows, NAN);
        mul(n, out.data());
        for (int64_t c = 0; c < n; c++) {
            for (int64_t r = 0; r < rows; r++) {
                const float want = ref(r, c), got = out[c * rows + r];
                checked++;
                if (memcmp(&want, &got, sizeof(float)) != 0) mismatches++;
                uint32_t bits;
                memcpy(&bits, &got, sizeof(bits));
                hash = (hash ^ bits) * 1099511628211ull;
            }
        }
    }
    printf("checked %ld mismatches %ld hash %016llx\n", checked, mismatches, (unsigned long long) hash);
    return mismatches != 0;
}

// The row groups of `rows` (16 a group) split over three "threads" as ggml splits them: part(g0, g1).
template <typename Part>
static void three_threads(int64_t rows, Part part) {
    const int64_t groups = rows / 16;
    for (int th = 0; th < 3; th++) part(groups * th / 3, groups * (th + 1) / 3);
}

// ggml's get_scale_min_k4 (Q4_K's and Q5_K's): chunk c's 6-bit scale and min from a row's twelve bytes.
[[maybe_unused]] static void scale_min(int c, const uint8_t * q, int & sc, int & m) {
    if (c < 4) {
        sc = q[c] & 63;
        m = q[c + 4] & 63;
    } else {
        sc = (q[c + 4] & 0xF) | ((q[c - 4] >> 6) << 4);
        m = (q[c + 4] >> 4) | ((q[c] >> 6) << 4);
    }
}

// Q8_K columns (C: float d, int8_t qs[256], int16_t bsums[16]): mostly random bytes, some blocks all
// -128 or all +127 (the largest sums), each block's 16-value sums as ggml's quantize_row_q8_K keeps them.
template <typename C>
static void fill_q8_k(std::vector<C> & y, std::mt19937 & rng) {
    std::uniform_real_distribution<float> scale(1e-3f, 4e-2f);
    std::uniform_int_distribution<int> q8(-128, 127), mode(0, 7);
    for (auto & c : y) {
        const int m = mode(rng);
        for (auto & q : c.qs) q = (int8_t) (m == 0 ? -128 : m == 1 ? 127 : q8(rng));
        for (int k = 0; k < 16; k++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += c.qs[16 * k + i];
            c.bsums[k] = (int16_t) s;
        }
        c.d = scale(rng);
    }
}
"""

PROGRAMS = {"q4_1": r"""
#include "packed_q4_1.h"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// CHECK: the shared harness (CHECK below)
using namespace specgen_packed;

#ifndef SPECGEN_PACKED
#error "the kernel part did not compile for this instruction set"
#endif

static float ref(const row_q4_1 * w, const column_q8_1 * y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t l = 0; l < nb; l++) {
        int32_t isum = 0;
        for (int i = 0; i < 16; i++) {
            isum += (w[l].qs[i] & 15) * y[l].qs[i] + (w[l].qs[i] >> 4) * y[l].qs[i + 16];
        }
        acc = std::fmaf((float) isum, fp16(w[l].d) * fp16(y[l].d), acc);
        acc = std::fmaf(fp16(w[l].m), fp16(y[l].s), acc);
    }
    return acc;
}

int main() {
    const int64_t rows = 64, nb = 48, n_max = 130;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> scale(1e-3f, 4e-2f);
    std::uniform_int_distribution<int> byte(0, 255), q8(-127, 127);
    std::vector<row_q4_1> w(rows * nb);
    for (auto & b : w) {
        b.d = _cvtss_sh(scale(rng), 0);
        b.m = _cvtss_sh(-8.0f * scale(rng), 0);
        for (auto & q : b.qs) q = (uint8_t) byte(rng);
    }
    std::vector<column_q8_1> y(n_max * nb);
    for (auto & c : y) {
        int sum = 0;
        for (auto & q : c.qs) { q = (int8_t) q8(rng); sum += q; }
        const float d = scale(rng);
        c.d = _cvtss_sh(d, 0);
        c.s = _cvtss_sh(d * sum, 0);
    }
    std::vector<block_q4_1x16> packed(rows / ROWS * nb);
    pack(w.data(), rows, nb, packed.data());
    return check(rows, [&](int64_t n, float * out) {
        three_threads(rows, [&](int64_t g0, int64_t g1) {
            matmul(nb, packed.data(), g0, g1, (const char *) y.data(),
                   nb * sizeof(column_q8_1), n, out, rows);
        });
    }, [&](int64_t r, int64_t c) { return ref(&w[r * nb], &y[c * nb], nb); });
}""",
            "q5_0": r"""
#include "packed_q4_1.h"
#include "packed_q5_0.h"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// CHECK: the shared harness (CHECK below)
using namespace specgen_packed_q5_0;

#ifndef SPECGEN_PACKED_Q5_0
#error "the kernel part did not compile for this instruction set"
#endif

static float ref(const row_q5_0 * w, const column_q8_0 * y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t l = 0; l < nb; l++) {
        uint32_t qh;
        memcpy(&qh, w[l].qh, sizeof(qh));
        int32_t isum = 0;
        for (int i = 0; i < 16; i++) {
            const int lo = (w[l].qs[i] & 15) | (int) ((qh >> i) & 1) << 4;
            const int hi = (w[l].qs[i] >> 4) | (int) ((qh >> (i + 16)) & 1) << 4;
            isum += (lo - 16) * y[l].qs[i] + (hi - 16) * y[l].qs[i + 16];
        }
        acc = std::fmaf((float) isum, fp16(w[l].d) * fp16(y[l].d), acc);
    }
    return acc;
}

int main() {
    const int64_t rows = 64, nb = 48, n_max = 130;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> scale(1e-3f, 4e-2f);
    std::uniform_int_distribution<int> byte(0, 255), q8(-127, 127), mode(0, 7);
    std::vector<row_q5_0> w(rows * nb);
    for (auto & b : w) {
        b.d = _cvtss_sh(scale(rng), 0);
        const int m = mode(rng);  // mostly random codes; some blocks all 31, some all 0
        for (auto & q : b.qs) q = m == 0 ? 0xFF : m == 1 ? 0x00 : (uint8_t) byte(rng);
        for (auto & q : b.qh) q = m == 0 ? 0xFF : m == 1 ? 0x00 : (uint8_t) byte(rng);
    }
    std::vector<column_q8_0> y(n_max * nb);
    for (auto & c : y) {
        const int m = mode(rng);  // mostly random bytes; some blocks all +127, all -127 or all -128
        for (auto & q : c.qs) q = (int8_t) (m == 0 ? 127 : m == 1 ? -127 : m == 2 ? -128 : q8(rng));
        c.d = _cvtss_sh(scale(rng), 0);
    }
    std::vector<int32_t> offs(n_max * nb);
    for (int64_t c = 0; c < n_max; c++) offsets(&y[c * nb], nb, &offs[c * nb]);
    std::vector<block_q5_0x16> packed(rows / ROWS * nb);
    pack(w.data(), rows, nb, packed.data());
    return check(rows, [&](int64_t n, float * out) {
        three_threads(rows, [&](int64_t g0, int64_t g1) {
            matmul(nb, packed.data(), g0, g1, (const char *) y.data(),
                   nb * sizeof(column_q8_0), offs.data(), n, out, rows);
        });
    }, [&](int64_t r, int64_t c) { return ref(&w[r * nb], &y[c * nb], nb); });
}""",
            "q8_0": r"""
#include "packed_q4_1.h"
#include "packed_q5_0.h"
#include "packed_q8_0.h"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// CHECK: the shared harness (CHECK below)
using namespace specgen_packed_q8_0;

#ifndef SPECGEN_PACKED_Q8_0
#error "the kernel part did not compile for this instruction set"
#endif

static float ref(const row_q8_0 * w, const column_q8_0 * y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t l = 0; l < nb; l++) {
        int32_t isum = 0;
        for (int i = 0; i < QK; i++) isum += w[l].qs[i] * y[l].qs[i];
        acc = std::fmaf((float) isum, fp16(w[l].d) * fp16(y[l].d), acc);
    }
    return acc;
}

int main() {
    const int64_t rows = 64, nb = 48, n_max = 130;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> scale(1e-3f, 4e-2f);
    std::uniform_int_distribution<int> byte(-128, 127), q8(-127, 127), mode(0, 7);
    std::vector<row_q8_0> w(rows * nb);
    for (auto & b : w) {
        b.d = _cvtss_sh(scale(rng), 0);
        const int m = mode(rng);  // mostly random bytes; some blocks all -128, some all +127
        for (auto & q : b.qs) q = (int8_t) (m == 0 ? -128 : m == 1 ? 127 : byte(rng));
    }
    std::vector<column_q8_0> y(n_max * nb);
    for (auto & c : y) {
        const int m = mode(rng);  // mostly random bytes; some blocks all +127, some all -127
        for (auto & q : c.qs) q = (int8_t) (m == 0 ? 127 : m == 1 ? -127 : q8(rng));
        c.d = _cvtss_sh(scale(rng), 0);
    }
    std::vector<int32_t> offs(n_max * nb);
    for (int64_t c = 0; c < n_max; c++) offsets(&y[c * nb], nb, &offs[c * nb]);
    std::vector<block_q8_0x16> packed(rows / ROWS * nb);
    pack(w.data(), rows, nb, packed.data());
    return check(rows, [&](int64_t n, float * out) {
        three_threads(rows, [&](int64_t g0, int64_t g1) {
            matmul(nb, packed.data(), g0, g1, (const char *) y.data(),
                   nb * sizeof(column_q8_0), offs.data(), n, out, rows);
        });
    }, [&](int64_t r, int64_t c) { return ref(&w[r * nb], &y[c * nb], nb); });
}"""}
PROGRAMS["q4_0"] = r"""
#include "packed_q4_1.h"
#include "packed_q4_0.h"
#include "packed_q5_0.h"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// CHECK: the shared harness (CHECK below)
using namespace specgen_packed_q4_0;

#ifndef SPECGEN_PACKED_Q4_0
#error "the kernel part did not compile for this instruction set"
#endif

static float ref(const row_q4_0 * w, const column_q8_0 * y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t l = 0; l < nb; l++) {
        int32_t isum = 0;
        for (int i = 0; i < 16; i++) {
            isum += ((w[l].qs[i] & 15) - 8) * y[l].qs[i] + ((w[l].qs[i] >> 4) - 8) * y[l].qs[i + 16];
        }
        acc = std::fmaf((float) isum, fp16(w[l].d) * fp16(y[l].d), acc);
    }
    return acc;
}

int main() {
    const int64_t rows = 64, nb = 48, n_max = 130;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> scale(1e-3f, 4e-2f);
    std::uniform_int_distribution<int> byte(0, 255), q8(-127, 127), mode(0, 7);
    std::vector<row_q4_0> w(rows * nb);
    for (auto & b : w) {
        b.d = _cvtss_sh(scale(rng), 0);
        const int m = mode(rng);  // mostly random codes; some blocks all 15, some all 0
        for (auto & q : b.qs) q = m == 0 ? 0xFF : m == 1 ? 0x00 : (uint8_t) byte(rng);
    }
    std::vector<column_q8_0> y(n_max * nb);
    for (auto & c : y) {
        const int m = mode(rng);  // mostly random bytes; some blocks all +127, all -127 or all -128
        for (auto & q : c.qs) q = (int8_t) (m == 0 ? 127 : m == 1 ? -127 : m == 2 ? -128 : q8(rng));
        c.d = _cvtss_sh(scale(rng), 0);
    }
    std::vector<int32_t> offs(n_max * nb);
    for (int64_t c = 0; c < n_max; c++) offsets(&y[c * nb], nb, &offs[c * nb]);
    std::vector<block_q4_0x16> packed(rows / ROWS * nb);
    pack(w.data(), rows, nb, packed.data());
    return check(rows, [&](int64_t n, float * out) {
        three_threads(rows, [&](int64_t g0, int64_t g1) {
            matmul(nb, packed.data(), g0, g1, (const char *) y.data(),
                   nb * sizeof(column_q8_0), offs.data(), n, out, rows);
        });
    }, [&](int64_t r, int64_t c) { return ref(&w[r * nb], &y[c * nb], nb); });
}"""
PROGRAMS["q5_1"] = r"""
#include "packed_q4_1.h"
#include "packed_q4_0.h"
#include "packed_q5_0.h"
#include "packed_q5_1.h"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// CHECK: the shared harness (CHECK below)
using namespace specgen_packed_q5_1;

#ifndef SPECGEN_PACKED_Q5_1
#error "the kernel part did not compile for this instruction set"
#endif

static float ref(const row_q5_1 * w, const column_q8_1 * y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t l = 0; l < nb; l++) {
        uint32_t qh;
        memcpy(&qh, w[l].qh, sizeof(qh));
        int32_t isum = 0;
        for (int i = 0; i < 16; i++) {
            const int lo = (w[l].qs[i] & 15) | (int) ((qh >> i) & 1) << 4;
            const int hi = (w[l].qs[i] >> 4) | (int) ((qh >> (i + 16)) & 1) << 4;
            isum += lo * y[l].qs[i] + hi * y[l].qs[i + 16];
        }
        acc = std::fmaf((float) isum, fp16(w[l].d) * fp16(y[l].d), acc);
        acc = std::fmaf(fp16(w[l].m), fp16(y[l].s), acc);
    }
    return acc;
}

int main() {
    const int64_t rows = 64, nb = 48, n_max = 130;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> scale(1e-3f, 4e-2f);
    std::uniform_int_distribution<int> byte(0, 255), q8(-127, 127), mode(0, 7);
    std::vector<row_q5_1> w(rows * nb);
    for (auto & b : w) {
        b.d = _cvtss_sh(scale(rng), 0);
        b.m = _cvtss_sh(-16.0f * scale(rng), 0);
        const int m = mode(rng);  // mostly random codes; some blocks all 31, some all 0
        for (auto & q : b.qs) q = m == 0 ? 0xFF : m == 1 ? 0x00 : (uint8_t) byte(rng);
        for (auto & q : b.qh) q = m == 0 ? 0xFF : m == 1 ? 0x00 : (uint8_t) byte(rng);
    }
    std::vector<column_q8_1> y(n_max * nb);
    for (auto & c : y) {
        const int m = mode(rng);  // mostly random bytes; some blocks all +127, all -127 or all -128
        int sum = 0;
        for (auto & q : c.qs) { q = (int8_t) (m == 0 ? 127 : m == 1 ? -127 : m == 2 ? -128 : q8(rng)); sum += q; }
        const float d = scale(rng);
        c.d = _cvtss_sh(d, 0);
        c.s = _cvtss_sh(d * sum, 0);
    }
    std::vector<block_q5_1x16> packed(rows / ROWS * nb);
    pack(w.data(), rows, nb, packed.data());
    return check(rows, [&](int64_t n, float * out) {
        three_threads(rows, [&](int64_t g0, int64_t g1) {
            matmul(nb, packed.data(), g0, g1, (const char *) y.data(),
                   nb * sizeof(column_q8_1), n, out, rows);
        });
    }, [&](int64_t r, int64_t c) { return ref(&w[r * nb], &y[c * nb], nb); });
}"""
PROGRAMS["q4_k"] = r"""
#include "packed_q4_1.h"
#include "packed_q5_0.h"
#include "packed_q8_0.h"
#include "packed_q4_k.h"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// CHECK: the shared harness (CHECK below)
using namespace specgen_packed_q4_k;

#ifndef SPECGEN_PACKED_Q4_K
#error "the kernel part did not compile for this instruction set"
#endif

static float ref(const row_q4_K * w, const column_q8_K * y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t l = 0; l < nb; l++) {
        int32_t isum = 0, msum = 0;
        for (int c = 0; c < 8; c++) {
            int sc, m, dot = 0, sum = 0;
            scale_min(c, w[l].scales, sc, m);
            for (int i = 0; i < 32; i++) {
                const int code = c % 2 ? w[l].qs[32 * (c / 2) + i] >> 4 : w[l].qs[32 * (c / 2) + i] & 15;
                dot += code * y[l].qs[32 * c + i];
                sum += y[l].qs[32 * c + i];
            }
            isum += sc * dot;
            msum += m * sum;
        }
        acc = std::fmaf((float) isum, fp16(w[l].d) * y[l].d, acc);
        acc = std::fmaf(-(float) msum, fp16(w[l].dmin) * y[l].d, acc);
    }
    return acc;
}

int main() {
    const int64_t rows = 64, nb = 6, n_max = 130;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> scale(1e-3f, 4e-2f);
    std::uniform_int_distribution<int> byte(0, 255), mode(0, 7);
    std::vector<row_q4_K> w(rows * nb);
    for (auto & b : w) {
        b.d = _cvtss_sh(scale(rng), 0);
        b.dmin = _cvtss_sh(scale(rng), 0);
        const int m = mode(rng);  // mostly random; some blocks every code 15 with every scale and min 63
        for (auto & q : b.scales) q = (uint8_t) (m == 0 ? 255 : byte(rng));
        for (auto & q : b.qs) q = (uint8_t) (m == 0 ? 255 : byte(rng));
    }
    std::vector<column_q8_K> y(n_max * nb);
    fill_q8_k(y, rng);
    std::vector<int32_t> ex(n_max * nb * EXTRA);
    for (int64_t c = 0; c < n_max; c++) extras(&y[c * nb], nb, &ex[c * nb * EXTRA]);
    std::vector<block_q4_Kx16> packed(rows / ROWS * nb);
    pack(w.data(), rows, nb, packed.data());
    return check(rows, [&](int64_t n, float * out) {
        three_threads(rows, [&](int64_t g0, int64_t g1) {
            matmul(nb, packed.data(), g0, g1, (const char *) y.data(),
                   nb * sizeof(column_q8_K), ex.data(), n, out, rows);
        });
    }, [&](int64_t r, int64_t c) { return ref(&w[r * nb], &y[c * nb], nb); });
}"""
# Q5_K's program is Q4_K's with five-bit codes: its own header, block types and fifth bits (each
# replacement must happen, so that the two programs cannot drift apart unseen).
Q5_K_CHANGES = [
    ('#include "packed_q4_k.h"\n', '#include "packed_q4_k.h"\n#include "packed_q6_k.h"\n#include "packed_q5_k.h"\n'),
    ("using namespace specgen_packed_q4_k;", "using namespace specgen_packed_q5_k;\nusing specgen_packed_common::fp16;"),
    ("#ifndef SPECGEN_PACKED_Q4_K", "#ifndef SPECGEN_PACKED_Q5_K"),
    ("row_q4_K", "row_q5_K"), ("block_q4_Kx16", "block_q5_Kx16"),
    ("                const int code = c % 2 ? w[l].qs[32 * (c / 2) + i] >> 4 : w[l].qs[32 * (c / 2) + i] & 15;",
     "                const int low = c % 2 ? w[l].qs[32 * (c / 2) + i] >> 4 : w[l].qs[32 * (c / 2) + i] & 15;\n"
     "                const int code = low | ((w[l].qh[i] >> c) & 1) << 4;  // ggml's dequantize_row_q5_K"),
    ("every code 15 with every scale", "every code 31 with every scale"),
    ("        for (auto & q : b.qs) q = (uint8_t) (m == 0 ? 255 : byte(rng));",
     "        for (auto & q : b.qs) q = (uint8_t) (m == 0 ? 255 : byte(rng));\n"
     "        for (auto & q : b.qh) q = (uint8_t) (m == 0 ? 255 : byte(rng));"),
]
PROGRAMS["q5_k"] = PROGRAMS["q4_k"]
for old, changed in Q5_K_CHANGES:
    assert old in PROGRAMS["q5_k"], old
    PROGRAMS["q5_k"] = PROGRAMS["q5_k"].replace(old, changed)
PROGRAMS["q6_k"] = r"""
#include "packed_q4_k.h"
#include "packed_q6_k.h"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// CHECK: the shared harness (CHECK below)
using namespace specgen_packed_q6_k;

#ifndef SPECGEN_PACKED_Q6_K
#error "the kernel part did not compile for this instruction set"
#endif

static float ref(const row_q6_K * w, const column_q8_K * y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t l = 0; l < nb; l++) {
        int32_t dots[16] = {0}, sums[16] = {0};
        for (int n = 0; n < 2; n++) {  // ggml's dequantize_row_q6_K, value by value
            for (int i = 0; i < 32; i++) {
                const uint8_t * ql = w[l].ql + 64 * n, h = w[l].qh[32 * n + i];
                const int code[4] = { (ql[i] & 0xF) | ((h >> 0) & 3) << 4, (ql[i + 32] & 0xF) | ((h >> 2) & 3) << 4,
                                      (ql[i] >> 4) | ((h >> 4) & 3) << 4, (ql[i + 32] >> 4) | ((h >> 6) & 3) << 4 };
                for (int k = 0; k < 4; k++) {
                    const int v = 128 * n + 32 * k + i;
                    dots[v / 16] += code[k] * y[l].qs[v];
                    sums[v / 16] += y[l].qs[v];
                }
            }
        }
        int32_t isum = 0;
        for (int g = 0; g < 16; g++) isum += w[l].scales[g] * dots[g] - 32 * w[l].scales[g] * sums[g];
        acc = std::fmaf((float) isum, fp16(w[l].d) * y[l].d, acc);
    }
    return acc;
}

int main() {
    const int64_t rows = 64, nb = 6, n_max = 130;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> scale(1e-3f, 4e-2f);
    std::uniform_int_distribution<int> byte(0, 255), mode(0, 7);
    std::vector<row_q6_K> w(rows * nb);
    for (auto & b : w) {
        b.d = _cvtss_sh(scale(rng), 0);
        const int m = mode(rng);  // mostly random; some blocks every code 63 with every scale -128
        for (auto & q : b.scales) q = (int8_t) (m == 0 ? -128 : byte(rng) - 128);
        for (auto & q : b.ql) q = (uint8_t) (m == 0 ? 255 : byte(rng));
        for (auto & q : b.qh) q = (uint8_t) (m == 0 ? 255 : byte(rng));
    }
    std::vector<column_q8_K> y(n_max * nb);
    fill_q8_k(y, rng);
    std::vector<int32_t> ex(n_max * nb * EXTRA);
    for (int64_t c = 0; c < n_max; c++) extras(&y[c * nb], nb, &ex[c * nb * EXTRA]);
    std::vector<block_q6_Kx16> packed(rows / ROWS * nb);
    pack(w.data(), rows, nb, packed.data());
    return check(rows, [&](int64_t n, float * out) {
        three_threads(rows, [&](int64_t g0, int64_t g1) {
            matmul(nb, packed.data(), g0, g1, (const char *) y.data(),
                   nb * sizeof(column_q8_K), ex.data(), n, out, rows);
        });
    }, [&](int64_t r, int64_t c) { return ref(&w[r * nb], &y[c * nb], nb); });
}"""
PROGRAMS["q3_k"] = r"""
#include "packed_q4_k.h"
#include "packed_q5_k.h"
#include "packed_q6_k.h"
#include "packed_q3_k.h"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// CHECK: the shared harness (CHECK below)
using namespace specgen_packed_q3_k;
using specgen_packed_common::fp16;

#ifndef SPECGEN_PACKED_Q3_K
#error "the kernel part did not compile for this instruction set"
#endif

// ggml's dequantize_row_q3_K, as integers: group g's scale (6 bits, less 32) and value i's code.
static int scale(const row_q3_K & w, int g) {
    const int low = g < 8 ? w.scales[g % 8] & 15 : w.scales[g % 8] >> 4;
    return (low | ((w.scales[8 + g % 4] >> (2 * (g / 4))) & 3) << 4) - 32;
}
static int code(const row_q3_K & w, int i) {  // i = 128 n + 32 j + l: bits 2 j of qs[32 n + l], hmask[l] bit 4 n + j
    const int n = i / 128, j = i % 128 / 32, l = i % 32;
    return ((w.qs[32 * n + l] >> (2 * j)) & 3) | ((w.hmask[l] >> (4 * n + j)) & 1) << 2;
}

static float ref(const row_q3_K * w, const column_q8_K * y, int64_t nb) {
    float acc = 0.0f;
    for (int64_t l = 0; l < nb; l++) {
        int32_t isum = 0;
        for (int g = 0; g < 16; g++) {
            int dot = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) dot += (code(w[l], i) - 4) * y[l].qs[i];
            isum += scale(w[l], g) * dot;
        }
        acc = std::fmaf((float) isum, fp16(w[l].d) * y[l].d, acc);
    }
    return acc;
}

int main() {
    const int64_t rows = 64, nb = 6, n_max = 130;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> scale_dist(1e-3f, 4e-2f);
    std::uniform_int_distribution<int> byte(0, 255), mode(0, 7);
    std::vector<row_q3_K> w(rows * nb);
    for (auto & b : w) {
        b.d = _cvtss_sh(scale_dist(rng), 0);
        const int m = mode(rng);  // mostly random; some blocks every code 7 or 0, every scale -32 or 31
        for (auto & q : b.scales) q = (uint8_t) (m == 0 ? 0x00 : m == 1 ? 0xFF : byte(rng));
        for (auto & q : b.qs) q = (uint8_t) (m == 0 ? 0xFF : m == 1 ? 0x00 : byte(rng));
        for (auto & q : b.hmask) q = (uint8_t) (m == 0 ? 0xFF : m == 1 ? 0x00 : byte(rng));
    }
    std::vector<column_q8_K> y(n_max * nb);
    fill_q8_k(y, rng);
    std::vector<int32_t> ex(n_max * nb * EXTRA);
    for (int64_t c = 0; c < n_max; c++) extras(&y[c * nb], nb, &ex[c * nb * EXTRA]);
    std::vector<block_q3_Kx16> packed(rows / ROWS * nb);
    pack(w.data(), rows, nb, packed.data());
    return check(rows, [&](int64_t n, float * out) {
        three_threads(rows, [&](int64_t g0, int64_t g1) {
            matmul(nb, packed.data(), g0, g1, (const char *) y.data(),
                   nb * sizeof(column_q8_K), ex.data(), n, out, rows);
        });
    }, [&](int64_t r, int64_t c) { return ref(&w[r * nb], &y[c * nb], nb); });
}"""
PROGRAMS = {kind: text.replace("// CHECK: the shared harness (CHECK below)\n", CHECK) for kind, text in PROGRAMS.items()}

AVX2 = ["-mavx2", "-mfma", "-mf16c"]
AVX512 = AVX2 + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]


BATCHES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 130)  # the programs' batch sizes
VNNI = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}


def run(tmp_path, kind, flags, name):
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is needed to build llama-cpp-python, and to check its kernels"
    source = tmp_path / f"packed_{kind}.cpp"
    source.write_text(PROGRAMS[kind])
    binary = tmp_path / f"{kind}-{name}"
    subprocess.run([compiler, "-O2", "-std=c++17", "-ffp-contract=off", *flags, f"-I{NATIVE}", str(source), "-o",
                    str(binary)], check=True, capture_output=True, text=True)
    done = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    words = done.stdout.split()
    return dict(zip(words[::2], words[1::2]))


@pytest.mark.parametrize("kind", sorted(PROGRAMS))
def test_avx2_code_is_the_documented_arithmetic_at_every_batch_size(tmp_path, kind):
    result = run(tmp_path, kind, AVX2, "avx2")
    assert result["checked"] == str(64 * sum(BATCHES))
    assert result["mismatches"] == "0"


@pytest.mark.skipif(not VNNI <= cpu_flags(), reason="this CPU cannot run AVX-512 VNNI code")
@pytest.mark.parametrize("kind", sorted(PROGRAMS))
def test_avx512_code_gives_the_avx2_codes_bits(tmp_path, kind):
    wide, narrow = run(tmp_path, kind, AVX512, "avx512"), run(tmp_path, kind, AVX2, "avx2")
    assert wide["checked"] == str(64 * sum(BATCHES))
    assert wide["mismatches"] == "0" and wide["hash"] == narrow["hash"]
