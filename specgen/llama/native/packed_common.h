// specgen: what the packed weight kernels (packed_q4_0.h, packed_q4_1.h, packed_q5_0.h, packed_q5_1.h,
// packed_q8_0.h, packed_q3_k.h .. packed_q6_k.h) share: the group and block sizes, fp16 reads, the
// broadcast of a column block's four bytes, a block's eight vpdpbusd, the 4-bit kernels' interleaved
// codes, the column blocks' byte sums, the prefetch distance, the K-quants' Q8_K block, scale-decoding
// operations and extra code bits, and the dispatch that makes a pass's column count a template
// parameter. Plain C++17 over <immintrin.h>, compiled alone by tests/test_packed_kernel.py as part of
// each kernel.
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)

// Where the packed kernels take their 512-bit code (vpdpbusd, with AVX-512 BW and VL); else their AVX2 code.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define SPECGEN_PACKED_VNNI 1
#endif

namespace specgen_packed_common {

constexpr int64_t ROWS = 16;  // rows per group
constexpr int QK = 32;        // values per block

// Blocks to prefetch ahead (the next group's follow this one's): at a few columns the weights' stream
// from memory, not the arithmetic, sets the pace (gemma-3-270m's Q5_0 products at 8 columns, AVX-512,
// 1 thread: 3.5 ms without, 2.0-2.3 with 8 or 16 blocks ahead, 2.6 with 4).
constexpr int64_t PREFETCH = 16;

static inline float fp16(uint16_t h) { return _cvtsh_ss(h); }

// A column block's bytes 4 t .. 4 t + 3 in every 32-bit lane (one broadcast load); C has int8_t qs[32].
template <typename C>
static inline __m256i four256(const C & c, int t) {
    return _mm256_castps_si256(_mm256_broadcast_ss((const float *) (c.qs + 4 * t)));
}
#if defined(__AVX512F__)
template <typename C>
static inline __m512i four512(const C & c, int t) {
    return _mm512_castps_si512(_mm512_broadcastss_ps(_mm_load_ss((const float *) (c.qs + 4 * t))));
}
#if defined(SPECGEN_PACKED_VNNI)
// Eight code vectors v[] (16 rows' four codes per 32-bit lane, unsigned) times a column block's 32
// bytes, four to a lane, by vpdpbusd in two chains, the first from `start`: per row an exact integer
// (the kernels state why no lane can overflow).
template <typename C>
static inline __m512i dot512(__m512i start, const __m512i * v, const C & c) {
    __m512i s0 = _mm512_dpbusd_epi32(start, v[0], four512(c, 0));
    __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[1], four512(c, 1));
    for (int t = 2; t < 8; t += 2) {
        s0 = _mm512_dpbusd_epi32(s0, v[t], four512(c, t));
        s1 = _mm512_dpbusd_epi32(s1, v[t + 1], four512(c, t + 1));
    }
    return _mm512_add_epi32(s0, s1);
}
#endif
#endif

// The 4-bit kernels' (packed_q4_0.h, packed_q4_1.h, packed_q5_0.h) code bytes: 16 rows' 16 bytes per
// block, interleaved 4 bytes at a time (qs[64 t + 4 r + b] = row r's byte 4 t + b: low nibble code
// 4 t + b, high nibble code 16 + 4 t + b). interleave() writes row r's; nibbles512/256 unpack them into
// code vectors v[k] (k < 4: the low nibbles of qs[64 k ..], k >= 4: the high nibbles of qs[64 (k - 4)
// ..]), whose 32-bit lane r holds row r's codes 4 k .. 4 k + 3 (256 bits: rows 8 h .. 8 h + 7).
static inline void interleave(uint8_t * qs, int64_t r, const uint8_t * row_qs) {
    for (int t = 0; t < 4; t++) memcpy(qs + 64 * t + 4 * r, row_qs + 4 * t, 4);
}
static inline void nibbles256(const uint8_t * qs, int h, __m256i * v) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int t = 0; t < 4; t++) {
        const __m256i u = _mm256_loadu_si256((const __m256i *) (qs + 64 * t + 32 * h));
        v[t] = _mm256_and_si256(u, low);
        v[t + 4] = _mm256_and_si256(_mm256_srli_epi16(u, 4), low);
    }
}
#if defined(__AVX512F__) && defined(__AVX512BW__)
static inline void nibbles512(const uint8_t * qs, __m512i * v) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int t = 0; t < 4; t++) {
        const __m512i u = _mm512_loadu_si512((const void *) (qs + 64 * t));
        v[t] = _mm512_and_si512(u, low);
        v[t + 4] = _mm512_and_si512(_mm512_srli_epi16(u, 4), low);
    }
}
#endif

// Per column block: `factor` times the sum of its QK bytes (a kernel's offset, computed once per
// column block rather than once per row group); C has int8_t qs[QK].
template <typename C>
static inline void block_sums(const C * col, int64_t nb, int32_t factor, int32_t * out) {
    for (int64_t l = 0; l < nb; l++) {
        int32_t s = 0;
        for (int i = 0; i < QK; i++) s += col[l].qs[i];
        out[l] = factor * s;
    }
}

// Prefetch the block AHEAD blocks after *b (prefetches never fault past the end).
template <int64_t AHEAD = PREFETCH, typename B>
static inline void fetch_ahead(const B * b) {
    for (int i = 0; i < (int) sizeof(B); i += 64) _mm_prefetch((const char *) (b + AHEAD) + i, _MM_HINT_T0);
}

// The K-quant kernels' (packed_q4_k.h, packed_q6_k.h) side of a product: ggml's Q8_K column block
// (256 values, an F32 scale, the 16-value sums), the view of its 32 bytes from value 32 c that
// four256/four512/dot512 read (a member qs), and how far ahead a super-block group (2-3 KB) is fetched.
constexpr int QK_SUPER = 256;  // (not QK_K: ggml-common.h, which repack.cpp includes first, defines that macro)
struct column_q8_K { float d; int8_t qs[QK_SUPER]; int16_t bsums[QK_SUPER / 16]; };
static_assert(sizeof(column_q8_K) == 292, "ggml's Q8_K block");
struct chunk { const int8_t * qs; };
constexpr int64_t PREFETCH_K = 2;

// The operations the K-quant kernels' scale decoding (packed_q3_k.h, packed_q4_k.h) runs on 16 (8) rows'
// 32-bit words at once, for a template over the vector type.
struct ops256 {
    static __m256i set1(int v) { return _mm256_set1_epi32(v); }
    static __m256i and_(__m256i a, __m256i b) { return _mm256_and_si256(a, b); }
    static __m256i or_(__m256i a, __m256i b) { return _mm256_or_si256(a, b); }
    static __m256i srl(__m256i a, int n) { return _mm256_srli_epi32(a, n); }
    static __m256i sll(__m256i a, int n) { return _mm256_slli_epi32(a, n); }
    static __m256i sub8(__m256i a, __m256i b) { return _mm256_sub_epi8(a, b); }
};
#if defined(SPECGEN_PACKED_VNNI)
struct ops512 {
    static __m512i set1(int v) { return _mm512_set1_epi32(v); }
    static __m512i and_(__m512i a, __m512i b) { return _mm512_and_si512(a, b); }
    static __m512i or_(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
    static __m512i srl(__m512i a, int n) { return _mm512_srli_epi32(a, n); }
    static __m512i sll(__m512i a, int n) { return _mm512_slli_epi32(a, n); }
    static __m512i sub8(__m512i a, __m512i b) { return _mm512_sub_epi8(a, b); }
};
#endif

// The K-quants' extra code bits (Q3_K's hmask, Q5_K's qh: byte i holds, in bit c, the bit of value i of
// chunk c, for the 32 values of each of 8 chunks) of row r, laid out for this build's code: AVX-512,
// 64-bit masks bits[64 c + 8 t ..] with bit 4 r + b = the bit of row r's value 4 t + b of chunk c (zeroed
// before the group's first row); AVX2, the bytes interleaved as the codes are, bits[64 t + 4 r + b] =
// row r's byte 4 t + b.
static inline void chunk_bits(uint8_t * bits, int64_t r, const uint8_t * row_bits) {
    for (int i = 0; i < 32; i++) {  // value i of every chunk
#if defined(SPECGEN_PACKED_VNNI)
        const int t = i / 4, lane = 4 * (int) r + i % 4;
        for (int c = 0; c < 8; c++) {
            uint8_t & at = bits[64 * c + 8 * t + lane / 8];
            at = (uint8_t) (at | ((row_bits[i] >> c) & 1) << (lane % 8));
        }
#else
        bits[64 * (i / 4) + 4 * r + i % 4] = row_bits[i];
#endif
    }
}

// Code vector t of chunk c (its low bits `low`, per byte) with chunk_bits()'s bit for it added as
// 1 << to. AVX-512: a masked vpaddb. AVX2 (rows 8 h .. 8 h + 7): the bits' byte shifted so that bit c
// lands on bit `to` (within 16-bit lanes; the bits that cross a byte land elsewhere and are masked off).
#if defined(SPECGEN_PACKED_VNNI)
static inline __m512i with_chunk_bit(__m512i low, const uint8_t * bits, int c, int t, int to) {
    uint64_t mask;
    memcpy(&mask, bits + 64 * c + 8 * t, sizeof(mask));
    return _mm512_mask_add_epi8(low, _cvtu64_mask64(mask), low, _mm512_set1_epi8((char) (1 << to)));
}
#endif
static inline __m256i with_chunk_bit(__m256i low, const uint8_t * bits, int c, int t, int h, int to) {
    const __m256i q = _mm256_loadu_si256((const __m256i *) (bits + 64 * t + 32 * h));
    const __m128i left = _mm_cvtsi32_si128(c < to ? to - c : 0), right = _mm_cvtsi32_si128(c > to ? c - to : 0);
    const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(_mm256_sll_epi16(q, left), right), _mm256_set1_epi8((char) (1 << to)));
    return _mm256_or_si256(low, bit);
}

// Calls f(std::integral_constant<int, nc>()) for nc in 1..MAX: the accumulators' count a template
// parameter, so that they stay in registers.
template <int MAX, typename F>
static inline void with_columns(int nc, F && f) {
    static_assert(MAX == 4 || MAX == 8, "a case below for every count of columns");
    switch (nc) {
        case 1: f(std::integral_constant<int, 1>()); break;
        case 2: f(std::integral_constant<int, 2>()); break;
        case 3: f(std::integral_constant<int, 3>()); break;
        case 4: f(std::integral_constant<int, 4>()); break;
        default:
            if constexpr (MAX == 8) {
                switch (nc) {
                    case 5: f(std::integral_constant<int, 5>()); break;
                    case 6: f(std::integral_constant<int, 6>()); break;
                    case 7: f(std::integral_constant<int, 7>()); break;
                    case 8: f(std::integral_constant<int, 8>()); break;
                }
            }
    }
}

// For each row group g0..g1 and each pass of at most MAX of the n columns (Q-type rows `row_bytes`
// apart): pass(g, c0, nc, columns, out), where columns[j] is column c0 + j's blocks and out[j] where
// its results for group g go (dst: column c at dst + c * ldc, row r at + r).
template <int MAX, typename C, typename Pass>
static inline void over_groups(int64_t g0, int64_t g1, const char * cols, size_t row_bytes, int64_t n, float * dst,
                               int64_t ldc, Pass && pass) {
    for (int64_t g = g0; g < g1; g++) {
        for (int64_t c0 = 0; c0 < n; c0 += MAX) {
            const int nc = (int) (n - c0 < MAX ? n - c0 : MAX);
            const C * y[MAX];
            float * out[MAX];
            for (int j = 0; j < nc; j++) {
                y[j] = (const C *) (cols + (c0 + j) * row_bytes);
                out[j] = dst + (c0 + j) * ldc + g * ROWS;
            }
            pass(g, c0, nc, y, out);
        }
    }
}

// over_groups() for a kernel whose columns carry PER int32s per block (column c's at offs + c * nb * PER):
// group(N, g, columns, offsets, out) for each row group and pass, N the pass's column count as a type.
template <int MAX, typename C, int PER = 1, typename Group>
static inline void over_groups_with_offsets(int64_t nb, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                                            const int32_t * offs, int64_t n, float * dst, int64_t ldc, Group && group) {
    over_groups<MAX, C>(g0, g1, cols, row_bytes, n, dst, ldc,
        [&](int64_t g, int64_t c0, int nc, const C * const * y, float * const * out) {
            const int32_t * off[MAX];
            for (int j = 0; j < nc; j++) off[j] = offs + (c0 + j) * nb * PER;
            with_columns<MAX>(nc, [&](auto N) { group(N, g, y, off, out); });
        });
}

}  // namespace specgen_packed_common

#endif  // AVX2, F16C, FMA
