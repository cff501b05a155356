// specgen: Q3_K weights repacked at load, 16 rows interleaved, and specgen's own arithmetic for them.
//
// Why: gemma-3-270m-q2_k (a derived model, the default draft of configs/default.yaml) holds its
// attn_output and ffn_down in Q3_K. Its arithmetic is packed_q6_k.h's with three-bit codes and an
// offset of 4: per super-block, each 16-value group's sum of codes times bytes, times the group's
// scale, as one integer with the offset taken out once, and the float scale applied once:
//
//   for each super-block b, in order:  isum = sum_g s_g * sum_{i in g} w_i * y_i
//                                             - 4 * sum_g s_g * sum_{i in g} y_i        (exact integers)
//                                      acc  = fma(float(isum), d * dy, acc)
//
// per (row, column), where w_i in 0..7 are the row's codes (two low bits from qs, the third from
// hmask: the value is w_i - 4, as ggml's dequantize_row_q3_K reads it), s_g its group scale (ggml's
// 6-bit scale minus 32), d its fp16 super-block scale, y_i the column's Q8_K bytes and dy its float
// scale (|isum| <= 16 * 32 * 16 * 7 * 128 + 4 * 16 * 32 * 2048 < 2^24: its conversion is exact).
// Nothing in it depends on the number of columns, a column's place in the batch, the thread count or
// the instruction set: AVX2 and AVX-512 give the same bits. It rounds differently from ggml's vec_dot.
//
// Layout: llama.cpp's repack buffer (the same bytes as the Q3_K tensor: 16 rows x 110 bytes = 1,760 per
// super-block) holds, per group of 16 rows and per super-block, the 16 d (fp16), the rows' twelve scale
// bytes as three planes of 16 32-bit words (ggml's decode of them then runs on 16 rows at once, into
// packed_q6_k.h's four planes of signed scales), the low bits as ggml keeps them, interleaved four bytes
// at a time (qs[n][64 t + 4 r + b] = row r's qs byte 32 n + 4 t + b: chunk 4 n + j's codes are bits
// 2 j, 2 j + 1), and the third bits (ggml's hmask byte i holds, in bit c, that of value i of chunk c)
// arranged for the instruction set the build packs for:
//   AVX-512: 64 masks of 64 bits, hm[64 c + 8 t ..] bit 4 r + b = the bit of row r's value 4 t + b of
//            chunk c: one kmovq and one masked vpaddb of 4 give chunk c's code vector t.
//   AVX2:    ggml's hmask bytes interleaved as the codes are, hm[64 t + 4 r + b] = row r's byte 4 t + b:
//            one shift by 2 - c bits (within 16-bit lanes; the bits that cross a byte are masked off)
//            and one AND give chunk c's third bits.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, where
// packed_traits.h offers it to llama.cpp's repack buffer for 2-D Q3_K weights. It needs only a C++17
// compiler and <immintrin.h> (tests/test_packed_kernel.py compiles it alone, for AVX2 and AVX-512,
// against a scalar statement of the arithmetic above).
#pragma once

#include "packed_common.h"
#include "packed_q6_k.h"

#if defined(SPECGEN_PACKED_Q6_K)
#define SPECGEN_PACKED_Q3_K 1

namespace specgen_packed_q3_k {

using specgen_packed_common::ROWS;
using specgen_packed_common::column_q8_K;
using specgen_packed_q6_k::QK;
using specgen_packed_q6_k::EXTRA;
using specgen_packed_q6_k::extras;

// ggml's block, as stored (the fp16 scale as its bits): a weight row's (the column's: column_q8_K).
struct row_q3_K { uint8_t hmask[QK / 8]; uint8_t qs[QK / 4]; uint8_t scales[12]; uint16_t d; };
static_assert(sizeof(row_q3_K) == 110, "ggml's Q3_K block");

struct block_q3_Kx16 {
    uint16_t d[ROWS];
    uint32_t scales[3][ROWS];
    uint8_t qs[2][ROWS * 32];
    uint8_t hm[ROWS * QK / 8];
    static constexpr int OFFSET_SHIFT = 2;  // the codes' offset, 4, as a shift (packed_q6_k.h's group)
};
static_assert(sizeof(block_q3_Kx16) == ROWS * sizeof(row_q3_K), "the packed group fills the rows' bytes");

// ggml's decode of a row's twelve scale bytes (dequantize_row_q3_K's aux words), on vectors of rows'
// 32-bit words, minus 32: packed_q6_k.h's four planes of signed scales. O: the vector type's operations.
template <typename V, typename O>
static inline void decode_scales(const V * p, V * sc, O o) {
    const V k1 = o.set1(0x03030303), k2 = o.set1(0x0f0f0f0f), bias = o.set1(0x20202020);
    sc[0] = o.sub8(o.or_(o.and_(p[0], k2), o.sll(o.and_(p[2], k1), 4)), bias);
    sc[1] = o.sub8(o.or_(o.and_(p[1], k2), o.sll(o.and_(o.srl(p[2], 2), k1), 4)), bias);
    sc[2] = o.sub8(o.or_(o.and_(o.srl(p[0], 4), k2), o.sll(o.and_(o.srl(p[2], 4), k1), 4)), bias);
    sc[3] = o.sub8(o.or_(o.and_(o.srl(p[1], 4), k2), o.sll(o.and_(o.srl(p[2], 6), k1), 4)), bias);
}

#if defined(SPECGEN_PACKED_VNNI)
static inline void scales(const block_q3_Kx16 & b, __m512i * sc) {
    __m512i p[3];
    for (int k = 0; k < 3; k++) p[k] = _mm512_loadu_si512((const void *) b.scales[k]);
    decode_scales(p, sc, specgen_packed_common::ops512());
}

// Chunk c's codes for the 16 rows, four to a lane (t = 0..7: values 4 t .. 4 t + 3 of the chunk).
static inline void codes(const block_q3_Kx16 & b, int c, __m512i * v) {
    const __m512i two = _mm512_set1_epi8(0x03);
    for (int t = 0; t < 8; t++) {
        const __m512i q = _mm512_loadu_si512((const void *) (b.qs[c / 4] + 64 * t));
        v[t] = specgen_packed_common::with_chunk_bit(_mm512_and_si512(_mm512_srli_epi16(q, 2 * (c % 4)), two), b.hm, c, t, 2);
    }
}
#else
static inline void scales(const block_q3_Kx16 & b, int h, __m256i * sc) {
    __m256i p[3];
    for (int k = 0; k < 3; k++) p[k] = _mm256_loadu_si256((const __m256i *) (b.scales[k] + 8 * h));
    decode_scales(p, sc, specgen_packed_common::ops256());
}

// Chunk c's codes for rows 8 h .. 8 h + 7, four to a lane (t = 0..7: values 4 t .. 4 t + 3).
static inline void codes(const block_q3_Kx16 & b, int c, int h, __m256i * v) {
    const __m256i two = _mm256_set1_epi8(0x03);
    const __m128i shift = _mm_cvtsi32_si128(2 * (c % 4));
    for (int t = 0; t < 8; t++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *) (b.qs[c / 4] + 64 * t + 32 * h));
        v[t] = specgen_packed_common::with_chunk_bit(_mm256_and_si256(_mm256_srl_epi16(q, shift), two), b.hm, c, t, h, 2);
    }
}
#endif

// out[c][row] for the groups g0..g1 of the weights and every column c (packed_q6_k.h's product).
static inline void matmul(int64_t nb, const block_q3_Kx16 * w, int64_t g0, int64_t g1, const char * cols,
                          size_t row_bytes, const int32_t * ex, int64_t n, float * dst, int64_t ldc) {
    specgen_packed_q6_k::matmul(nb, w, g0, g1, cols, row_bytes, ex, n, dst, ldc);
}

// Weights rows x (nb super-blocks) of Q3_K, row after row, into rows / 16 groups of packed blocks.
static inline void pack(const row_q3_K * src, int64_t rows, int64_t nb, block_q3_Kx16 * dst) {
    for (int64_t g = 0; g < rows / ROWS; g++) {
        for (int64_t l = 0; l < nb; l++) {
            block_q3_Kx16 & out = dst[g * nb + l];
            memset(out.hm, 0, sizeof(out.hm));
            for (int64_t r = 0; r < ROWS; r++) {
                const row_q3_K & in = src[(g * ROWS + r) * nb + l];
                out.d[r] = in.d;
                for (int k = 0; k < 3; k++) memcpy(&out.scales[k][r], in.scales + 4 * k, 4);
                for (int t = 0; t < 8; t++) {
                    for (int n = 0; n < 2; n++) memcpy(out.qs[n] + 64 * t + 4 * r, in.qs + 32 * n + 4 * t, 4);
                }
                specgen_packed_common::chunk_bits(out.hm, r, in.hmask);
            }
        }
    }
}

}  // namespace specgen_packed_q3_k

#endif  // SPECGEN_PACKED_Q6_K
