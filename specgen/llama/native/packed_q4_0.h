// specgen: Q4_0 weights repacked at load, 16 rows interleaved, and specgen's own arithmetic for them.
//
// Why: as for Q4_1 (packed_q4_1.h), and because llama.cpp itself repacks Q4_0 (its own interleaved
// GEMV/GEMM, which specgen's few-column kernel, reading ggml's layout, did not keep up with: a
// 512-token smollm2 Q4_0 prompt read at 0.82x llama-bench's speed, docs/serve.md). Here a block's 32
// products of a row and a column are summed as one integer, and the scale is applied once per block:
//
//   for each block b, in order:  isum_b = sum_i code_i * y_i - 8 * sum_i y_i     (exact integers)
//                                acc    = fma(float(isum_b), d_b * dy_b, acc)
//
// per (row, column), where code_i in 0..15 is the stored 4-bit code (the weight is d_b * (code_i - 8)),
// y_i the column's Q8_0 bytes, d_b the row's scale and dy_b the column's (the product of two fp16
// values is exact in float, and |isum_b| <= 32 * 8 * 128 < 2^24 converts exactly). sum_i y_i is
// computed once per column block (offsets() below), not once per row group. Nothing in it depends on
// the number of columns, a column's place in the batch, the thread count or the instruction set: AVX2
// and AVX-512 give the same bits, and so do a prompt read in batches of any size and one token decoded
// alone. It rounds differently from ggml's vec_dot (which converts every block's sum and keeps eight
// float lanes) and from llama.cpp's repacked GEMM (which sums the block in float).
//
// Layout: llama.cpp's repack buffer (the same bytes as the Q4_0 tensor: 16 rows x 18 bytes = 288 per
// block) holds, per group of 16 rows and per block, the 16 scales (fp16) and the 16 rows' 16 code
// bytes interleaved 4 bytes at a time as in packed_q4_1.h (qs[64 t + 4 r + b] = row r's byte 4 t + b:
// low nibble code 4 t + b, high nibble code 16 + 4 t + b).
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, where
// packed_traits.h offers it to llama.cpp's repack buffer for 2-D Q4_0 weights. It needs only a C++17
// compiler and <immintrin.h> (tests/test_packed_kernel.py compiles it alone, for AVX2 and AVX-512,
// against a scalar statement of the arithmetic above).
#pragma once

#include "packed_common.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECGEN_PACKED_Q4_0 1

namespace specgen_packed_q4_0 {

using specgen_packed_common::ROWS;
using specgen_packed_common::QK;
using specgen_packed_common::fp16;
using specgen_packed_common::fetch_ahead;
using specgen_packed_common::four256;
#if defined(SPECGEN_PACKED_VNNI)
using specgen_packed_common::dot512;
#endif

// ggml's blocks, as stored (fp16 values as their bits): a weight row's and a quantized column's.
struct row_q4_0 { uint16_t d; uint8_t qs[QK / 2]; };
struct column_q8_0 { uint16_t d; int8_t qs[QK]; };
static_assert(sizeof(row_q4_0) == 18 && sizeof(column_q8_0) == 34, "ggml's Q4_0 and Q8_0 blocks");

struct block_q4_0x16 {
    uint16_t d[ROWS];
    uint8_t qs[ROWS * QK / 2];
};
static_assert(sizeof(block_q4_0x16) == ROWS * sizeof(row_q4_0), "the packed group fills the rows' bytes");

// Per column block: -8 times the sum of its 32 bytes, the second term of isum (|.| <= 8 * 32 * 128).
static inline void offsets(const column_q8_0 * col, int64_t nb, int32_t * off) {
    specgen_packed_common::block_sums(col, nb, -8, off);
}

#if defined(SPECGEN_PACKED_VNNI)
constexpr int COLUMNS = 8;  // columns per pass over a group: 8 accumulators, 8 code registers

// One group of 16 rows times NC columns: out[j][r] for r in 0..15.
template <int NC>
static inline void group(int64_t nb, const block_q4_0x16 * w, const column_q8_0 * const * y,
                         const int32_t * const * off, float * const * out) {
    __m512 acc[NC];
    for (int j = 0; j < NC; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t l = 0; l < nb; l++) {
        const block_q4_0x16 & b = w[l];
        fetch_ahead(&w[l]);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.d));
        __m512i v[8];
        specgen_packed_common::nibbles512(b.qs, v);
#pragma GCC unroll 8  // whole, so that acc[] stays in registers (GCC leaves 8 iterations a loop over memory)
        for (int j = 0; j < NC; j++) {
            const column_q8_0 & c = y[j][l];
            // codes 0..15 times bytes -128..127: no saturation in vpdpbusd's 32-bit sums
            const __m512 isum = _mm512_cvtepi32_ps(dot512(_mm512_set1_epi32(off[j][l]), v, c));
            acc[j] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(fp16(c.d))), acc[j]);
        }
    }
    for (int j = 0; j < NC; j++) _mm512_storeu_ps(out[j], acc[j]);
}
#else
constexpr int COLUMNS = 4;  // 16 registers: 4 accumulators per half, the half's codes, scales

template <int NC>
static inline void group(int64_t nb, const block_q4_0x16 * w, const column_q8_0 * const * y,
                         const int32_t * const * off, float * const * out) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {  // rows 8h .. 8h+7: 32 bytes of each 64
        __m256 acc[NC];
        for (int j = 0; j < NC; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t l = 0; l < nb; l++) {
            const block_q4_0x16 & b = w[l];
            if (h == 0) {  // the second half reads the group again from the cache
                fetch_ahead(&w[l]);
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.d + 8 * h)));
            __m256i v[8];
            specgen_packed_common::nibbles256(b.qs, h, v);
#pragma GCC unroll 4
            for (int j = 0; j < NC; j++) {
                const column_q8_0 & c = y[j][l];
                // pairs of products in 16 bits: code <= 15, |byte| <= 128, eight pairs <= 30720
                __m256i p = _mm256_maddubs_epi16(v[0], four256(c, 0));
                for (int t = 1; t < 8; t++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(v[t], four256(c, t)));
                const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(p, ones), _mm256_set1_epi32(off[j][l]));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(fp16(c.d))), acc[j]);
            }
        }
        for (int j = 0; j < NC; j++) _mm256_storeu_ps(out[j] + 8 * h, acc[j]);
    }
}
#endif

// out[c][row] for the groups g0..g1 of the weights and every column c (Q8_0 rows, `row_bytes` apart;
// column c's offsets() at offs + c * nb).
static inline void matmul(int64_t nb, const block_q4_0x16 * w, int64_t g0, int64_t g1, const char * cols,
                          size_t row_bytes, const int32_t * offs, int64_t n, float * dst, int64_t ldc) {
    specgen_packed_common::over_groups_with_offsets<COLUMNS, column_q8_0>(nb, g0, g1, cols, row_bytes, offs, n, dst, ldc,
        [&](auto N, int64_t g, const column_q8_0 * const * y, const int32_t * const * off, float * const * out) {
            group<decltype(N)::value>(nb, w + g * nb, y, off, out);
        });
}

// Weights rows x (nb blocks) of Q4_0, row after row, into rows / 16 groups of packed blocks.
static inline void pack(const row_q4_0 * src, int64_t rows, int64_t nb, block_q4_0x16 * dst) {
    for (int64_t g = 0; g < rows / ROWS; g++) {
        for (int64_t l = 0; l < nb; l++) {
            block_q4_0x16 & out = dst[g * nb + l];
            for (int64_t r = 0; r < ROWS; r++) {
                const row_q4_0 & in = src[(g * ROWS + r) * nb + l];
                out.d[r] = in.d;
                specgen_packed_common::interleave(out.qs, r, in.qs);
            }
        }
    }
}

}  // namespace specgen_packed_q4_0

#endif  // AVX2, F16C, FMA
