// specgen: Q5_0 weights repacked at load, 16 rows interleaved, and specgen's own arithmetic for them.
//
// Why: as for Q4_1 (packed_q4_1.h): ggml's one-column Q5_0 arithmetic (vec_dot) pays a conversion, a
// multiply and a fused multiply-add per block, row and column in eight float lanes, and rebuilds the
// codes' fifth bits for every row and column; at a few columns that, not the integer products, is
// most of the cost (gemma-3-270m's derived models hold most of their matrices in Q5_0). Here a
// block's 32 products of a row and a column are summed as one integer, and the scales are applied
// once per block:
//
//   for each block b, in order:  isum_b = sum_i code_i * y_i - 16 * sum_i y_i     (exact integers)
//                                acc    = fma(float(isum_b), d_b * dy_b, acc)
//
// per (row, column), where code_i in 0..31 is the stored 5-bit code (the weight is d_b * (code_i - 16)),
// y_i the column's Q8_0 bytes, d_b the row's scale and dy_b the column's (the product of two fp16
// values is exact in float, and |isum_b| <= 32 * 16 * 127 < 2^24 converts exactly). sum_i y_i is
// computed once per column block (offsets() below), not once per row group. Nothing in it depends
// on the number of columns, a column's place in the batch, the thread count or the instruction set:
// AVX2 and AVX-512 give the same bits, and so do a prompt read in batches of any size and one token
// decoded alone. It rounds differently from ggml's vec_dot (which converts every block's sum and
// keeps eight float lanes).
//
// Layout: llama.cpp's repack buffer (the same bytes as the Q5_0 tensor: 16 rows x 22 bytes = 352 per
// block) holds, per group of 16 rows and per block, the 16 scales (fp16), the 16 rows' 16 code bytes
// interleaved 4 bytes at a time as in packed_q4_1.h (qs[64 t + 4 r + b] = row r's byte 4 t + b: low
// nibble code 4 t + b, high nibble code 16 + 4 t + b), and the fifth bits in 64 bytes qh, arranged
// for the instruction set the build packs for (the buffer never leaves the process). Code vector k
// (k < 4: the low nibbles of qs[64 k ..], k >= 4: the high nibbles of qs[64 (k - 4) ..]) holds row
// r's code 4 k + b at byte 4 r + b.
//   AVX-512: eight 64-bit masks, qh[8 k ..] bit 4 r + b = the fifth bit of row r's code 4 k + b: one
//            kmovq and one masked vpaddb of 16 give code vector k its bit 4.
//   AVX2:    the bits transposed, qh[4 r + b] bit k = the fifth bit of row r's code 4 k + b (the same
//            byte as the code in every vector): one shift of qh by 4 - k bits (within 16-bit lanes;
//            the bits that cross a byte are masked off) and one AND give code vector k its bit 4
//            (rows 8 h .. 8 h + 7 are bytes 32 h .. 32 h + 31 of every vector and of qh).
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, where
// packed_traits.h offers it to llama.cpp's repack buffer for 2-D Q5_0 weights. It needs only a C++17
// compiler and <immintrin.h> (tests/test_packed_kernel.py compiles it alone, for AVX2 and AVX-512,
// against a scalar statement of the arithmetic above).
#pragma once

#include "packed_common.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECGEN_PACKED_Q5_0 1

namespace specgen_packed_q5_0 {

using specgen_packed_common::ROWS;
using specgen_packed_common::QK;
using specgen_packed_common::fp16;
using specgen_packed_common::fetch_ahead;
using specgen_packed_common::four256;
#if defined(SPECGEN_PACKED_VNNI)
using specgen_packed_common::dot512;
#endif

// ggml's blocks, as stored (fp16 values as their bits): a weight row's and a quantized column's.
struct row_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct column_q8_0 { uint16_t d; int8_t qs[QK]; };
static_assert(sizeof(row_q5_0) == 22 && sizeof(column_q8_0) == 34, "ggml's Q5_0 and Q8_0 blocks");

struct block_q5_0x16 {
    uint16_t d[ROWS];
    uint8_t qs[ROWS * QK / 2];
    uint8_t qh[ROWS * QK / 8];
};
static_assert(sizeof(block_q5_0x16) == ROWS * sizeof(row_q5_0), "the packed group fills the rows' bytes");

// Per column block: -16 times the sum of its 32 bytes, the second term of isum (|.| <= 16 * 32 * 127).
static inline void offsets(const column_q8_0 * col, int64_t nb, int32_t * off) {
    specgen_packed_common::block_sums(col, nb, -16, off);
}

// Code vector K's fifth bits, as 0x10 or 0 per byte, from the transposed bits h (bit K of each byte).
template <int K>
static inline __m256i fifth256(__m256i h) {
    const __m256i bit = _mm256_set1_epi8(0x10);
    if constexpr (K < 4) return _mm256_and_si256(_mm256_slli_epi16(h, 4 - K), bit);
    else if constexpr (K == 4) return _mm256_and_si256(h, bit);
    else return _mm256_and_si256(_mm256_srli_epi16(h, K - 4), bit);
}

#if defined(SPECGEN_PACKED_VNNI)
// Code vector k from its four bits per byte (nibbles, already masked) and its 64-bit mask of fifth bits.
static inline __m512i codes512(__m512i nibbles, const uint8_t * qh, int k) {
    uint64_t mask;
    memcpy(&mask, qh + 8 * k, sizeof(mask));
    return _mm512_mask_add_epi8(nibbles, _cvtu64_mask64(mask), nibbles, _mm512_set1_epi8(0x10));
}

// The eight code vectors of a block: interleaved nibbles qs, fifth bits qh as 64-bit masks (packed_q5_1.h too).
static inline void codes512(const uint8_t * qs, const uint8_t * qh, __m512i * v) {
    specgen_packed_common::nibbles512(qs, v);
    for (int k = 0; k < 8; k++) v[k] = codes512(v[k], qh, k);
}

constexpr int COLUMNS = 8;  // columns per pass over a group: 8 accumulators, 8 code registers

// One group of 16 rows times NC columns: out[j][r] for r in 0..15.
template <int NC>
static inline void group(int64_t nb, const block_q5_0x16 * w, const column_q8_0 * const * y,
                         const int32_t * const * off, float * const * out) {
    __m512 acc[NC];
    for (int j = 0; j < NC; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t l = 0; l < nb; l++) {
        const block_q5_0x16 & b = w[l];
        fetch_ahead(&w[l]);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) b.d));
        __m512i v[8];
        codes512(b.qs, b.qh, v);
#pragma GCC unroll 8  // whole, so that acc[] stays in registers (GCC leaves 8 iterations a loop over memory)
        for (int j = 0; j < NC; j++) {
            const column_q8_0 & c = y[j][l];
            // codes 0..31 times bytes -127..127: no saturation in vpdpbusd's 32-bit sums
            const __m512 isum = _mm512_cvtepi32_ps(dot512(_mm512_set1_epi32(off[j][l]), v, c));
            acc[j] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d, _mm512_set1_ps(fp16(c.d))), acc[j]);
        }
    }
    for (int j = 0; j < NC; j++) _mm512_storeu_ps(out[j], acc[j]);
}
#else
constexpr int COLUMNS = 4;  // 16 registers: 4 accumulators per half, the half's codes, scales

static inline __m256i codes256(__m256i a, __m256i b, __m256i low) { return _mm256_or_si256(_mm256_and_si256(a, low), b); }

// The eight code vectors of rows 8 h .. 8 h + 7 of a block: nibbles qs, transposed fifth bits qh (packed_q5_1.h too).
static inline void codes256(const uint8_t * qs, const uint8_t * qh, int h, __m256i * v) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i hb = _mm256_loadu_si256((const __m256i *) (qh + 32 * h));
    __m256i u[4];
    for (int t = 0; t < 4; t++) u[t] = _mm256_loadu_si256((const __m256i *) (qs + 64 * t + 32 * h));
    v[0] = codes256(u[0], fifth256<0>(hb), low);
    v[1] = codes256(u[1], fifth256<1>(hb), low);
    v[2] = codes256(u[2], fifth256<2>(hb), low);
    v[3] = codes256(u[3], fifth256<3>(hb), low);
    v[4] = codes256(_mm256_srli_epi16(u[0], 4), fifth256<4>(hb), low);
    v[5] = codes256(_mm256_srli_epi16(u[1], 4), fifth256<5>(hb), low);
    v[6] = codes256(_mm256_srli_epi16(u[2], 4), fifth256<6>(hb), low);
    v[7] = codes256(_mm256_srli_epi16(u[3], 4), fifth256<7>(hb), low);
}

// Per column, a block's sum of codes times bytes (codes 0..31 from codes256): vpmaddubsw's pair sums in
// 16 bits, |2 * 31 * 127| = 7874 (7936 for a byte of -128), so four of them stay within 31744 <= 32767;
// two halves of four code vectors each, then vpmaddwd (packed_q5_1.h too).
template <typename C>
static inline __m256i dot256(const __m256i * v, const C & c) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p0 = _mm256_maddubs_epi16(v[0], four256(c, 0));
    __m256i p1 = _mm256_maddubs_epi16(v[4], four256(c, 4));
    for (int t = 1; t < 4; t++) {
        p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(v[t], four256(c, t)));
        p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(v[t + 4], four256(c, t + 4)));
    }
    return _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
}

template <int NC>
static inline void group(int64_t nb, const block_q5_0x16 * w, const column_q8_0 * const * y,
                         const int32_t * const * off, float * const * out) {
    for (int h = 0; h < 2; h++) {  // rows 8h .. 8h+7: 32 bytes of each 64
        __m256 acc[NC];
        for (int j = 0; j < NC; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t l = 0; l < nb; l++) {
            const block_q5_0x16 & b = w[l];
            if (h == 0) {  // the second half reads the group again from the cache
                fetch_ahead(&w[l]);
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (b.d + 8 * h)));
            __m256i v[8];
            codes256(b.qs, b.qh, h, v);
#pragma GCC unroll 8
            for (int j = 0; j < NC; j++) {
                const column_q8_0 & c = y[j][l];
                const __m256 isum = _mm256_cvtepi32_ps(_mm256_add_epi32(dot256(v, c), _mm256_set1_epi32(off[j][l])));
                acc[j] = _mm256_fmadd_ps(isum, _mm256_mul_ps(d, _mm256_set1_ps(fp16(c.d))), acc[j]);
            }
        }
        for (int j = 0; j < NC; j++) _mm256_storeu_ps(out[j] + 8 * h, acc[j]);
    }
}
#endif

// out[c][row] for the groups g0..g1 of the weights and every column c (Q8_0 rows, `row_bytes` apart;
// column c's offsets() at offs + c * nb).
static inline void matmul(int64_t nb, const block_q5_0x16 * w, int64_t g0, int64_t g1, const char * cols,
                          size_t row_bytes, const int32_t * offs, int64_t n, float * dst, int64_t ldc) {
    specgen_packed_common::over_groups_with_offsets<COLUMNS, column_q8_0>(nb, g0, g1, cols, row_bytes, offs, n, dst, ldc,
        [&](auto N, int64_t g, const column_q8_0 * const * y, const int32_t * const * off, float * const * out) {
            group<decltype(N)::value>(nb, w + g * nb, y, off, out);
        });
}

// Row r's fifth bits (ggml's 32-bit qh, bit j: code j's) into a packed block's qh, zeroed before its
// first row, laid out for this build's code (packed_q5_1.h too).
static inline void fifth_bits(uint8_t * out_qh, int64_t r, const uint8_t * row_qh) {
    uint32_t qh;
    memcpy(&qh, row_qh, sizeof(qh));
    for (int k = 0; k < 8; k++) {
        for (int b = 0; b < 4; b++) {
            const int bit = (int) ((qh >> (4 * k + b)) & 1);
#if defined(SPECGEN_PACKED_VNNI)
            const int at = 8 * k + (4 * (int) r + b) / 8, shift = (4 * (int) r + b) % 8;  // masks
#else
            const int at = 4 * (int) r + b, shift = k;  // transposed
#endif
            out_qh[at] = (uint8_t) (out_qh[at] | (unsigned) bit << shift);
        }
    }
}

// Weights rows x (nb blocks) of Q5_0, row after row, into rows / 16 groups of packed blocks.
static inline void pack(const row_q5_0 * src, int64_t rows, int64_t nb, block_q5_0x16 * dst) {
    for (int64_t g = 0; g < rows / ROWS; g++) {
        for (int64_t l = 0; l < nb; l++) {
            block_q5_0x16 & out = dst[g * nb + l];
            memset(out.qh, 0, sizeof(out.qh));
            for (int64_t r = 0; r < ROWS; r++) {
                const row_q5_0 & in = src[(g * ROWS + r) * nb + l];
                out.d[r] = in.d;
                specgen_packed_common::interleave(out.qs, r, in.qs);
                fifth_bits(out.qh, r, in.qh);
            }
        }
    }
}

}  // namespace specgen_packed_q5_0

#endif  // AVX2, F16C, FMA
