// specgen: Q4_K weights repacked at load, 16 rows interleaved, and specgen's own arithmetic for them.
//
// Why: gemma-3-270m Q4_K_M's attn_output and half its ffn_down are Q4_K. Through ggml's one-column
// arithmetic (vec_dot, which specgen's few-column kernel reproduces bit for bit) a batch pays nearly
// the whole price per column: 2.56 ms for 8 tokens against 0.62 for one, 5.70 for 16, on an AVX-512
// host (docs/results/profile/2026-11-29-op-profile-q8_0x16-1thread.json). Here a super-block's 256
// products of a row and a column, each 32-value chunk times its 6-bit scale, are summed as one integer,
// and so are its mins times the column's chunk sums; the float scales are applied once per
// super-block:
//
//   for each super-block b, in order:  isum = sum_c sc_c * sum_{i in c} w_i * y_i     (exact integers)
//                                      msum = sum_c m_c * sum_{i in c} y_i
//                                      acc  = fma(float(isum), d * dy, acc)
//                                      acc  = fma(-float(msum), dmin * dy, acc)
//
// per (row, column), where w_i are the row's 4-bit codes, sc_c and m_c its 6-bit scales and mins of
// chunk c (8 chunks of 32), d and dmin its fp16 super-block scales, y_i the column's Q8_K bytes and dy
// its float scale (d * dy is rounded to float once; |isum| <= 8 * 63 * 32 * 15 * 128 < 2^25 and its
// conversion rounds, the same way for every batch; |msum| <= 8 * 63 * 4096). Nothing in it depends on
// the number of columns, a column's place in the batch, the thread count or the instruction set: AVX2
// and AVX-512 give the same bits. It rounds differently from ggml's vec_dot.
//
// Layout: llama.cpp's repack buffer (the same bytes as the Q4_K tensor: 16 rows x 144 bytes = 2,304 per
// super-block) holds, per group of 16 rows and per super-block, the 16 d, the 16 dmin (fp16), the 16
// rows' twelve bytes of scales and mins as three planes of 16 32-bit words (plane k, lane r: row r's
// bytes 4 k .. 4 k + 3, so that ggml's decode of them runs on 16 rows at once), and the codes: for
// each 64 values j (ggml's 32 bytes: chunk 2 j in the low nibbles, chunk 2 j + 1 in the high ones),
// qs[j][64 t + 4 r + b] = row r's byte 32 j + 4 t + b. One 64-byte load gives, per 32-bit lane, one
// row's four codes of two chunks, for a vpdpbusd (or vpmaddubsw) against the column's four bytes.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, where
// packed_traits.h offers it to llama.cpp's repack buffer for 2-D Q4_K weights. It needs only a C++17
// compiler and <immintrin.h> (tests/test_packed_kernel.py compiles it alone, for AVX2 and AVX-512,
// against a scalar statement of the arithmetic above).
#pragma once

#include "packed_common.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECGEN_PACKED_Q4_K 1

namespace specgen_packed_q4_k {

using specgen_packed_common::ROWS;
using specgen_packed_common::fp16;
using specgen_packed_common::four256;
using specgen_packed_common::column_q8_K;
using specgen_packed_common::chunk;
using specgen_packed_common::fetch_ahead;
using specgen_packed_common::PREFETCH_K;
#if defined(SPECGEN_PACKED_VNNI)
using specgen_packed_common::dot512;
#endif

constexpr int QK = specgen_packed_common::QK_SUPER;  // values per super-block
constexpr int CHUNKS = 8;    // 32-value chunks per super-block, each with its scale and min
constexpr int EXTRA = 4;     // int32s per column super-block: its chunk sums as int16 pairs

// ggml's block, as stored (fp16 values as their bits): a weight row's (the column's: column_q8_K).
struct row_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK / 2]; };
static_assert(sizeof(row_q4_K) == 144, "ggml's Q4_K block");

struct block_q4_Kx16 {
    uint16_t d[ROWS];
    uint16_t dmin[ROWS];
    uint32_t scales[3][ROWS];
    uint8_t qs[4][ROWS * 32];
    static constexpr int MAX_CODE = 15;  // the codes' bound, which sets how the AVX2 code sums its pairs
};
static_assert(sizeof(block_q4_Kx16) == ROWS * sizeof(row_q4_K), "the packed group fills the rows' bytes");

// Chunk c's code vectors v[t] (lane r: row r's codes 4 t .. 4 t + 3 of the chunk): the low nibbles of
// qs[c / 2] for even chunks, the high ones for odd; AVX2: rows 8 h .. 8 h + 7. A Q5_K block
// (packed_q5_k.h) has its own, which group() below finds by the block's type.
// nibbles(): those vectors from a block's qs (Q5_K's low bits too).
#if defined(SPECGEN_PACKED_VNNI)
template <typename P>
static inline void nibbles(const P & b, int c, __m512i * v) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int t = 0; t < 8; t++) {
        const __m512i u = _mm512_loadu_si512((const void *) (b.qs[c / 2] + 64 * t));
        v[t] = _mm512_and_si512(c % 2 ? _mm512_srli_epi16(u, 4) : u, low);
    }
}
static inline void codes(const block_q4_Kx16 & b, int c, __m512i * v) { nibbles(b, c, v); }
#else
template <typename P>
static inline void nibbles(const P & b, int c, int h, __m256i * v) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int t = 0; t < 8; t++) {
        const __m256i u = _mm256_loadu_si256((const __m256i *) (b.qs[c / 2] + 64 * t + 32 * h));
        v[t] = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(u, 4) : u, low);
    }
}
static inline void codes(const block_q4_Kx16 & b, int c, int h, __m256i * v) { nibbles(b, c, h, v); }
#endif


// Per column super-block, its chunk sums s_c (|s_c| <= 32 * 128) as int16 pairs, in the order the
// mins' pairs come out of their planes: (s0, s2), (s1, s3), (s4, s6), (s5, s7).
static inline void extras(const column_q8_K * col, int64_t nb, int32_t * out) {
    for (int64_t l = 0; l < nb; l++) {
        int32_t s[CHUNKS];
        for (int c = 0; c < CHUNKS; c++) s[c] = col[l].bsums[2 * c] + col[l].bsums[2 * c + 1];
        for (int k = 0; k < 4; k++) {
            const int a = 4 * (k / 2) + k % 2;  // 0, 1, 4, 5
            out[4 * l + k] = (int32_t) ((uint32_t) (uint16_t) s[a] | (uint32_t) (uint16_t) s[a + 2] << 16);
        }
    }
}

// ggml's decode of a row's twelve bytes (get_scale_min_k4), on V-wide vectors of rows' 32-bit words:
// p[0..2] the planes, then sc[0] the scales of chunks 0-3, sc[1] of 4-7, mn[0] the mins of 0-3, mn[1] of 4-7
// (one byte each, chunk 4 h + k in byte k).
template <typename V, typename Ops>
static inline void scales_and_mins(const V * p, V * sc, V * mn, Ops o) {
    const V low6 = o.set1(0x3f3f3f3f), low4 = o.set1(0x0f0f0f0f), two = o.set1(0x03030303);
    sc[0] = o.and_(p[0], low6);
    mn[0] = o.and_(p[1], low6);
    sc[1] = o.or_(o.and_(p[2], low4), o.sll(o.and_(o.srl(p[0], 6), two), 4));
    mn[1] = o.or_(o.and_(o.srl(p[2], 4), low4), o.sll(o.and_(o.srl(p[1], 6), two), 4));
}

#if defined(SPECGEN_PACKED_VNNI)
constexpr int COLUMNS = 8;  // columns per pass over a group: 8 integer sums, 8 accumulators, 8 codes

// One group of 16 rows times NC columns: out[j][r] for r in 0..15 (B: block_q4_Kx16, or Q5_K's).
template <int NC, typename B>
static inline void group(int64_t nb, const B * w, const column_q8_K * const * y,
                         const int32_t * const * ex, float * const * out) {
    __m512 acc[NC];
    for (int j = 0; j < NC; j++) acc[j] = _mm512_setzero_ps();
    const __m512i byte = _mm512_set1_epi32(0xFF), pairs = _mm512_set1_epi32(0x00FF00FF);
    for (int64_t l = 0; l < nb; l++) {
        const B & b = w[l];
        fetch_ahead<PREFETCH_K>(&b);
        __m512i p[3], sc[2], mn[2];
        for (int k = 0; k < 3; k++) p[k] = _mm512_loadu_si512((const void *) b.scales[k]);
        scales_and_mins(p, sc, mn, specgen_packed_common::ops512());
        __m512i isum[NC];
        for (int j = 0; j < NC; j++) isum[j] = _mm512_setzero_si512();
        for (int c = 0; c < CHUNKS; c++) {
            const __m512i s = _mm512_and_si512(_mm512_srli_epi32(sc[c / 4], 8 * (c % 4)), byte);
            __m512i v[8];
            codes(b, c, v);
#pragma GCC unroll 8  // whole, so that isum[] stays in registers
            for (int j = 0; j < NC; j++) {
                // codes 0..MAX_CODE times bytes -128..127, four to a lane: |chunk sum| <= 32 * 31 * 128
                const __m512i dot = dot512(_mm512_setzero_si512(), v, chunk{y[j][l].qs + 32 * c});
                isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(dot, s));
            }
        }
        // the mins as int16 pairs per row: (m0, m2), (m1, m3), (m4, m6), (m5, m7)
        const __m512i m[4] = { _mm512_and_si512(mn[0], pairs), _mm512_and_si512(_mm512_srli_epi32(mn[0], 8), pairs),
                               _mm512_and_si512(mn[1], pairs), _mm512_and_si512(_mm512_srli_epi32(mn[1], 8), pairs) };
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.d));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.dmin));
#pragma GCC unroll 8
        for (int j = 0; j < NC; j++) {
            const int32_t * e = ex[j] + EXTRA * l;
            __m512i msum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), m[0], _mm512_set1_epi32(e[0]));
            for (int k = 1; k < 4; k++) msum = _mm512_dpwssd_epi32(msum, m[k], _mm512_set1_epi32(e[k]));
            const __m512 dy = _mm512_set1_ps(y[j][l].d);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(d, dy), acc[j]);
            acc[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dy), acc[j]);
        }
    }
    for (int j = 0; j < NC; j++) _mm512_storeu_ps(out[j], acc[j]);
}
#else
constexpr int COLUMNS = 4;  // 16 registers: 4 integer sums per half, the chunk's codes, its scales

template <int NC, typename B>
static inline void group(int64_t nb, const B * w, const column_q8_K * const * y,
                         const int32_t * const * ex, float * const * out) {
    const __m256i byte = _mm256_set1_epi32(0xFF), pairs = _mm256_set1_epi32(0x00FF00FF);
    for (int h = 0; h < 2; h++) {  // rows 8h .. 8h+7: 32 bytes of each 64
        __m256 acc[NC];
        for (int j = 0; j < NC; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t l = 0; l < nb; l++) {
            const B & b = w[l];
            if (h == 0) {  // the second half reads the group again from the cache
                fetch_ahead<PREFETCH_K>(&b);
            }
            __m256i p[3], sc[2], mn[2];
            for (int k = 0; k < 3; k++) p[k] = _mm256_loadu_si256((const __m256i *) (b.scales[k] + 8 * h));
            scales_and_mins(p, sc, mn, specgen_packed_common::ops256());
            __m256i isum[NC];
            for (int j = 0; j < NC; j++) isum[j] = _mm256_setzero_si256();
            for (int c = 0; c < CHUNKS; c++) {
                // the chunk's scale twice per row, as the int16 pair vpmaddwd multiplies by
                const __m256i s1 = _mm256_and_si256(_mm256_srli_epi32(sc[c / 4], 8 * (c % 4)), byte);
                const __m256i s = _mm256_or_si256(s1, _mm256_slli_epi32(s1, 16));
                __m256i v[8];
                codes(b, c, h, v);
#pragma GCC unroll 4
                for (int j = 0; j < NC; j++) {
                    const chunk col{y[j][l].qs + 32 * c};
                    if constexpr (B::MAX_CODE <= 15) {
                        // pairs of products in 16 bits: codes <= 15, |byte| <= 128, eight pairs <= 30720
                        __m256i q = _mm256_maddubs_epi16(v[0], four256(col, 0));
                        for (int t = 1; t < 8; t++) q = _mm256_add_epi16(q, _mm256_maddubs_epi16(v[t], four256(col, t)));
                        isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(q, s));
                    } else {
                        // codes <= 31: four pairs at most in 16 bits (<= 31744), so two halves of four
                        __m256i q0 = _mm256_maddubs_epi16(v[0], four256(col, 0));
                        __m256i q1 = _mm256_maddubs_epi16(v[4], four256(col, 4));
                        for (int t = 1; t < 4; t++) {
                            q0 = _mm256_add_epi16(q0, _mm256_maddubs_epi16(v[t], four256(col, t)));
                            q1 = _mm256_add_epi16(q1, _mm256_maddubs_epi16(v[t + 4], four256(col, t + 4)));
                        }
                        isum[j] = _mm256_add_epi32(isum[j], _mm256_add_epi32(_mm256_madd_epi16(q0, s), _mm256_madd_epi16(q1, s)));
                    }
                }
            }
            const __m256i m[4] = { _mm256_and_si256(mn[0], pairs), _mm256_and_si256(_mm256_srli_epi32(mn[0], 8), pairs),
                                   _mm256_and_si256(mn[1], pairs), _mm256_and_si256(_mm256_srli_epi32(mn[1], 8), pairs) };
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.d + 8 * h)));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.dmin + 8 * h)));
#pragma GCC unroll 4
            for (int j = 0; j < NC; j++) {
                const int32_t * e = ex[j] + EXTRA * l;
                __m256i msum = _mm256_madd_epi16(m[0], _mm256_set1_epi32(e[0]));
                for (int k = 1; k < 4; k++) msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m[k], _mm256_set1_epi32(e[k])));
                const __m256 dy = _mm256_set1_ps(y[j][l].d);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(d, dy), acc[j]);
                acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dy), acc[j]);
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

// Row r's d, dmin, scales and low code bits (ggml's qs) into a packed block (Q5_K's too).
template <typename P, typename R>
static inline void pack_row(P & out, int64_t r, const R & in) {
    out.d[r] = in.d;
    out.dmin[r] = in.dmin;
    for (int k = 0; k < 3; k++) memcpy(&out.scales[k][r], in.scales + 4 * k, 4);
    for (int j = 0; j < 4; j++) {
        for (int t = 0; t < 8; t++) memcpy(out.qs[j] + 64 * t + 4 * r, in.qs + 32 * j + 4 * t, 4);
    }
}

// Weights rows x (nb super-blocks) of Q4_K, row after row, into rows / 16 groups of packed blocks.
static inline void pack(const row_q4_K * src, int64_t rows, int64_t nb, block_q4_Kx16 * dst) {
    for (int64_t g = 0; g < rows / ROWS; g++) {
        for (int64_t l = 0; l < nb; l++) {
            for (int64_t r = 0; r < ROWS; r++) pack_row(dst[g * nb + l], r, src[(g * ROWS + r) * nb + l]);
        }
    }
}

}  // namespace specgen_packed_q4_k

#endif  // AVX2, F16C, FMA
