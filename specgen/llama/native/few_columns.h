// specgen: quantized matrix products with few columns, for llama.cpp's CPU backend.
//
// Why: a decode of B tokens multiplies every weight matrix by B columns. For 2 or more columns
// llama.cpp hands quantized weights to llamafile's tinyBLAS or to the repacked GEMMs, which are
// compute-bound there and round differently from the one-column path (see specgen_invariant.h).
// Here each weight block is read and unpacked once for all the columns, and each column is
// accumulated exactly as ggml's one-column vec_dot accumulates it, so a column's result is the same
// bits whatever else was computed with it, and equal to llama.cpp's one-token decode.
//
// Exactness, per (row, column): the same eight float lanes take the same block products in the same
// order; a block's integer dot product is exact however it is formed (the byte products cannot
// saturate: |x| <= 31, |y| <= 127), the two scales are multiplied in float before the fused
// multiply-add, the min term of Q4_1/Q5_1 accumulates with one fused multiply-add per block (as
// ggml's compiled `summs += m * s` does with FMA), and the lanes are summed as hsum_float_8 sums
// them. Tests compare logits decoded alone and inside batches, bit for bit, on the real models.
//
// Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 have AVX-512 VNNI variants (two columns per 512-bit register);
// Q4_K and Q6_K use 256-bit code on both AVX2 and AVX-512 hosts; F32 follows ggml's own F32 path
// (512-bit where the host has AVX-512, else 256-bit). Without AVX2, FMA and F16C there is no kernel and
// invariance falls back to ggml's one-column code.
//
// This file is specgen's own; specgen.llama.build copies it next to llamafile's sgemm.cpp and
// calls it first for products of at most specgen::FEW_COLUMNS columns (see build.py).
#pragma once

#include "../specgen_invariant.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(_MSC_VER)
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__F16C__)
#define SPECGEN_FEW "avx512vnni"
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECGEN_FEW "avx2"
#endif
#endif

#ifdef SPECGEN_FEW

namespace specgen_few {

// Per-thread scratch for the packed columns, 64-byte aligned, grown as needed and then reused.
template <typename V>
static inline V * scratch(std::vector<char> & bytes, size_t count) {
    bytes.resize(count * sizeof(V) + 64);
    return (V *) (((uintptr_t) bytes.data() + 63) & ~(uintptr_t) 63);
}

// How many rows ahead to prefetch: one weight row is k blocks, read as one stream.
constexpr int64_t PREFETCH_ROWS = 4;

static inline float fp16(uint16_t h) { return _cvtsh_ss(h); }

// hsum_float_8 from ggml-cpu's x86 code: (x0+x4)+(x2+x6) + (x1+x5)+(x3+x7), in this order.
static inline float hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// Calls f(std::integral_constant<int, N>()) for N = count, 1 to 8: the number of accumulator
// registers is a template parameter so that they stay in registers.
template <typename F>
static inline void with_count(int count, F && f) {
    switch (count) {
        case 1: f(std::integral_constant<int, 1>()); break;
        case 2: f(std::integral_constant<int, 2>()); break;
        case 3: f(std::integral_constant<int, 3>()); break;
        case 4: f(std::integral_constant<int, 4>()); break;
        case 5: f(std::integral_constant<int, 5>()); break;
        case 6: f(std::integral_constant<int, 6>()); break;
        case 7: f(std::integral_constant<int, 7>()); break;
        case 8: f(std::integral_constant<int, 8>()); break;
    }
}

// Q8_0 weights x Q8_0 columns.
namespace q8_0 {

// ggml's block_q8_0: an fp16 scale and 32 signed bytes.
struct block {
    uint16_t d;
    int8_t qs[32];
};
static_assert(sizeof(block) == 34, "block_q8_0 layout");

#if defined(__AVX512VNNI__)
// Two columns per 512-bit register, eight float lanes each. The weights enter vpdpbusd as unsigned
// bytes (a + 128); `corr` (-128 * the column's four-byte sums) takes the 128 back out exactly.
constexpr int GROUP = 16;  // columns per pass over the weights (8 registers of accumulators)
// Up to this many columns, which covers every tree specgen verifies (at most 80 rows, padded), one
// pass over the weights was faster than tinyBLAS in every shape measured: gemma-3's output layer
// took 84 against 172 ms for 128 columns (166 against 316 for 256).

struct packed {
    __m512i * q;
    __m512i * corr;
    __m512 * d;
};

template <int NP>
static inline void rows_pass(int64_t k, const block * A, int64_t lda, int64_t r0, int64_t r1, const packed & P,
                             float * C, int64_t ldc, int n) {
    const __m512i x80 = _mm512_set1_epi8((char) 0x80);
    for (int64_t i = r0; i < r1; i++) {
        __m512 acc[NP];
        for (int p = 0; p < NP; p++) acc[p] = _mm512_setzero_ps();
        const block * a = A + lda * i;
        for (int64_t l = 0; l < k; l++) {
            _mm_prefetch((const char *) (a + lda * PREFETCH_ROWS + l), _MM_HINT_T0);
            const __m512i ua = _mm512_xor_si512(
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) a[l].qs)), x80);
            const __m512 da = _mm512_set1_ps(fp16(a[l].d));
            for (int p = 0; p < NP; p++) {
                const __m512i dot = _mm512_dpbusd_epi32(P.corr[l * NP + p], ua, P.q[l * NP + p]);
                acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(da, P.d[l * NP + p]), _mm512_cvtepi32_ps(dot), acc[p]);
            }
        }
        for (int p = 0; p < NP; p++) {
            const __m256 high = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(acc[p]), 1));
            C[ldc * (2 * p) + i] = hsum8(_mm512_castps512_ps256(acc[p]));
            if (2 * p + 1 < n) C[ldc * (2 * p + 1) + i] = hsum8(high);
        }
    }
}

static inline packed pack(int64_t k, const block * B, int64_t ldb, int n, int np) {
    static thread_local std::vector<char> bq, bc, bd;
    packed P = { scratch<__m512i>(bq, k * np), scratch<__m512i>(bc, k * np), scratch<__m512>(bd, k * np) };
    for (int64_t l = 0; l < k; l++) {
        for (int p = 0; p < np; p++) {
            alignas(64) int8_t q[64];
            alignas(64) int32_t c[16];
            alignas(64) float d[16];
            for (int h = 0; h < 2; h++) {
                const int j = 2 * p + h;
                const block * b = j < n ? B + ldb * j + l : nullptr;
                for (int t = 0; t < 8; t++) {
                    const int8_t * s = b ? b->qs + 4 * t : nullptr;
                    c[8 * h + t] = s ? -128 * (s[0] + s[1] + s[2] + s[3]) : 0;
                    d[8 * h + t] = b ? fp16(b->d) : 0.0f;
                }
                if (b) memcpy(q + 32 * h, b->qs, 32); else memset(q + 32 * h, 0, 32);
            }
            P.q[l * np + p] = _mm512_load_si512(q);
            P.corr[l * np + p] = _mm512_load_si512(c);
            P.d[l * np + p] = _mm512_load_ps(d);
        }
    }
    return P;
}

static inline void columns(int64_t k, const block * A, int64_t lda, int64_t r0, int64_t r1, const block * B,
                           int64_t ldb, float * C, int64_t ldc, int n) {
    const int np = (n + 1) / 2;
    const packed P = pack(k, B, ldb, n, np);
    with_count(np, [&](auto N) { rows_pass<decltype(N)::value>(k, A, lda, r0, r1, P, C, ldc, n); });
}
#else
// AVX2: one column per 256-bit register. Products as ggml's AVX2 vec_dot forms them: |a| times b
// with a's sign, summed in pairs (no saturation: Q8_0 bytes lie in -127..127) and then in fours.
// On gemma-3's output layer it was faster than tinyBLAS up to 64 columns (91 against 93 ms) and
// slower at 128 (189 against 171): kept up to specgen::FEW_COLUMNS for batch invariance.
constexpr int GROUP = 8;

struct packed {
    __m256i * q;
    __m256 * d;
};

template <int NC>
static inline void rows_pass(int64_t k, const block * A, int64_t lda, int64_t r0, int64_t r1, const packed & P,
                             float * C, int64_t ldc, int n) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = r0; i < r1; i++) {
        __m256 acc[NC];
        for (int j = 0; j < NC; j++) acc[j] = _mm256_setzero_ps();
        const block * a = A + lda * i;
        for (int64_t l = 0; l < k; l++) {
            _mm_prefetch((const char *) (a + lda * PREFETCH_ROWS + l), _MM_HINT_T0);
            const __m256i qa = _mm256_loadu_si256((const __m256i *) a[l].qs);
            const __m256i ua = _mm256_sign_epi8(qa, qa);
            const __m256 da = _mm256_set1_ps(fp16(a[l].d));
            for (int j = 0; j < NC; j++) {
                const __m256i sb = _mm256_sign_epi8(P.q[l * NC + j], qa);
                const __m256i dot = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(ua, sb));
                acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(da, P.d[l * NC + j]), _mm256_cvtepi32_ps(dot), acc[j]);
            }
        }
        for (int j = 0; j < NC && j < n; j++) C[ldc * j + i] = hsum8(acc[j]);
    }
}

static inline void columns(int64_t k, const block * A, int64_t lda, int64_t r0, int64_t r1, const block * B,
                           int64_t ldb, float * C, int64_t ldc, int n) {
    static thread_local std::vector<char> bq, bd;
    const packed P = { scratch<__m256i>(bq, k * n), scratch<__m256>(bd, k * n) };
    for (int64_t l = 0; l < k; l++) {
        for (int j = 0; j < n; j++) {
            P.q[l * n + j] = _mm256_loadu_si256((const __m256i *) B[ldb * j + l].qs);
            P.d[l * n + j] = _mm256_set1_ps(fp16(B[ldb * j + l].d));
        }
    }
    with_count(n, [&](auto N) { rows_pass<decltype(N)::value>(k, A, lda, r0, r1, P, C, ldc, n); });
}
#endif

static inline void matmul(int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, float * C,
                          int64_t ldc, int64_t r0, int64_t r1) {
    for (int64_t j0 = 0; j0 < n; j0 += GROUP) {
        const int cols = (int) (n - j0 < GROUP ? n - j0 : GROUP);
        columns(k, (const block *) A, lda, r0, r1, (const block *) B + ldb * j0, ldb, C + ldc * j0, ldc, cols);
    }
}

}  // namespace q8_0

// Q4_0, Q5_0 weights x Q8_0 columns and Q4_1, Q5_1 weights x Q8_1 columns (256-bit code, and 512-bit
// code with VNNI below). The weight block is unpacked to 32 bytes once; per column, as ggml's AVX2 vec_dot
// does it: for the signed types |x| times y with x's sign, for the unsigned ones x times y, summed in pairs and fours.
namespace low_bits {

struct block_q4_0 { uint16_t d; uint8_t qs[16]; };
struct block_q4_1 { uint16_t d, m; uint8_t qs[16]; };
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct block_q8_0 { uint16_t d; int8_t qs[32]; };
struct block_q8_1 { uint16_t d, s; int8_t qs[32]; };
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20, "block_q4 layout");
static_assert(sizeof(block_q5_0) == 22 && sizeof(block_q5_1) == 24, "block_q5 layout");
static_assert(sizeof(block_q8_0) == 34 && sizeof(block_q8_1) == 36, "block_q8 layout");

// 32 4-bit fields -> 32 bytes in 0..15: the low nibbles of the 16 bytes, then the high ones.
static inline __m256i nibbles(const uint8_t * q) {
    const __m128i t = _mm_loadu_si128((const __m128i *) q);
    const __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes, 0xFF where the bit is set.
static inline __m256i bits(const uint8_t * qh) {
    uint32_t x;
    memcpy(&x, qh, sizeof(x));
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int) x),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i set = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(set, _mm256_set1_epi64x(-1));
}

// Each weight type: its block, the column block it pairs with, and its 32 values as bytes.
struct q4_0 {
    using block = block_q4_0;
    using column = block_q8_0;
    static constexpr bool is_signed = true;
    static inline __m256i values(const block & b) { return _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8)); }
};
struct q5_0 {
    using block = block_q5_0;
    using column = block_q8_0;
    static constexpr bool is_signed = true;
    static inline __m256i values(const block & b) {
        return _mm256_or_si256(nibbles(b.qs), _mm256_andnot_si256(bits(b.qh), _mm256_set1_epi8((char) 0xF0)));
    }
};
struct q4_1 {
    using block = block_q4_1;
    using column = block_q8_1;
    static constexpr bool is_signed = false;
    static inline __m256i values(const block & b) { return nibbles(b.qs); }
};
struct q5_1 {
    using block = block_q5_1;
    using column = block_q8_1;
    static constexpr bool is_signed = false;
    static inline __m256i values(const block & b) {
        return _mm256_or_si256(nibbles(b.qs), _mm256_and_si256(bits(b.qh), _mm256_set1_epi8(0x10)));
    }
};

constexpr int GROUP = 8;  // columns per pass over the weights: 8 accumulators in 16 registers

struct packed {
    __m256i * q;  // [block][column]: the column's 32 bytes
    __m256 * d;   // [block][column]: its scale, broadcast
    __m256 * s;   // [block]: lane j = column j's d * sum(q) (Q8_1 only)
};

template <typename T, int NC>
static inline void rows_pass(int64_t k, const typename T::block * A, int64_t lda, int64_t r0, int64_t r1,
                             const packed & P, float * C, int64_t ldc, int n) {
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (int64_t i = r0; i < r1; i++) {
        __m256 acc[NC];
        for (int j = 0; j < NC; j++) acc[j] = _mm256_setzero_ps();
        __m256 summs = _mm256_setzero_ps();
        const typename T::block * a = A + lda * i;
        for (int64_t l = 0; l < k; l++) {
            _mm_prefetch((const char *) (a + lda * PREFETCH_ROWS + l), _MM_HINT_T0);
            const __m256i x = T::values(a[l]);
            const __m256i ux = T::is_signed ? _mm256_sign_epi8(x, x) : x;
            const __m256 dx = _mm256_set1_ps(fp16(a[l].d));
            for (int j = 0; j < NC; j++) {
                const __m256i y = T::is_signed ? _mm256_sign_epi8(P.q[l * NC + j], x) : P.q[l * NC + j];
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
                const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ux, y);  // the same integers
#else
                const __m256i dot = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(ux, y));
#endif
                acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dx, P.d[l * NC + j]), _mm256_cvtepi32_ps(dot), acc[j]);
            }
            if constexpr (!T::is_signed) {
                summs = _mm256_fmadd_ps(_mm256_set1_ps(fp16(a[l].m)), P.s[l], summs);
            }
        }
        alignas(32) float m[8];
        _mm256_store_ps(m, summs);
        for (int j = 0; j < NC && j < n; j++) {
            C[ldc * j + i] = T::is_signed ? hsum8(acc[j]) : hsum8(acc[j]) + m[j];
        }
    }
}

template <typename T>
static inline void columns(int64_t k, const typename T::block * A, int64_t lda, int64_t r0, int64_t r1,
                           const typename T::column * B, int64_t ldb, float * C, int64_t ldc, int n) {
    static thread_local std::vector<char> bq, bd, bs;
    const packed P = { scratch<__m256i>(bq, k * n), scratch<__m256>(bd, k * n), scratch<__m256>(bs, k) };
    for (int64_t l = 0; l < k; l++) {
        alignas(32) float s[8] = { 0 };
        for (int j = 0; j < n; j++) {
            const typename T::column & b = B[ldb * j + l];
            P.q[l * n + j] = _mm256_loadu_si256((const __m256i *) b.qs);
            P.d[l * n + j] = _mm256_set1_ps(fp16(b.d));
            if constexpr (!T::is_signed) s[j] = fp16(b.s);
        }
        P.s[l] = _mm256_load_ps(s);
    }
    with_count(n, [&](auto N) { rows_pass<T, decltype(N)::value>(k, A, lda, r0, r1, P, C, ldc, n); });
}

#if defined(__AVX512VNNI__)
// AVX-512 VNNI: two columns per 512-bit register (column 2p in the low half, 2p+1 in the high),
// each half the same eight lanes as above taking the same block products in the same order: the
// weight block's bytes are broadcast to both halves and vpdpbusd forms each lane's sum of four byte
// products at once (the same integers as pairs-then-fours: exact either way). The signed types
// negate the column's bytes where the weight's are negative and take the weight's absolute value,
// as the sign trick above does.
constexpr int GROUP512 = 16;  // columns per pass over the weights: 8 registers of accumulators

struct packed512 {
    __m512i * q;  // [block][pair]: the pair's 2 x 32 bytes
    __m512 * d;   // [block][pair]: the two scales, each over its half
    __m512 * s;   // [block]: lane j = column j's d * sum(q) (Q8_1 only)
};

template <typename T, int NP>
static inline void rows_pass512(int64_t k, const typename T::block * A, int64_t lda, int64_t r0, int64_t r1,
                                const packed512 & P, float * C, int64_t ldc, int n) {
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t i = r0; i < r1; i++) {
        __m512 acc[NP];
        for (int p = 0; p < NP; p++) acc[p] = _mm512_setzero_ps();
        __m512 summs = _mm512_setzero_ps();
        const typename T::block * a = A + lda * i;
        for (int64_t l = 0; l < k; l++) {
            _mm_prefetch((const char *) (a + lda * PREFETCH_ROWS + l), _MM_HINT_T0);
            const __m256i x = T::values(a[l]);
            const __m512i xx = _mm512_inserti64x4(_mm512_castsi256_si512(x), x, 1);
            const __m512i ux = T::is_signed ? _mm512_abs_epi8(xx) : xx;
            const __mmask64 neg = T::is_signed ? _mm512_movepi8_mask(xx) : 0;
            const __m512 dx = _mm512_set1_ps(fp16(a[l].d));
            for (int p = 0; p < NP; p++) {
                const __m512i y = T::is_signed ? _mm512_mask_sub_epi8(P.q[l * NP + p], neg, zero, P.q[l * NP + p])
                                               : P.q[l * NP + p];
                const __m512i dot = _mm512_dpbusd_epi32(zero, ux, y);
                acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(dx, P.d[l * NP + p]), _mm512_cvtepi32_ps(dot), acc[p]);
            }
            if constexpr (!T::is_signed) {
                summs = _mm512_fmadd_ps(_mm512_set1_ps(fp16(a[l].m)), P.s[l], summs);
            }
        }
        alignas(64) float m[16];
        _mm512_store_ps(m, summs);
        for (int p = 0; p < NP; p++) {
            const __m256 high = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(acc[p]), 1));
            const float lo = hsum8(_mm512_castps512_ps256(acc[p]));
            C[ldc * (2 * p) + i] = T::is_signed ? lo : lo + m[2 * p];
            if (2 * p + 1 < n) {
                const float hi = hsum8(high);
                C[ldc * (2 * p + 1) + i] = T::is_signed ? hi : hi + m[2 * p + 1];
            }
        }
    }
}

template <typename T>
static inline void columns512(int64_t k, const typename T::block * A, int64_t lda, int64_t r0, int64_t r1,
                              const typename T::column * B, int64_t ldb, float * C, int64_t ldc, int n) {
    static thread_local std::vector<char> bq, bd, bs;
    const int np = (n + 1) / 2;
    const packed512 P = { scratch<__m512i>(bq, k * np), scratch<__m512>(bd, k * np), scratch<__m512>(bs, k) };
    for (int64_t l = 0; l < k; l++) {
        alignas(64) float s[16] = { 0 };
        for (int p = 0; p < np; p++) {
            alignas(64) int8_t q[64];
            alignas(64) float d[16];
            for (int h = 0; h < 2; h++) {
                const int j = 2 * p + h;
                const typename T::column * b = j < n ? &B[ldb * j + l] : nullptr;
                if (b) memcpy(q + 32 * h, b->qs, 32); else memset(q + 32 * h, 0, 32);
                for (int t = 0; t < 8; t++) d[8 * h + t] = b ? fp16(b->d) : 0.0f;
                if constexpr (!T::is_signed) s[j] = b ? fp16(b->s) : 0.0f;
            }
            P.q[l * np + p] = _mm512_load_si512(q);
            P.d[l * np + p] = _mm512_load_ps(d);
        }
        P.s[l] = _mm512_load_ps(s);
    }
    with_count(np, [&](auto N) { rows_pass512<T, decltype(N)::value>(k, A, lda, r0, r1, P, C, ldc, n); });
}

template <typename T>
static inline void matmul(int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, float * C,
                          int64_t ldc, int64_t r0, int64_t r1) {
    const auto * a = (const typename T::block *) A;
    const auto * b = (const typename T::column *) B;
    if (n == 1) {  // one column: the 256-bit code (half a 512-bit register would idle)
        columns<T>(k, a, lda, r0, r1, b, ldb, C, ldc, 1);
        return;
    }
    for (int64_t j0 = 0; j0 < n; j0 += GROUP512) {
        const int cols = (int) (n - j0 < GROUP512 ? n - j0 : GROUP512);
        columns512<T>(k, a, lda, r0, r1, b + ldb * j0, ldb, C + ldc * j0, ldc, cols);
    }
}
#else
template <typename T>
static inline void matmul(int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, float * C,
                          int64_t ldc, int64_t r0, int64_t r1) {
    const auto * a = (const typename T::block *) A;
    const auto * b = (const typename T::column *) B;
    for (int64_t j0 = 0; j0 < n; j0 += GROUP) {
        const int cols = (int) (n - j0 < GROUP ? n - j0 : GROUP);
        columns<T>(k, a, lda, r0, r1, b + ldb * j0, ldb, C + ldc * j0, ldc, cols);
    }
}
#endif

}  // namespace low_bits

// F32 weights x F32 columns: ggml_vec_dot_f32's arithmetic per (row, column), its own AVX-512 or
// AVX path (simd-mappings.h): GGML_F32_ARR = 4 accumulators of one register each, a step of 4
// registers' worth of values at a time, accumulator j taking the j-th register of every step by
// fused multiply-add, then x0 + x2, x1 + x3, their sum, and that register's lanes summed as
// GGML_F32_VEC_REDUCE sums them. Products whose k is not a whole number of steps (ggml adds the
// leftovers one by one) stay with ggml.
// One column: ggml's loop, the row read front to back. Two or more: the four accumulators are four
// independent chains, computed one after the other for a tile of TR rows and up to TC columns
// (TR*TC registers of sums; each weight load serves TC columns, each column load TR rows); each row
// is read from memory once, the tile's later passes finding it in L1, and the rows two tiles on are
// fetched into L2 line by line meanwhile (the hardware's prefetcher does not follow rows read a line
// in four). Measured on a Zen 4 (gemma-3-270m's F32 output layer, one thread, docs/results/profile):
// 8 columns in 49.5 ms against 84.5 for ggml's one-column code, 31 for one column; from 8 columns
// the multiply-adds, not memory, set the cost.
namespace f32 {

constexpr int ARR = 4;
#if defined(__AVX512F__)
using vec = __m512;
constexpr int EPR = 16;
static inline vec load(const float * p) { return _mm512_loadu_ps(p); }
static inline vec zero() { return _mm512_setzero_ps(); }
static inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline float lanes(vec x) { return _mm512_reduce_add_ps(x); }
#else
using vec = __m256;
constexpr int EPR = 8;
static inline vec load(const float * p) { return _mm256_loadu_ps(p); }
static inline vec zero() { return _mm256_setzero_ps(); }
static inline vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline float lanes(vec x) {
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}
#endif
// GGML_F32_VEC_REDUCE: x0 + x2, x1 + x3, their sum, then the register's lanes as ggml sums them.
static inline float reduce(vec * x) {
    x[0] = add(x[0], x[2]);
    x[1] = add(x[1], x[3]);
    return lanes(add(x[0], x[1]));
}
constexpr int64_t STEP = ARR * EPR;
constexpr int TR = 2, TC = 4;  // 8 registers of sums, 2 of weights, 4 of columns: within AVX2's 16
constexpr int AHEAD = 2;       // tiles

// One row, one column: ggml_vec_dot_f32.
static inline float dot(int64_t k, const float * a, const float * y) {
    vec acc[ARR];
    for (int j = 0; j < ARR; j++) acc[j] = zero();
    for (int64_t s = 0; s < k; s += STEP)
        for (int j = 0; j < ARR; j++) acc[j] = fma(load(a + s + j * EPR), load(y + s + j * EPR), acc[j]);
    return reduce(acc);
}

// Rows i .. i+R times columns j0 .. j0+NC, chain after chain. With `fetch`, the R rows AHEAD tiles on
// are fetched into L2, R lines per step, in address order.
template <int R, int NC>
static inline void tile(int64_t k, const float * A, int64_t lda, int64_t i, const float * B, int64_t ldb, float * C,
                        int64_t ldc, int64_t j0, bool fetch) {
    vec part[R][NC][ARR];
    const float * next = A + lda * (i + AHEAD * R);
    int64_t row = 0, line = 0;
    for (int j = 0; j < ARR; j++) {
        vec acc[R][NC];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < NC; c++) acc[r][c] = zero();
        for (int64_t s = j * EPR; s < k; s += STEP) {
            if (fetch) {
                for (int r = 0; r < R; r++) {
                    _mm_prefetch((const char *) (next + lda * row + line * 16), _MM_HINT_T1);
                    if (++line == k / 16) line = 0, row++;
                }
            }
            vec w[R], y[NC];
            for (int r = 0; r < R; r++) w[r] = load(A + lda * (i + r) + s);
            for (int c = 0; c < NC; c++) y[c] = load(B + ldb * (j0 + c) + s);
            for (int r = 0; r < R; r++)
                for (int c = 0; c < NC; c++) acc[r][c] = fma(w[r], y[c], acc[r][c]);
        }
        for (int r = 0; r < R; r++)
            for (int c = 0; c < NC; c++) part[r][c][j] = acc[r][c];
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++) C[ldc * (j0 + c) + i + r] = reduce(part[r][c]);
}

template <int R>
static inline void rows(int64_t n, int64_t k, const float * A, int64_t lda, int64_t i, const float * B, int64_t ldb,
                        float * C, int64_t ldc) {
    for (int64_t j0 = 0; j0 < n; j0 += TC) {
        const bool fetch = j0 == 0;
        switch (n - j0 < TC ? n - j0 : TC) {
            case 4: tile<R, 4>(k, A, lda, i, B, ldb, C, ldc, j0, fetch); break;
            case 3: tile<R, 3>(k, A, lda, i, B, ldb, C, ldc, j0, fetch); break;
            case 2: tile<R, 2>(k, A, lda, i, B, ldb, C, ldc, j0, fetch); break;
            default: tile<R, 1>(k, A, lda, i, B, ldb, C, ldc, j0, fetch); break;
        }
    }
}
static_assert(TC == 4, "rows() has a case for each width up to TC");

static inline void matmul(int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, float * C,
                          int64_t ldc, int64_t r0, int64_t r1) {
    const float * a = (const float *) A;
    const float * b = (const float *) B;
    if (n == 1) {
        for (int64_t i = r0; i < r1; i++) C[i] = dot(k, a + lda * i, b);
        return;
    }
    int64_t i = r0;
    for (; i + TR <= r1; i += TR) rows<TR>(n, k, a, lda, i, b, ldb, C, ldc);
    for (; i < r1; i++) rows<1>(n, k, a, lda, i, b, ldb, C, ldc);
}

}  // namespace f32

// Q4_K and Q6_K weights x Q8_K columns (256 values a block), 256-bit code. A weight block is
// unpacked once into eight 32-value chunks of unsigned bytes w[c] with their integer scales sc[c];
// per column, as ggml's AVX2 vec_dot: sumi = sum over c of sc[c] * (pairs, then fours of w[c] * y)
// in eight int32 lanes (exact: no saturation, |y| <= 128, w <= 63), the block's minimum term
// (Q4_K: mins times the column's 32-value sums, four lanes with their own fused multiply-add; Q6_K:
// the -32 offset, 32 * scales times the column's 16-value sums, taken out of sumi), then
// acc += d * sumi with d = y.d * x.d rounded to float first.
namespace k_quants {

struct block_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct block_q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct block_q8_K { float d; int8_t qs[256]; int16_t bsums[16]; };
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q6_K) == 210, "block_q4_K/q6_K layout");
static_assert(sizeof(block_q8_K) == 292, "block_q8_K layout");

struct unpacked {
    __m256i w[8];
    __m256i sc[8];
    __m256i scales16;  // Q6_K: the 16 scales as int16
    __m128i mins16;    // Q4_K: the 8 mins as int16
    float d, dmin;
};

struct q4_K {
    using block = block_q4_K;
    static constexpr bool has_min = true;
    static inline void unpack(const block & x, unpacked & u) {
        uint32_t t[4];
        memcpy(t, x.scales, 12);
        // ggml's 6-bit scale and min decode (get_scale_min_k4, four at a time)
        t[3] = ((t[2] >> 4) & 0x0f0f0f0f) | (((t[1] >> 6) & 0x03030303) << 4);
        const uint32_t aux = t[1] & 0x3f3f3f3f;
        t[1] = (t[2] & 0x0f0f0f0f) | (((t[0] >> 6) & 0x03030303) << 4);
        t[2] = aux;
        t[0] &= 0x3f3f3f3f;
        const uint8_t * scales = (const uint8_t *) &t[0];
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *) (x.qs + 32 * j));
            u.w[2 * j] = _mm256_and_si256(q, m4);
            u.w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            u.sc[2 * j] = _mm256_set1_epi16(scales[2 * j]);
            u.sc[2 * j + 1] = _mm256_set1_epi16(scales[2 * j + 1]);
        }
        u.mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *) &t[2]));
        u.d = fp16(x.d);
        u.dmin = fp16(x.dmin);
    }
};

struct q6_K {
    using block = block_q6_K;
    static constexpr bool has_min = false;
    static inline void unpack(const block & x, unpacked & u) {
        const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
        for (int j = 0; j < 2; j++) {
            const __m256i l1 = _mm256_loadu_si256((const __m256i *) (x.ql + 64 * j));
            const __m256i l2 = _mm256_loadu_si256((const __m256i *) (x.ql + 64 * j + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *) (x.qh + 32 * j));
            u.w[4 * j + 0] = _mm256_or_si256(_mm256_and_si256(l1, m15), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
            u.w[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(l2, m15),
                                             _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(12)), 2));
            u.w[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                                             _mm256_and_si256(h, _mm256_set1_epi8(48)));
            u.w[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m15),
                                             _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(-64)), 2));
        }
        for (int c = 0; c < 8; c++) {  // 16 values to a scale: two scales to a chunk
            u.sc[c] = _mm256_insertf128_si256(_mm256_castsi128_si256(_mm_set1_epi16(x.scales[2 * c])),
                                              _mm_set1_epi16(x.scales[2 * c + 1]), 1);
        }
        u.scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) x.scales));
        u.d = fp16(x.d);
    }
};

template <typename T, int NC>
static inline void rows_pass(int64_t k, const typename T::block * A, int64_t lda, int64_t r0, int64_t r1,
                             const block_q8_K * B, int64_t ldb, float * C, int64_t ldc, int n) {
    for (int64_t i = r0; i < r1; i++) {
        __m256 acc[NC];
        __m128 accm[NC];
        for (int j = 0; j < NC; j++) {
            acc[j] = _mm256_setzero_ps();
            accm[j] = _mm_setzero_ps();
        }
        const typename T::block * a = A + lda * i;
        for (int64_t l = 0; l < k; l++) {
            _mm_prefetch((const char *) (a + lda * PREFETCH_ROWS + l), _MM_HINT_T0);
            _mm_prefetch((const char *) (a + lda * PREFETCH_ROWS + l) + 64, _MM_HINT_T0);
            _mm_prefetch((const char *) (a + lda * PREFETCH_ROWS + l) + 128, _MM_HINT_T0);
            unpacked u;
            T::unpack(a[l], u);
            for (int j = 0; j < NC; j++) {
                const block_q8_K & y = B[ldb * j + l];
                __m256i sumi = _mm256_setzero_si256();
                for (int c = 0; c < 8; c++) {
                    const __m256i yc = _mm256_loadu_si256((const __m256i *) (y.qs + 32 * c));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(u.sc[c], _mm256_maddubs_epi16(u.w[c], yc)));
                }
                const __m256i bsums = _mm256_loadu_si256((const __m256i *) y.bsums);
                if constexpr (T::has_min) {
                    const __m128i sums = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
                    const __m128i prod = _mm_madd_epi16(u.mins16, sums);
                    accm[j] = _mm_fmadd_ps(_mm_set1_ps(-y.d * u.dmin), _mm_cvtepi32_ps(prod), accm[j]);
                } else {
                    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bsums, u.scales16), 5));
                }
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(y.d * u.d), _mm256_cvtepi32_ps(sumi), acc[j]);
            }
        }
        for (int j = 0; j < NC && j < n; j++) {
            float v = hsum8(acc[j]);
            if constexpr (T::has_min) {  // as ggml reduces acc_m: (m0 + m2) + (m1 + m3)
                __m128 m = _mm_add_ps(accm[j], _mm_movehl_ps(accm[j], accm[j]));
                m = _mm_add_ss(m, _mm_movehdup_ps(m));
                v += _mm_cvtss_f32(m);
            }
            C[ldc * j + i] = v;
        }
    }
}

template <typename T>
static inline void matmul(int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, float * C,
                          int64_t ldc, int64_t r0, int64_t r1) {
    const auto * a = (const typename T::block *) A;
    const auto * b = (const block_q8_K *) B;
    for (int64_t j0 = 0; j0 < n; j0 += low_bits::GROUP) {
        const int cols = (int) (n - j0 < low_bits::GROUP ? n - j0 : low_bits::GROUP);
        with_count(cols, [&](auto N) {
            rows_pass<T, decltype(N)::value>(k, a, lda, r0, r1, b + ldb * j0, ldb, C + ldc * j0, ldc, cols);
        });
    }
}

}  // namespace k_quants

// Whether a weight of this type should stay in ggml's own layout (not be repacked at load) because a
// kernel here reads it: the repacked GEMV/GEMM would otherwise take its products.
static inline bool keeps_layout(ggml_type type) {
    if (!specgen::current().invariant) return false;
    return (type == GGML_TYPE_Q4_0 && specgen::kernel_on("q4_0")) ||
           (type == GGML_TYPE_Q4_K && specgen::kernel_on("q4_k"));
}

// What this build computes with specgen's kernels, for llama.cpp's system info (`specgen doctor`):
// the instruction set, then the weight types whose kernel is on, or "off".
static inline const char * describe() {
    static char text[96] = "";
    if (!text[0]) {
        const char * all[] = { "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k", "f32" };
        size_t n = (size_t) snprintf(text, sizeof(text), "%s:", SPECGEN_FEW);
        const size_t bare = n;
        for (const char * t : all) {
            if (specgen::current().invariant && specgen::kernel_on(t) && n + 6 < sizeof(text)) {
                n += (size_t) snprintf(text + n, sizeof(text) - n, " %s", t);
            }
        }
        if (n == bare) snprintf(text, sizeof(text), "off");
    }
    return text;
}

// C[ldc * j + i] = row i of A . column j of B (A: weights of type `a`, B: the columns quantized to
// its vec_dot type `b`), for this thread's share of A's m rows (ggml calls every thread with its ith
// of nth). Returns false where llama.cpp's own code should do the product.
static inline bool matmul(int64_t m, int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb,
                          float * C, int64_t ldc, ggml_type a, ggml_type b, int ith, int nth) {
    if (!specgen::invariant(n)) {
        return false;
    }
    const int64_t r0 = m * ith / nth, r1 = m * (ith + 1) / nth;
    if (a == GGML_TYPE_Q8_0 && b == GGML_TYPE_Q8_0 && specgen::kernel_on("q8_0")) {
        q8_0::matmul(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q4_0 && b == GGML_TYPE_Q8_0 && specgen::kernel_on("q4_0")) {
        low_bits::matmul<low_bits::q4_0>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q5_0 && b == GGML_TYPE_Q8_0 && specgen::kernel_on("q5_0")) {
        low_bits::matmul<low_bits::q5_0>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q4_1 && b == GGML_TYPE_Q8_1 && specgen::kernel_on("q4_1")) {
        low_bits::matmul<low_bits::q4_1>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q5_1 && b == GGML_TYPE_Q8_1 && specgen::kernel_on("q5_1")) {
        low_bits::matmul<low_bits::q5_1>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q4_K && b == GGML_TYPE_Q8_K && specgen::kernel_on("q4_k")) {
        k_quants::matmul<k_quants::q4_K>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q6_K && b == GGML_TYPE_Q8_K && specgen::kernel_on("q6_k")) {
        k_quants::matmul<k_quants::q6_K>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_F32 && b == GGML_TYPE_F32 && k % f32::STEP == 0 && specgen::kernel_on("f32")) {
        f32::matmul(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else {
        return false;
    }
    return true;
}

}  // namespace specgen_few

#endif  // SPECGEN_FEW
