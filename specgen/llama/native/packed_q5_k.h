// specgen: Q5_K weights repacked at load, 16 rows interleaved, and specgen's own arithmetic for them.
//
// Why: as for Q4_K (packed_q4_k.h), whose arithmetic this is with five-bit codes: Q5_K is Q4_K's
// super-block (the same d, dmin, 6-bit scales and mins, the same low nibbles) plus a fifth bit per code
// (the derived smollm2 Q5_K_M holds its matrices in Q5_K). Per (row, column):
//
//   for each super-block b, in order:  isum = sum_c sc_c * sum_{i in c} w_i * y_i     (exact integers)
//                                      msum = sum_c m_c * sum_{i in c} y_i
//                                      acc  = fma(float(isum), d * dy, acc)
//                                      acc  = fma(-float(msum), dmin * dy, acc)
//
// where w_i in 0..31 are the row's codes (ggml's qs nibble plus 16 times qh's bit), the rest as in
// packed_q4_k.h (|isum| <= 8 * 63 * 32 * 31 * 128 < 2^26; its conversion rounds, the same way for every
// batch). Nothing in it depends on the number of columns, a column's place in the batch, the thread
// count or the instruction set: AVX2 and AVX-512 give the same bits. It rounds differently from
// ggml's vec_dot.
//
// Layout: llama.cpp's repack buffer (the same bytes as the Q5_K tensor: 16 rows x 176 bytes = 2,816 per
// super-block) holds packed_q4_k.h's block (d, dmin, the scale planes, the low nibbles) and the fifth
// bits in 512 bytes qh, arranged for the instruction set the build packs for. ggml's qh byte i holds,
// in bit c, the fifth bit of value i of chunk c.
//   AVX-512: 64 masks of 64 bits, qh[64 c + 8 t ..] bit 4 r + b = the fifth bit of row r's value
//            4 t + b of chunk c: one kmovq and one masked vpaddb of 16 give chunk c's code vector t.
//   AVX2:    ggml's qh bytes interleaved as the codes are, qh[64 t + 4 r + b] = row r's byte 4 t + b (the
//            same byte as the code's in every vector): one shift by 4 - c bits (within 16-bit lanes;
//            the bits that cross a byte are masked off) and one AND give chunk c's fifth bits.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, where
// packed_traits.h offers it to llama.cpp's repack buffer for 2-D Q5_K weights. It needs only a C++17
// compiler and <immintrin.h> (tests/test_packed_kernel.py compiles it alone, for AVX2 and AVX-512,
// against a scalar statement of the arithmetic above).
#pragma once

#include "packed_common.h"
#include "packed_q4_k.h"

#if defined(SPECGEN_PACKED_Q4_K)
#define SPECGEN_PACKED_Q5_K 1

namespace specgen_packed_q5_k {

using specgen_packed_common::ROWS;
using specgen_packed_common::column_q8_K;
using specgen_packed_q4_k::QK;
using specgen_packed_q4_k::EXTRA;
using specgen_packed_q4_k::extras;

// ggml's block, as stored (fp16 values as their bits): a weight row's (the column's: column_q8_K).
struct row_q5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK / 8]; uint8_t qs[QK / 2]; };
static_assert(sizeof(row_q5_K) == 176, "ggml's Q5_K block");

struct block_q5_Kx16 {
    uint16_t d[ROWS];
    uint16_t dmin[ROWS];
    uint32_t scales[3][ROWS];
    uint8_t qs[4][ROWS * 32];
    uint8_t qh[ROWS * QK / 8];
    static constexpr int MAX_CODE = 31;  // packed_q4_k.h's AVX2 code sums four pairs at a time
};
static_assert(sizeof(block_q5_Kx16) == ROWS * sizeof(row_q5_K), "the packed group fills the rows' bytes");

// Chunk c's code vectors (packed_q4_k.h's group finds this by the block's type): Q4_K's, plus 16
// where the fifth bit is set.
#if defined(SPECGEN_PACKED_VNNI)
static inline void codes(const block_q5_Kx16 & b, int c, __m512i * v) {
    specgen_packed_q4_k::nibbles(b, c, v);
    for (int t = 0; t < 8; t++) v[t] = specgen_packed_common::with_chunk_bit(v[t], b.qh, c, t, 4);
}
#else
static inline void codes(const block_q5_Kx16 & b, int c, int h, __m256i * v) {
    specgen_packed_q4_k::nibbles(b, c, h, v);
    for (int t = 0; t < 8; t++) v[t] = specgen_packed_common::with_chunk_bit(v[t], b.qh, c, t, h, 4);
}
#endif

// out[c][row] for the groups g0..g1 of the weights and every column c (packed_q4_k.h's product).
static inline void matmul(int64_t nb, const block_q5_Kx16 * w, int64_t g0, int64_t g1, const char * cols,
                          size_t row_bytes, const int32_t * ex, int64_t n, float * dst, int64_t ldc) {
    specgen_packed_q4_k::matmul(nb, w, g0, g1, cols, row_bytes, ex, n, dst, ldc);
}

// Weights rows x (nb super-blocks) of Q5_K, row after row, into rows / 16 groups of packed blocks.
static inline void pack(const row_q5_K * src, int64_t rows, int64_t nb, block_q5_Kx16 * dst) {
    for (int64_t g = 0; g < rows / ROWS; g++) {
        for (int64_t l = 0; l < nb; l++) {
            block_q5_Kx16 & out = dst[g * nb + l];
            memset(out.qh, 0, sizeof(out.qh));
            for (int64_t r = 0; r < ROWS; r++) {
                const row_q5_K & in = src[(g * ROWS + r) * nb + l];
                specgen_packed_q4_k::pack_row(out, r, in);
                specgen_packed_common::chunk_bits(out.qh, r, in.qh);
            }
        }
    }
}

}  // namespace specgen_packed_q5_k

#endif  // SPECGEN_PACKED_Q4_K
