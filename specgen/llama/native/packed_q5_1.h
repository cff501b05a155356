// specgen: Q5_1 weights repacked at load, 16 rows interleaved, and specgen's own arithmetic for them.
//
// Why: as for Q4_1 and Q5_0 (packed_q4_1.h, packed_q5_0.h), whose parts this kernel joins: Q5_0's
// five-bit codes (its layout of the fifth bits, its code vectors and its AVX2 pair sums) and Q4_1's
// minimum against a Q8_1 column. Per (row, column):
//
//   for each block b, in order:  isum_b = sum_i code_i * y_i                       (an exact integer)
//                                acc    = fma(float(isum_b), d_b * dy_b, acc)
//                                acc    = fma(m_b, s_b, acc)
//
// where code_i in 0..31 is the stored 5-bit code (the weight is d_b * code_i + m_b), y_i the column's
// Q8_1 bytes, d_b and m_b the row's scale and minimum, dy_b and s_b the column's Q8_1 scale and d*sum
// (every product of two fp16 values is exact in float, and |isum_b| <= 32 * 31 * 127 < 2^24 converts
// exactly). Nothing in it depends on the number of columns, a column's place in the batch, the thread
// count or the instruction set: AVX2 and AVX-512 give the same bits, and so do a prompt read in
// batches of any size and one token decoded alone. It rounds differently from ggml's vec_dot.
//
// Layout: llama.cpp's repack buffer (the same bytes as the Q5_1 tensor: 16 rows x 24 bytes = 384 per
// block) holds, per group of 16 rows and per block, the 16 scales and the 16 minimums (fp16), the 16
// rows' code bytes interleaved as in packed_q4_1.h, and the fifth bits in 64 bytes as packed_q5_0.h
// lays them out for the instruction set the build packs for.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, where
// packed_traits.h offers it to llama.cpp's repack buffer for 2-D Q5_1 weights. It needs only a C++17
// compiler and <immintrin.h> (tests/test_packed_kernel.py compiles it alone, for AVX2 and AVX-512,
// against a scalar statement of the arithmetic above).
#pragma once

#include "packed_common.h"
#include "packed_q5_0.h"

#if defined(SPECGEN_PACKED_Q5_0)
#define SPECGEN_PACKED_Q5_1 1

namespace specgen_packed_q5_1 {

using specgen_packed_common::ROWS;
using specgen_packed_common::QK;
using specgen_packed_common::fp16;
using specgen_packed_common::fetch_ahead;
#if defined(SPECGEN_PACKED_VNNI)
using specgen_packed_common::dot512;
#endif

// ggml's blocks, as stored (fp16 values as their bits): a weight row's and a quantized column's.
struct row_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct column_q8_1 { uint16_t d, s; int8_t qs[QK]; };
static_assert(sizeof(row_q5_1) == 24 && sizeof(column_q8_1) == 36, "ggml's Q5_1 and Q8_1 blocks");

struct block_q5_1x16 {
    uint16_t d[ROWS];
    uint16_t m[ROWS];
    uint8_t qs[ROWS * QK / 2];
    uint8_t qh[ROWS * QK / 8];
};
static_assert(sizeof(block_q5_1x16) == ROWS * sizeof(row_q5_1), "the packed group fills the rows' bytes");

#if defined(SPECGEN_PACKED_VNNI)
constexpr int COLUMNS = 8;  // columns per pass over a group: 8 accumulators, 8 code registers

// One group of 16 rows times NC columns: out[j][r] for r in 0..15.
template <int NC>
static inline void group(int64_t nb, const block_q5_1x16 * w, const column_q8_1 * const * y, float * const * out) {
    __m512 acc[NC];
    for (int j = 0; j < NC; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t l = 0; l < nb; l++) {
        const block_q5_1x16 & b = w[l];
        fetch_ahead(&w[l]);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.d));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.m));
        __m512i v[8];
        specgen_packed_q5_0::codes512(b.qs, b.qh, v);
#pragma GCC unroll 8  // whole, so that acc[] stays in registers (GCC leaves 8 iterations a loop over memory)
        for (int j = 0; j < NC; j++) {
            const column_q8_1 & c = y[j][l];
            // codes 0..31 times bytes -128..127: no saturation in vpdpbusd's 32-bit sums
            const __m512 isum = _mm512_cvtepi32_ps(dot512(_mm512_setzero_si512(), v, c));
            acc[j] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(fp16(c.d))), acc[j]);
            acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(fp16(c.s)), acc[j]);
        }
    }
    for (int j = 0; j < NC; j++) _mm512_storeu_ps(out[j], acc[j]);
}
#else
constexpr int COLUMNS = 4;  // 16 registers: 4 accumulators per half, the half's codes, scales

template <int NC>
static inline void group(int64_t nb, const block_q5_1x16 * w, const column_q8_1 * const * y, float * const * out) {
    for (int h = 0; h < 2; h++) {  // rows 8h .. 8h+7: 32 bytes of each 64
        __m256 acc[NC];
        for (int j = 0; j < NC; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t l = 0; l < nb; l++) {
            const block_q5_1x16 & b = w[l];
            if (h == 0) {  // the second half reads the group again from the cache
                fetch_ahead(&w[l]);
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.d + 8 * h)));
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.m + 8 * h)));
            __m256i v[8];
            specgen_packed_q5_0::codes256(b.qs, b.qh, h, v);
#pragma GCC unroll 4
            for (int j = 0; j < NC; j++) {
                const column_q8_1 & c = y[j][l];
                const __m256 isum = _mm256_cvtepi32_ps(specgen_packed_q5_0::dot256(v, c));
                acc[j] = _mm256_fmadd_ps(isum, _mm256_mul_ps(d, _mm256_set1_ps(fp16(c.d))), acc[j]);
                acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(fp16(c.s)), acc[j]);
            }
        }
        for (int j = 0; j < NC; j++) _mm256_storeu_ps(out[j] + 8 * h, acc[j]);
    }
}
#endif

// out[c][row] for the groups g0..g1 of the weights and every column c (Q8_1 rows, `row_bytes` apart).
static inline void matmul(int64_t nb, const block_q5_1x16 * w, int64_t g0, int64_t g1, const char * cols,
                          size_t row_bytes, int64_t n, float * dst, int64_t ldc) {
    specgen_packed_common::over_groups<COLUMNS, column_q8_1>(g0, g1, cols, row_bytes, n, dst, ldc,
        [&](int64_t g, int64_t, int nc, const column_q8_1 * const * y, float * const * out) {
            specgen_packed_common::with_columns<COLUMNS>(nc, [&](auto N) { group<decltype(N)::value>(nb, w + g * nb, y, out); });
        });
}

// Weights rows x (nb blocks) of Q5_1, row after row, into rows / 16 groups of packed blocks.
static inline void pack(const row_q5_1 * src, int64_t rows, int64_t nb, block_q5_1x16 * dst) {
    for (int64_t g = 0; g < rows / ROWS; g++) {
        for (int64_t l = 0; l < nb; l++) {
            block_q5_1x16 & out = dst[g * nb + l];
            memset(out.qh, 0, sizeof(out.qh));
            for (int64_t r = 0; r < ROWS; r++) {
                const row_q5_1 & in = src[(g * ROWS + r) * nb + l];
                out.d[r] = in.d;
                out.m[r] = in.m;
                specgen_packed_common::interleave(out.qs, r, in.qs);
                specgen_packed_q5_0::fifth_bits(out.qh, r, in.qh);
            }
        }
    }
}

}  // namespace specgen_packed_q5_1

#endif  // SPECGEN_PACKED_Q5_0
