// specgen: Q8_0 weights repacked at load, 16 rows interleaved, and specgen's own arithmetic for them.
//
// Why: a quantized model's output layer is often Q8_0 (gemma-3-270m Q4_K_M's and smollm2-135m
// Q4_1's, and the copy a screened F32 target reads), and it is most of a decode: gemma's took 6.8 of
// 11.3 ms for one token on an AVX-512 host, and 24.3 of 40.8 for eight in an AVX2 build
// (docs/screening-and-kernels.md). ggml's one-column arithmetic keeps eight float lanes per row and
// pays a conversion, a multiply and a fused multiply-add per block, row and column. Here, as for Q4_1
// and Q5_0, a block's 32 products of a row and a column are summed as one integer, and the scales
// are applied once:
//
//   for each block b, in order:  isum_b = sum_i w_i * y_i                   (an exact integer)
//                                acc    = fma(float(isum_b), d_b * dy_b, acc)
//
// per (row, column), where w_i are the row's bytes, y_i the column's Q8_0 bytes, d_b and dy_b their
// scales (the product of two fp16 values is exact in float, and |isum_b| <= 32 * 128 * 127 < 2^24
// converts exactly). Nothing in it depends on the number of columns, a column's place in the batch,
// the thread count or the instruction set: AVX2 and AVX-512 give the same bits, and so do a prompt
// read in batches of any size and one token decoded alone. It rounds differently from ggml's vec_dot.
//
// Layout: llama.cpp's repack buffer (the same bytes as the Q8_0 tensor: 16 rows x 34 bytes = 544 per
// block) holds, per group of 16 rows and per block, the 16 scales (fp16) and the 16 rows' 32 bytes
// interleaved 4 at a time: qs[64 t + 4 r + b] = row r's byte 4 t + b (t = 0..7), so one 64-byte load
// gives, per 32-bit lane, one row's four bytes, for a vpdpbusd (or vpmaddubsw) against the column's
// four bytes broadcast. The bytes are stored for the instruction set the build packs for:
//   AVX-512: w + 128, unsigned, for vpdpbusd (unsigned x signed); the 128 * sum_i y_i this adds is
//            taken out by each column block's offset (offsets(): -128 * sum_i y_i, computed once per
//            column block), which starts the sum.
//   AVX2:    w as it is; vpmaddubsw takes |w| and y with w's sign (ggml's sign trick: a pair of
//            products stays within 2 * 127 * 128 = 32512, no saturation), and its offset is 0.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, where
// packed_traits.h offers it to llama.cpp's repack buffer for 2-D Q8_0 weights. It needs only a C++17
// compiler and <immintrin.h> (tests/test_packed_kernel.py compiles it alone, for AVX2 and AVX-512,
// against a scalar statement of the arithmetic above).
#pragma once

#include "packed_common.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECGEN_PACKED_Q8_0 1

namespace specgen_packed_q8_0 {

using specgen_packed_common::ROWS;
using specgen_packed_common::QK;
using specgen_packed_common::fp16;
using specgen_packed_common::fetch_ahead;
using specgen_packed_common::four256;
#if defined(SPECGEN_PACKED_VNNI)
using specgen_packed_common::dot512;
#endif

// ggml's block, as stored (the fp16 scale as its bits): a weight row's and a quantized column's.
struct row_q8_0 { uint16_t d; int8_t qs[QK]; };
using column_q8_0 = row_q8_0;
static_assert(sizeof(row_q8_0) == 34, "ggml's Q8_0 block");

struct block_q8_0x16 {
    uint16_t d[ROWS];
    uint8_t qs[ROWS * QK];
};
static_assert(sizeof(block_q8_0x16) == ROWS * sizeof(row_q8_0), "the packed group fills the rows' bytes");

#if defined(SPECGEN_PACKED_VNNI)
constexpr int BIAS = 128;  // stored bytes are w + 128
#else
constexpr int BIAS = 0;
#endif

// Per column block: -BIAS times the sum of its 32 bytes, where the integer sum starts (|.| <= 128 * 32 * 128).
static inline void offsets(const column_q8_0 * col, int64_t nb, int32_t * off) {
    specgen_packed_common::block_sums(col, nb, -BIAS, off);
}

#if defined(SPECGEN_PACKED_VNNI)
constexpr int COLUMNS = 8;  // columns per pass over a group: 8 accumulators, 8 byte registers

// One group of 16 rows times NC columns: out[j][r] for r in 0..15.
template <int NC>
static inline void group(int64_t nb, const block_q8_0x16 * w, const column_q8_0 * const * y,
                         const int32_t * const * off, float * const * out) {
    __m512 acc[NC];
    for (int j = 0; j < NC; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t l = 0; l < nb; l++) {
        const block_q8_0x16 & b = w[l];
        fetch_ahead(&w[l]);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.d));
        __m512i v[8];
        for (int t = 0; t < 8; t++) v[t] = _mm512_loadu_si512((const void *) (b.qs + 64 * t));
#pragma GCC unroll 8  // whole, so that acc[] stays in registers (GCC leaves 8 iterations a loop over memory)
        for (int j = 0; j < NC; j++) {
            const column_q8_0 & c = y[j][l];
            // bytes 0..255 times -128..127, four to a 32-bit lane: no saturation in vpdpbusd's sums
            const __m512 isum = _mm512_cvtepi32_ps(dot512(_mm512_set1_epi32(off[j][l]), v, c));
            acc[j] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(fp16(c.d))), acc[j]);
        }
    }
    for (int j = 0; j < NC; j++) _mm512_storeu_ps(out[j], acc[j]);
}
#else
constexpr int COLUMNS = 4;  // 16 registers: 4 accumulators per half, the half's |w| and w, scales

template <int NC>
static inline void group(int64_t nb, const block_q8_0x16 * w, const column_q8_0 * const * y,
                         const int32_t * const * off, float * const * out) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {  // rows 8h .. 8h+7: 32 bytes of each 64
        __m256 acc[NC];
        for (int j = 0; j < NC; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t l = 0; l < nb; l++) {
            const block_q8_0x16 & b = w[l];
            if (h == 0) {  // the second half reads the group again from the cache
                fetch_ahead(&w[l]);
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.d + 8 * h)));
            __m256i v[8], a[8];
            for (int t = 0; t < 8; t++) {
                v[t] = _mm256_loadu_si256((const __m256i *) (b.qs + 64 * t + 32 * h));
                a[t] = _mm256_sign_epi8(v[t], v[t]);
            }
#pragma GCC unroll 4
            for (int j = 0; j < NC; j++) {
                const column_q8_0 & c = y[j][l];
                // |w| times y with w's sign, in pairs (<= 2 * 127 * 128), then in fours (vpmaddwd)
                __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(a[0], _mm256_sign_epi8(four256(c, 0), v[0])), ones);
                for (int t = 1; t < 8; t++) {
                    const __m256i p = _mm256_maddubs_epi16(a[t], _mm256_sign_epi8(four256(c, t), v[t]));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                }
                const __m256 isum = _mm256_cvtepi32_ps(_mm256_add_epi32(s, _mm256_set1_epi32(off[j][l])));
                acc[j] = _mm256_fmadd_ps(isum, _mm256_mul_ps(d, _mm256_set1_ps(fp16(c.d))), acc[j]);
            }
        }
        for (int j = 0; j < NC; j++) _mm256_storeu_ps(out[j] + 8 * h, acc[j]);
    }
}
#endif

// out[c][row] for the groups g0..g1 of the weights and every column c (Q8_0 rows, `row_bytes` apart;
// column c's offsets() at offs + c * nb).
static inline void matmul(int64_t nb, const block_q8_0x16 * w, int64_t g0, int64_t g1, const char * cols,
                          size_t row_bytes, const int32_t * offs, int64_t n, float * dst, int64_t ldc) {
    specgen_packed_common::over_groups_with_offsets<COLUMNS, column_q8_0>(nb, g0, g1, cols, row_bytes, offs, n, dst, ldc,
        [&](auto N, int64_t g, const column_q8_0 * const * y, const int32_t * const * off, float * const * out) {
            group<decltype(N)::value>(nb, w + g * nb, y, off, out);
        });
}

// Weights rows x (nb blocks) of Q8_0, row after row, into rows / 16 groups of packed blocks.
static inline void pack(const row_q8_0 * src, int64_t rows, int64_t nb, block_q8_0x16 * dst) {
    for (int64_t g = 0; g < rows / ROWS; g++) {
        for (int64_t l = 0; l < nb; l++) {
            block_q8_0x16 & out = dst[g * nb + l];
            for (int64_t r = 0; r < ROWS; r++) {
                const row_q8_0 & in = src[(g * ROWS + r) * nb + l];
                out.d[r] = in.d;
                for (int i = 0; i < QK; i++) {
                    out.qs[64 * (i / 4) + 4 * r + i % 4] = (uint8_t) (in.qs[i] + BIAS);
                }
            }
        }
    }
}

}  // namespace specgen_packed_q8_0

#endif  // AVX2, F16C, FMA
