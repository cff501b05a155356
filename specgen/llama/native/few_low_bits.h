// specgen: Q4_0, Q4_1, Q5_0 and Q5_1 weights, few columns; called from few_columns.h's
// matmul(); its helpers (scratch, fp16, hsum8, with_count, PREFETCH_ROWS) are few_common.h's.
#pragma once

#include "few_common.h"

#ifdef SPECGEN_FEW

namespace specgen_few {

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

// 32 5-bit fields: the nibbles, bit 4 from the 32 bits of qh.
static inline __m256i five_bits(const uint8_t * qs, const uint8_t * qh) {
    return _mm256_or_si256(nibbles(qs), _mm256_and_si256(bits(qh), _mm256_set1_epi8(0x10)));
}

// Each weight type: its block, the column block it pairs with, and its 32 stored codes as bytes; a
// signed type's values are its codes less `offset` (values<T>).
struct q4_0 {
    using block = block_q4_0;
    using column = block_q8_0;
    static constexpr bool is_signed = true;
    static constexpr int offset = 8;
    static inline __m256i codes(const block & b) { return nibbles(b.qs); }
};
struct q5_0 {
    using block = block_q5_0;
    using column = block_q8_0;
    static constexpr bool is_signed = true;
    static constexpr int offset = 16;
    static inline __m256i codes(const block & b) { return five_bits(b.qs, b.qh); }
};
struct q4_1 {
    using block = block_q4_1;
    using column = block_q8_1;
    static constexpr bool is_signed = false;
    static constexpr int offset = 0;
    static inline __m256i codes(const block & b) { return nibbles(b.qs); }
};
struct q5_1 {
    using block = block_q5_1;
    using column = block_q8_1;
    static constexpr bool is_signed = false;
    static constexpr int offset = 0;
    static inline __m256i codes(const block & b) { return five_bits(b.qs, b.qh); }
};

template <typename T>
static inline __m256i values(const typename T::block & b) {
    if constexpr (T::is_signed) return _mm256_sub_epi8(T::codes(b), _mm256_set1_epi8((char) T::offset));
    return T::codes(b);
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
// VNNI, signed types: vpdpbusd takes the codes (unsigned) as they are and starts from -offset times each
// lane's four column bytes: the same integer per lane as |x| times y with x's sign.
template <typename T>
static inline __m256i offset_sums(__m256i y) {
    const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), y);
    return _mm256_mullo_epi32(sums, _mm256_set1_epi32(-T::offset));
}
#endif

constexpr int GROUP = 8;  // columns per pass over the weights: 8 accumulators in 16 registers

struct packed {
    __m256i * q;     // [block][column]: the column's 32 bytes
    __m256 * d;      // [block][column]: its scale, broadcast
    __m256 * s;      // [block]: lane j = column j's d * sum(q) (Q8_1 only)
    __m256i * corr;  // [block][column]: offset_sums (signed types, VNNI only)
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
            const __m256 dx = _mm256_set1_ps(fp16(a[l].d));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            const __m256i ux = T::codes(a[l]);
            for (int j = 0; j < NC; j++) {
                const __m256i start = T::is_signed ? P.corr[l * NC + j] : _mm256_setzero_si256();
                const __m256i dot = _mm256_dpbusd_epi32(start, ux, P.q[l * NC + j]);  // the same integers
#else
            const __m256i x = values<T>(a[l]);
            const __m256i ux = T::is_signed ? _mm256_sign_epi8(x, x) : x;
            for (int j = 0; j < NC; j++) {
                const __m256i y = T::is_signed ? _mm256_sign_epi8(P.q[l * NC + j], x) : P.q[l * NC + j];
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
    static thread_local std::vector<char> bq, bd, bs, bc;
    const packed P = { scratch<__m256i>(bq, k * n), scratch<__m256>(bd, k * n), scratch<__m256>(bs, k),
                       scratch<__m256i>(bc, T::is_signed ? k * n : 0) };
    for (int64_t l = 0; l < k; l++) {
        alignas(32) float s[8] = { 0 };
        for (int j = 0; j < n; j++) {
            const typename T::column & b = B[ldb * j + l];
            P.q[l * n + j] = _mm256_loadu_si256((const __m256i *) b.qs);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            if constexpr (T::is_signed) P.corr[l * n + j] = offset_sums<T>(P.q[l * n + j]);
#endif
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
// enter, up to 8 columns, as their codes, each lane starting from offset_sums (as in the 256-bit VNNI
// code above); from 9, as absolute values against the column's bytes negated where the weight's are
// negative (the sign trick), which keeps the packed columns small enough for L1 (smollm2's Q4_0
// products at 16 columns: 31.5 against 34.7 ms with offset_sums; at 8: 17.5 against 16.4).
constexpr int GROUP512 = 16;  // columns per pass over the weights: 8 registers of accumulators
constexpr int CODES_UP_TO = 8;

struct packed512 {
    __m512i * q;     // [block][pair]: the pair's 2 x 32 bytes
    __m512 * d;      // [block][pair]: the two scales, each over its half
    __m512 * s;      // [block]: lane j = column j's d * sum(q) (Q8_1 only)
    __m512i * corr;  // [block][pair]: offset_sums of each half (signed types)
};

template <typename T, int NP>
static inline void rows_pass512(int64_t k, const typename T::block * A, int64_t lda, int64_t r0, int64_t r1,
                                const packed512 & P, float * C, int64_t ldc, int n) {
    constexpr bool CODES = T::is_signed && NP <= CODES_UP_TO / 2, SIGNS = T::is_signed && !CODES;
    for (int64_t i = r0; i < r1; i++) {
        __m512 acc[NP];
        for (int p = 0; p < NP; p++) acc[p] = _mm512_setzero_ps();
        __m512 summs = _mm512_setzero_ps();
        const typename T::block * a = A + lda * i;
        for (int64_t l = 0; l < k; l++) {
            _mm_prefetch((const char *) (a + lda * PREFETCH_ROWS + l), _MM_HINT_T0);
            const __m256i x = CODES ? T::codes(a[l]) : values<T>(a[l]);
            const __m512i xx = _mm512_inserti64x4(_mm512_castsi256_si512(x), x, 1);
            const __m512i ux = SIGNS ? _mm512_abs_epi8(xx) : xx;
            const __mmask64 neg = SIGNS ? _mm512_movepi8_mask(xx) : 0;
            const __m512 dx = _mm512_set1_ps(fp16(a[l].d));
            for (int p = 0; p < NP; p++) {
                const __m512i start = CODES ? P.corr[l * NP + p] : _mm512_setzero_si512();
                const __m512i y = SIGNS ? _mm512_mask_sub_epi8(P.q[l * NP + p], neg, _mm512_setzero_si512(), P.q[l * NP + p])
                                        : P.q[l * NP + p];
                const __m512i dot = _mm512_dpbusd_epi32(start, ux, y);
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
    static thread_local std::vector<char> bq, bd, bs, bc;
    const int np = (n + 1) / 2;
    const packed512 P = { scratch<__m512i>(bq, k * np), scratch<__m512>(bd, k * np), scratch<__m512>(bs, k),
                          scratch<__m512i>(bc, T::is_signed && n <= CODES_UP_TO ? k * np : 0) };
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
            if (T::is_signed && n <= CODES_UP_TO) {
                const __m256i lo = offset_sums<T>(_mm256_load_si256((const __m256i *) q));
                const __m256i hi = offset_sums<T>(_mm256_load_si256((const __m256i *) (q + 32)));
                P.corr[l * np + p] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            }
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

}  // namespace specgen_few

#endif  // SPECGEN_FEW
