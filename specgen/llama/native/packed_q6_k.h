// specgen: Q6_K weights repacked at load, 16 rows interleaved, and specgen's own arithmetic for them.
//
// Why: Q4_K_M files keep half of a model's ffn_down in Q6_K (gemma-3-270m's nine), and through ggml's
// one-column arithmetic (vec_dot, which specgen's few-column kernel reproduces bit for bit) a batch
// pays it per column: 1.17 ms for 8 tokens against 0.36 for one, 2.41 for 16, on an AVX-512 host
// (docs/results/profile/2026-11-29-op-profile-q8_0x16-1thread.json). Here a super-block's 256 products
// of a row and a column, each 16-value group times its 8-bit scale, are summed as one integer with the
// codes' offset of 32 taken out once, and the float scales are applied once per super-block:
//
//   for each super-block b, in order:  isum = sum_g sc_g * sum_{i in g} w_i * y_i
//                                             - 32 * sum_g sc_g * sum_{i in g} y_i      (exact integers)
//                                      acc  = fma(float(isum), d * dy, acc)
//
// per (row, column), where w_i are the row's 6-bit codes (0..63, the value being w_i - 32), sc_g its
// signed scale of group g (16 groups of 16 values), d its fp16 super-block scale, y_i the column's Q8_K
// bytes and dy its float scale (d * dy is rounded to float once; |isum| <= 16 * 128 * 16 * 128 * 63 +
// 32 * 16 * 128 * 2048 < 2^29, and its conversion rounds, the same way for every batch). Nothing in it
// depends on the number of columns, a column's place in the batch, the thread count or the instruction
// set: AVX2 and AVX-512 give the same bits. It rounds differently from ggml's vec_dot.
//
// Layout: llama.cpp's repack buffer (the same bytes as the Q6_K tensor: 16 rows x 210 bytes = 3,360 per
// super-block) holds, per group of 16 rows and per super-block, the 16 d (fp16), the rows' 16 scales as
// four planes of 16 32-bit words (plane q, lane r: row r's scales 4 q .. 4 q + 3), and the codes as
// ggml keeps them, their low four bits (ql, 128 bytes a row) and high two (qh, 64), interleaved four
// bytes at a time: ql[j][64 t + 4 r + b] = row r's ql byte 32 j + 4 t + b, qh[n][64 t + 4 r + b] = its
// qh byte 32 n + 4 t + b. Values 128 n + 32 k + i (k = 0..3, i = 0..31) are ql[2 n + k % 2]'s low
// (k < 2) or high nibbles with qh[n]'s bits 2 k, 2 k + 1 above them, as in ggml's dequantize_row_q6_K.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, where
// packed_traits.h offers it to llama.cpp's repack buffer for 2-D Q6_K weights. It needs only a C++17
// compiler and <immintrin.h> (tests/test_packed_kernel.py compiles it alone, for AVX2 and AVX-512,
// against a scalar statement of the arithmetic above).
#pragma once

#include "packed_common.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECGEN_PACKED_Q6_K 1

namespace specgen_packed_q6_k {

using specgen_packed_common::ROWS;
using specgen_packed_common::fp16;
using specgen_packed_common::four256;
using specgen_packed_common::column_q8_K;
using specgen_packed_common::chunk;
using specgen_packed_common::fetch_ahead;
using specgen_packed_common::PREFETCH_K;
#if defined(SPECGEN_PACKED_VNNI)
using specgen_packed_common::four512;
#endif

constexpr int QK = specgen_packed_common::QK_SUPER;  // values per super-block
constexpr int CHUNKS = 8;    // 32-value chunks per super-block, two scale groups each
constexpr int EXTRA = 8;     // int32s per column super-block: its 16-value sums as int16 pairs

// ggml's block, as stored (fp16 values as their bits): a weight row's (the column's: column_q8_K).
struct row_q6_K { uint8_t ql[QK / 2]; uint8_t qh[QK / 4]; int8_t scales[QK / 16]; uint16_t d; };
static_assert(sizeof(row_q6_K) == 210, "ggml's Q6_K block");

struct block_q6_Kx16 {
    uint16_t d[ROWS];
    uint32_t scales[4][ROWS];
    uint8_t ql[4][ROWS * 32];
    uint8_t qh[2][ROWS * 32];
    static constexpr int OFFSET_SHIFT = 5;  // the codes' offset, 32, as a shift (Q3_K's block: 4)
};
static_assert(sizeof(block_q6_Kx16) == ROWS * sizeof(row_q6_K), "the packed group fills the rows' bytes");


// Per column super-block, its 16-value sums b_g (Q8_K's bsums) as int16 pairs, in the order the
// scales' pairs come out of their planes: per plane q, (b_4q, b_4q+2) then (b_4q+1, b_4q+3).
static inline void extras(const column_q8_K * col, int64_t nb, int32_t * out) {
    for (int64_t l = 0; l < nb; l++) {
        const int16_t * s = col[l].bsums;
        for (int q = 0; q < 4; q++) {
            for (int k = 0; k < 2; k++) {
                out[EXTRA * l + 2 * q + k] = (int32_t) ((uint32_t) (uint16_t) s[4 * q + k] |
                                                        (uint32_t) (uint16_t) s[4 * q + k + 2] << 16);
            }
        }
    }
}

#if defined(SPECGEN_PACKED_VNNI)
constexpr int COLUMNS = 8;  // columns per pass over a group: 8 integer sums, 8 accumulators, 8 codes

// Chunk c's codes for the 16 rows, four to a lane (t = 0..7: values 4 t .. 4 t + 3 of the chunk). A Q3_K
// block (packed_q3_k.h) has its own codes() and scales(), which group() finds by the block's type.
static inline void codes(const block_q6_Kx16 & b, int c, __m512i * v) {
    const int n = c / 4, k = c % 4;
    const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(0x30);
    for (int t = 0; t < 8; t++) {
        const __m512i l = _mm512_loadu_si512((const void *) (b.ql[2 * n + k % 2] + 64 * t));
        const __m512i h = _mm512_loadu_si512((const void *) (b.qh[n] + 64 * t));
        const __m512i nib = _mm512_and_si512(k < 2 ? l : _mm512_srli_epi16(l, 4), low);
        const __m512i top = k < 2 ? _mm512_slli_epi16(h, 4 - 2 * k) : _mm512_srli_epi16(h, 2 * k - 4);
        v[t] = _mm512_or_si512(nib, _mm512_and_si512(top, high));
    }
}

// The rows' 16 signed group scales as four planes (plane q, lane r: row r's scales 4 q .. 4 q + 3).
static inline void scales(const block_q6_Kx16 & b, __m512i * sc) {
    for (int q = 0; q < 4; q++) sc[q] = _mm512_loadu_si512((const void *) b.scales[q]);
}

// One group of 16 rows times NC columns: out[j][r] for r in 0..15 (B: block_q6_Kx16, or Q3_K's).
template <int NC, typename B>
static inline void group(int64_t nb, const B * w, const column_q8_K * const * y,
                         const int32_t * const * ex, float * const * out) {
    __m512 acc[NC];
    for (int j = 0; j < NC; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t l = 0; l < nb; l++) {
        const B & b = w[l];
        fetch_ahead<PREFETCH_K>(&b);
        __m512i sc[4];
        scales(b, sc);
        __m512i isum[NC];
        for (int j = 0; j < NC; j++) isum[j] = _mm512_setzero_si512();
        for (int c = 0; c < CHUNKS; c++) {
            __m512i v[8];
            codes(b, c, v);
            // the chunk's two groups' scales, sign-extended per row: groups 2 c, 2 c + 1 are plane c / 2's
            // bytes 2 (c % 2) and 2 (c % 2) + 1
            const int at = 2 * (c % 2);
            const __m512i s0 = _mm512_srai_epi32(_mm512_slli_epi32(sc[c / 2], 24 - 8 * at), 24);
            const __m512i s1 = _mm512_srai_epi32(_mm512_slli_epi32(sc[c / 2], 16 - 8 * at), 24);
#pragma GCC unroll 8  // whole, so that isum[] stays in registers
            for (int j = 0; j < NC; j++) {
                const chunk col{y[j][l].qs + 32 * c};
                // codes 0..63 times bytes -128..127, four to a lane: |group sum| <= 16 * 63 * 128
                __m512i g0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[0], four512(col, 0));
                __m512i g1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[4], four512(col, 4));
                for (int t = 1; t < 4; t++) {
                    g0 = _mm512_dpbusd_epi32(g0, v[t], four512(col, t));
                    g1 = _mm512_dpbusd_epi32(g1, v[t + 4], four512(col, t + 4));
                }
                isum[j] = _mm512_add_epi32(isum[j], _mm512_add_epi32(_mm512_mullo_epi32(g0, s0), _mm512_mullo_epi32(g1, s1)));
            }
        }
        // the scales as int16 pairs per row: per plane, (s_4q, s_4q+2) and (s_4q+1, s_4q+3)
        __m512i p[8];
        for (int q = 0; q < 4; q++) {
            p[2 * q] = _mm512_srai_epi16(_mm512_slli_epi16(sc[q], 8), 8);
            p[2 * q + 1] = _mm512_srai_epi16(sc[q], 8);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.d));
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            const int32_t * e = ex[j] + EXTRA * l;
            __m512i m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), p[0], _mm512_set1_epi32(e[0]));
            for (int k = 1; k < 8; k++) m = _mm512_dpwssd_epi32(m, p[k], _mm512_set1_epi32(e[k]));
            const __m512i total = _mm512_sub_epi32(isum[j], _mm512_slli_epi32(m, B::OFFSET_SHIFT));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(d, _mm512_set1_ps(y[j][l].d)), acc[j]);
        }
    }
    for (int j = 0; j < NC; j++) _mm512_storeu_ps(out[j], acc[j]);
}
#else
constexpr int COLUMNS = 4;  // 16 registers: 4 integer sums per half, the chunk's codes, its scales

// Chunk c's codes for rows 8 h .. 8 h + 7, four to a lane (t = 0..7: values 4 t .. 4 t + 3).
static inline void codes(const block_q6_Kx16 & b, int c, int h, __m256i * v) {
    const int n = c / 4, k = c % 4;
    const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(0x30);
    for (int t = 0; t < 8; t++) {
        const __m256i l = _mm256_loadu_si256((const __m256i *) (b.ql[2 * n + k % 2] + 64 * t + 32 * h));
        const __m256i q = _mm256_loadu_si256((const __m256i *) (b.qh[n] + 64 * t + 32 * h));
        const __m256i nib = _mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), low);
        const __m256i top = k < 2 ? _mm256_slli_epi16(q, 4 - 2 * k) : _mm256_srli_epi16(q, 2 * k - 4);
        v[t] = _mm256_or_si256(nib, _mm256_and_si256(top, high));
    }
}

static inline void scales(const block_q6_Kx16 & b, int h, __m256i * sc) {
    for (int q = 0; q < 4; q++) sc[q] = _mm256_loadu_si256((const __m256i *) (b.scales[q] + 8 * h));
}

template <int NC, typename B>
static inline void group(int64_t nb, const B * w, const column_q8_K * const * y,
                         const int32_t * const * ex, float * const * out) {
    for (int h = 0; h < 2; h++) {  // rows 8h .. 8h+7: 32 bytes of each 64
        __m256 acc[NC];
        for (int j = 0; j < NC; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t l = 0; l < nb; l++) {
            const B & b = w[l];
            if (h == 0) {  // the second half reads the group again from the cache
                fetch_ahead<PREFETCH_K>(&b);
            }
            __m256i sc[4];
            scales(b, h, sc);
            __m256i isum[NC];
            for (int j = 0; j < NC; j++) isum[j] = _mm256_setzero_si256();
            for (int c = 0; c < CHUNKS; c++) {
                __m256i v[8];
                codes(b, c, h, v);
                // each group's scale twice per row, as the int16 pair vpmaddwd multiplies by
                const int at = 2 * (c % 2);
                __m256i s[2];
                for (int g = 0; g < 2; g++) {
                    const __m256i one = _mm256_srai_epi32(_mm256_slli_epi32(sc[c / 2], 24 - 8 * (at + g)), 24);
                    s[g] = _mm256_or_si256(_mm256_and_si256(one, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(one, 16));
                }
#pragma GCC unroll 4
                for (int j = 0; j < NC; j++) {
                    const chunk col{y[j][l].qs + 32 * c};
                    // pairs of products in 16 bits: codes <= 63, |byte| <= 128, two pairs <= 32256
                    __m256i sum = isum[j];
                    for (int t = 0; t < 8; t += 2) {
                        const __m256i q = _mm256_add_epi16(_mm256_maddubs_epi16(v[t], four256(col, t)),
                                                           _mm256_maddubs_epi16(v[t + 1], four256(col, t + 1)));
                        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(q, s[t / 4]));
                    }
                    isum[j] = sum;
                }
            }
            __m256i p[8];
            for (int q = 0; q < 4; q++) {
                p[2 * q] = _mm256_srai_epi16(_mm256_slli_epi16(sc[q], 8), 8);
                p[2 * q + 1] = _mm256_srai_epi16(sc[q], 8);
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.d + 8 * h)));
#pragma GCC unroll 4
            for (int j = 0; j < NC; j++) {
                const int32_t * e = ex[j] + EXTRA * l;
                __m256i m = _mm256_madd_epi16(p[0], _mm256_set1_epi32(e[0]));
                for (int k = 1; k < 8; k++) m = _mm256_add_epi32(m, _mm256_madd_epi16(p[k], _mm256_set1_epi32(e[k])));
                const __m256i total = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(m, B::OFFSET_SHIFT));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, _mm256_set1_ps(y[j][l].d)), acc[j]);
            }
        }
        for (int j = 0; j < NC; j++) _mm256_storeu_ps(out[j] + 8 * h, acc[j]);
    }
}
#endif

// out[c][row] for the groups g0..g1 of the weights and every column c (Q8_K rows, `row_bytes` apart;
// column c's extras() at ex + c * nb * EXTRA).
template <typename B>
static inline void matmul(int64_t nb, const B * w, int64_t g0, int64_t g1, const char * cols,
                          size_t row_bytes, const int32_t * ex, int64_t n, float * dst, int64_t ldc) {
    specgen_packed_common::over_groups_with_offsets<COLUMNS, column_q8_K, EXTRA>(nb, g0, g1, cols, row_bytes, ex, n, dst, ldc,
        [&](auto N, int64_t g, const column_q8_K * const * y, const int32_t * const * e, float * const * out) {
            group<decltype(N)::value>(nb, w + g * nb, y, e, out);
        });
}

// Weights rows x (nb super-blocks) of Q6_K, row after row, into rows / 16 groups of packed blocks.
static inline void pack(const row_q6_K * src, int64_t rows, int64_t nb, block_q6_Kx16 * dst) {
    for (int64_t g = 0; g < rows / ROWS; g++) {
        for (int64_t l = 0; l < nb; l++) {
            block_q6_Kx16 & out = dst[g * nb + l];
            for (int64_t r = 0; r < ROWS; r++) {
                const row_q6_K & in = src[(g * ROWS + r) * nb + l];
                out.d[r] = in.d;
                for (int q = 0; q < 4; q++) memcpy(&out.scales[q][r], in.scales + 4 * q, 4);
                for (int t = 0; t < 8; t++) {
                    for (int j = 0; j < 4; j++) memcpy(out.ql[j] + 64 * t + 4 * r, in.ql + 32 * j + 4 * t, 4);
                    for (int n = 0; n < 2; n++) memcpy(out.qh[n] + 64 * t + 4 * r, in.qh + 32 * n + 4 * t, 4);
                }
            }
        }
    }
}

}  // namespace specgen_packed_q6_k

#endif  // AVX2, F16C, FMA
