// specgen: Q4_1 weights repacked at load, 16 rows interleaved, and specgen's own arithmetic for them.
//
// Why: ggml's one-column Q4_1 arithmetic (vec_dot) keeps eight float lanes per row and pays a
// conversion, a multiply and a fused multiply-add per block, row and column; at a few columns that
// float work, not the integer products, is most of a decode's cost. Here a block's 32 products of a
// row and a column are summed as one integer, and the scales are applied once per block:
//
//   for each block b, in order:  acc = fma(float(isum_b), d_b * dy_b, acc)
//                                acc = fma(m_b, s_b, acc)
//
// per (row, column), where isum_b is the exact integer sum of the block's 32 code x byte products,
// d_b and m_b the row's scale and minimum, dy_b and s_b the column's Q8_1 scale and d*sum (every
// product of two fp16 values is exact in float). Nothing in it depends on the number of columns, a
// column's place in the batch, the thread count or the instruction set: AVX2 and AVX-512 give the
// same bits, and so do a prompt read in batches of any size and one token decoded alone (the prompt
// cache's split no longer matters for these weights). It rounds differently from ggml's vec_dot (by
// one summation order); the distance to stock llama.cpp is measured in docs/screening-and-kernels.md.
//
// Layout: llama.cpp's repack buffer (the same bytes as the Q4_1 tensor) holds, per group of 16 rows
// and per block, the 16 scales, the 16 minimums (fp16) and the 16 rows' 16 code bytes interleaved 4
// bytes at a time: qs[64 t + 4 r + b] = row r's byte 4 t + b (low nibble: code 4 t + b, high nibble:
// code 16 + 4 t + b). One 64-byte load then gives, per 32-bit lane, one row's four codes, so a
// vpdpbusd (or vpmaddubsw) against the column's four bytes broadcast works on 16 (8) rows at once.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, where
// packed_traits.h offers it to llama.cpp's repack buffer for 2-D Q4_1 weights. It needs only a C++17
// compiler and <immintrin.h> (tests/test_packed_kernel.py compiles it alone, for AVX2 and AVX-512,
// against a scalar statement of the arithmetic above).
#pragma once

#include "packed_common.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECGEN_PACKED 1

namespace specgen_packed {

using specgen_packed_common::ROWS;
using specgen_packed_common::QK;
using specgen_packed_common::fp16;
using specgen_packed_common::fetch_ahead;
using specgen_packed_common::four256;
#if defined(SPECGEN_PACKED_VNNI)
using specgen_packed_common::dot512;
#endif

// ggml's blocks, as stored (fp16 values as their bits): a weight row's and a quantized column's.
struct row_q4_1 { uint16_t d, m; uint8_t qs[QK / 2]; };
struct column_q8_1 { uint16_t d, s; int8_t qs[QK]; };
static_assert(sizeof(row_q4_1) == 20 && sizeof(column_q8_1) == 36, "ggml's Q4_1 and Q8_1 blocks");

struct block_q4_1x16 {
    uint16_t d[ROWS];
    uint16_t m[ROWS];
    uint8_t qs[ROWS * QK / 2];
};
static_assert(sizeof(block_q4_1x16) == ROWS * sizeof(row_q4_1), "the packed group fills the rows' bytes");

// One group of 16 rows times NC columns: out[j][r] for r in 0..15.
#if defined(SPECGEN_PACKED_VNNI)
constexpr int COLUMNS = 8;  // columns per pass over a group: 8 accumulators, 8 unpacked code registers

template <int NC>
static inline void group(int64_t nb, const block_q4_1x16 * w, const column_q8_1 * const * y, float * const * out) {
    __m512 acc[NC];
    for (int j = 0; j < NC; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t l = 0; l < nb; l++) {
        const block_q4_1x16 & b = w[l];
        fetch_ahead(&w[l]);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.d));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.m));
        __m512i v[8];
        specgen_packed_common::nibbles512(b.qs, v);
#pragma GCC unroll 8  // whole, so that acc[] stays in registers (GCC leaves 8 iterations a loop over memory)
        for (int j = 0; j < NC; j++) {
            const column_q8_1 & c = y[j][l];
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
static inline void group(int64_t nb, const block_q4_1x16 * w, const column_q8_1 * const * y, float * const * out) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {  // rows 8h .. 8h+7: 32 bytes of each 64
        __m256 acc[NC];
        for (int j = 0; j < NC; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t l = 0; l < nb; l++) {
            const block_q4_1x16 & b = w[l];
            if (h == 0) {
                fetch_ahead(&w[l]);
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.d + 8 * h)));
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.m + 8 * h)));
            __m256i v[8];
            specgen_packed_common::nibbles256(b.qs, h, v);
#pragma GCC unroll 4
            for (int j = 0; j < NC; j++) {
                const column_q8_1 & c = y[j][l];
                // pairs of products in 16 bits: |code| <= 15, |byte| <= 127, eight pairs <= 30480
                __m256i p = _mm256_maddubs_epi16(v[0], four256(c, 0));
                for (int t = 1; t < 8; t++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(v[t], four256(c, t)));
                const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                acc[j] = _mm256_fmadd_ps(isum, _mm256_mul_ps(d, _mm256_set1_ps(fp16(c.d))), acc[j]);
                acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(fp16(c.s)), acc[j]);
            }
        }
        for (int j = 0; j < NC; j++) _mm256_storeu_ps(out[j] + 8 * h, acc[j]);
    }
}
#endif

// out[c][row] for the groups g0..g1 of the weights and every column c (Q8_1 rows, `row_bytes` apart).
static inline void matmul(int64_t nb, const block_q4_1x16 * w, int64_t g0, int64_t g1, const char * cols,
                          size_t row_bytes, int64_t n, float * dst, int64_t ldc) {
    specgen_packed_common::over_groups<COLUMNS, column_q8_1>(g0, g1, cols, row_bytes, n, dst, ldc,
        [&](int64_t g, int64_t, int nc, const column_q8_1 * const * y, float * const * out) {
            specgen_packed_common::with_columns<COLUMNS>(nc, [&](auto N) { group<decltype(N)::value>(nb, w + g * nb, y, out); });
        });
}

// Weights rows x (nb blocks) of Q4_1, row after row, into rows / 16 groups of packed blocks.
static inline void pack(const row_q4_1 * src, int64_t rows, int64_t nb, block_q4_1x16 * dst) {
    for (int64_t g = 0; g < rows / ROWS; g++) {
        for (int64_t l = 0; l < nb; l++) {
            block_q4_1x16 & out = dst[g * nb + l];
            for (int64_t r = 0; r < ROWS; r++) {
                const row_q4_1 & in = src[(g * ROWS + r) * nb + l];
                out.d[r] = in.d;
                out.m[r] = in.m;
                specgen_packed_common::interleave(out.qs, r, in.qs);
            }
        }
    }
}

}  // namespace specgen_packed

#endif  // AVX2, F16C, FMA
