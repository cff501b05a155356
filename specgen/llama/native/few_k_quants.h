// specgen: K-quant weights (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), few columns; called from few_columns.h's
// matmul(); its helpers (fp16, hsum8, with_count, PREFETCH_ROWS) are few_common.h's.
#pragma once

#include "few_common.h"
#include "few_low_bits.h"  // low_bits::GROUP, the columns per pass

#ifdef SPECGEN_FEW

namespace specgen_few {

// K-quant weights x Q8_K columns (256 values a block), 256-bit code on AVX2 and AVX-512 hosts alike
// (ggml's x86 vec_dot for these types is its AVX2 code on both). A weight block is unpacked once into
// eight 32-value chunks of unsigned bytes w[c] with their integer scales sc[c] (one per 32 values, or
// one per 16: the low and the high half of the register); per column, as ggml's AVX2 vec_dot:
// sumi = sum over c of sc[c] * (pairs, then fours of w[c] * y) in eight int32 lanes (exact: no
// saturation, |y| <= 128, w <= 63; the integer in each lane is ggml's, whatever order it is formed
// in), then acc += d * sumi with d = y.d * x.d rounded to float first. What differs by type is the
// offset or minimum term, each formed where and as ggml forms it:
// - Q2_K: mins times the column's 16-value sums, eight lanes, added to acc by its own fused
//   multiply-add with -y.d * x.dmin before the block's sumi;
// - Q3_K: values are w - 4 (w = the two low bits and the high bit); per chunk the 16-bit pair sums of
//   4 * y are taken from those of w * y before the scales multiply (ggml subtracts the same pairs);
// - Q4_K: mins times the column's 32-value sums, four lanes with their own fused multiply-add;
// - Q5_K: the same product summed to one integer, then one scalar fused multiply-add per block;
// - Q6_K: the -32 offset, 32 * scales times the column's 16-value sums, taken out of sumi.
namespace k_quants {

struct block_q2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };
struct block_q3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct block_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct block_q5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct block_q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct block_q8_K { float d; int8_t qs[256]; int16_t bsums[16]; };
static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110, "block_q2_K/q3_K layout");
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176, "block_q4_K/q5_K layout");
static_assert(sizeof(block_q6_K) == 210 && sizeof(block_q8_K) == 292, "block_q6_K/q8_K layout");

enum class offset { mins8, four, mins4, mins_scalar, minus32 };

struct unpacked {
    __m256i w[8];
    __m256i sc[8];
    __m256i scales16;  // Q6_K: the 16 scales; Q2_K: the 16 mins (int16)
    __m128i mins16;    // Q4_K, Q5_K: the 8 mins as int16
    float d, dmin;
};

// Scale per 16 values (`s`: 16 int8): chunk c's low 16 lanes take s[2c], its high 16 s[2c+1], picked
// from the scales widened to int16 as ggml's get_scale_shuffle_q3k picks them.
static inline void scales_by_16(__m128i s, unpacked & u) {
    const __m256i all = _mm256_cvtepi8_epi16(s);
    const __m256i half[2] = { _mm256_broadcastsi128_si256(_mm256_castsi256_si128(all)),
                              _mm256_broadcastsi128_si256(_mm256_extracti128_si256(all, 1)) };
    for (int c = 0; c < 8; c++) {
        const int lo = 2 * (c % 4), hi = lo + 1;  // int16 index in the half
        const __m256i pick = _mm256_set_m128i(_mm_set1_epi16((short) ((2 * hi + 1) << 8 | 2 * hi)),
                                              _mm_set1_epi16((short) ((2 * lo + 1) << 8 | 2 * lo)));
        u.sc[c] = _mm256_shuffle_epi8(half[c / 4], pick);
    }
}

// Q4_K and Q5_K's twelve bytes of 6-bit scales and mins (ggml's get_scale_shuffle_k4 decode, four at a
// time): eight scales, one per chunk, and the eight mins.
static inline void scales_and_mins(const uint8_t * bytes, unpacked & u) {
    uint32_t t[4];
    memcpy(t, bytes, 12);
    t[3] = ((t[2] >> 4) & 0x0f0f0f0f) | (((t[1] >> 6) & 0x03030303) << 4);
    const uint32_t aux = t[1] & 0x3f3f3f3f;
    t[1] = (t[2] & 0x0f0f0f0f) | (((t[0] >> 6) & 0x03030303) << 4);
    t[2] = aux;
    t[0] &= 0x3f3f3f3f;
    const uint8_t * scales = (const uint8_t *) &t[0];
    for (int c = 0; c < 8; c++) u.sc[c] = _mm256_set1_epi16(scales[c]);
    u.mins16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int) t[3], (int) t[2]));
}

// Bits `shift` and `shift + 1` of each byte (Q2_K, Q3_K's low bits), and bit `shift` (their high bit).
static inline __m256i two_bits(__m256i q, int shift) {
    return _mm256_and_si256(_mm256_srli_epi16(q, shift), _mm256_set1_epi8(3));
}
static inline __m256i one_bit(__m256i q, int shift) {
    return _mm256_and_si256(_mm256_srli_epi16(q, shift), _mm256_set1_epi8(1));
}

struct q2_K {
    using block = block_q2_K;
    static constexpr offset kind = offset::mins8;
    static inline void unpack(const block & x, unpacked & u) {
        for (int j = 0; j < 2; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *) (x.qs + 32 * j));
            for (int m = 0; m < 4; m++) u.w[4 * j + m] = two_bits(q, 2 * m);
        }
        const __m128i bytes = _mm_loadu_si128((const __m128i *) x.scales), m4 = _mm_set1_epi8(0xF);
        scales_by_16(_mm_and_si128(bytes, m4), u);
        u.scales16 = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(bytes, 4), m4));
        u.d = fp16(x.d);
        u.dmin = fp16(x.dmin);
    }
};

struct q3_K {
    using block = block_q3_K;
    static constexpr offset kind = offset::four;
    static inline void unpack(const block & x, unpacked & u) {
        const __m256i h = _mm256_loadu_si256((const __m256i *) x.hmask);
        for (int j = 0; j < 2; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *) (x.qs + 32 * j));
            for (int m = 0; m < 4; m++) {
                const int c = 4 * j + m;
                u.w[c] = _mm256_or_si256(two_bits(q, 2 * m), _mm256_slli_epi16(one_bit(h, c), 2));
            }
        }
        uint32_t a[3], t[4];
        memcpy(a, x.scales, 12);
        t[0] = (a[0] & 0x0f0f0f0f) | (((a[2] >> 0) & 0x03030303) << 4);
        t[1] = (a[1] & 0x0f0f0f0f) | (((a[2] >> 2) & 0x03030303) << 4);
        t[2] = ((a[0] >> 4) & 0x0f0f0f0f) | (((a[2] >> 4) & 0x03030303) << 4);
        t[3] = ((a[1] >> 4) & 0x0f0f0f0f) | (((a[2] >> 6) & 0x03030303) << 4);
        const __m128i s = _mm_set_epi32((int) t[3], (int) t[2], (int) t[1], (int) t[0]);  // (no store and reload)
        scales_by_16(_mm_sub_epi8(s, _mm_set1_epi8(32)), u);
        u.d = fp16(x.d);
    }
};

// Q4_K and Q5_K's low four bits per value (chunk 2j: the low nibbles of bytes 32j.., chunk 2j + 1: the
// high ones), their scales, mins and super-block scales.
template <typename B>
static inline void nibbles_scales_mins(const B & x, unpacked & u) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *) (x.qs + 32 * j));
        u.w[2 * j] = _mm256_and_si256(q, m4);
        u.w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    }
    scales_and_mins(x.scales, u);
    u.d = fp16(x.d);
    u.dmin = fp16(x.dmin);
}

struct q4_K {
    using block = block_q4_K;
    static constexpr offset kind = offset::mins4;
    static inline void unpack(const block & x, unpacked & u) { nibbles_scales_mins(x, u); }
};

struct q5_K {
    using block = block_q5_K;
    static constexpr offset kind = offset::mins_scalar;
    static inline void unpack(const block & x, unpacked & u) {
        nibbles_scales_mins(x, u);
        const __m256i h = _mm256_loadu_si256((const __m256i *) x.qh);  // chunk c's fifth bit: bit c
        for (int c = 0; c < 8; c++) u.w[c] = _mm256_or_si256(u.w[c], _mm256_slli_epi16(one_bit(h, c), 4));
    }
};

struct q6_K {
    using block = block_q6_K;
    static constexpr offset kind = offset::minus32;
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
        const __m128i scales = _mm_loadu_si128((const __m128i *) x.scales);
        scales_by_16(scales, u);
        u.scales16 = _mm256_cvtepi8_epi16(scales);
        u.d = fp16(x.d);
    }
};

template <typename T, int NC>
static inline void rows_pass(int64_t k, const typename T::block * A, int64_t lda, int64_t r0, int64_t r1,
                             const block_q8_K * B, int64_t ldb, float * C, int64_t ldc, int n) {
    constexpr size_t LINES = (sizeof(typename T::block) + 63) / 64;
    const __m256i four = _mm256_set1_epi8(4);
    for (int64_t i = r0; i < r1; i++) {
        __m256 acc[NC];
        __m128 accm[NC];
        float summs[NC];
        for (int j = 0; j < NC; j++) {
            acc[j] = _mm256_setzero_ps();
            accm[j] = _mm_setzero_ps();
            summs[j] = 0.0f;
        }
        const typename T::block * a = A + lda * i;
        for (int64_t l = 0; l < k; l++) {
            for (size_t line = 0; line < LINES; line++) {
                _mm_prefetch((const char *) (a + lda * PREFETCH_ROWS + l) + 64 * line, _MM_HINT_T0);
            }
            unpacked u;
            T::unpack(a[l], u);
            for (int j = 0; j < NC; j++) {
                const block_q8_K & y = B[ldb * j + l];
                const __m256i bsums = _mm256_loadu_si256((const __m256i *) y.bsums);
                if constexpr (T::kind == offset::mins8) {
                    const __m256i prod = _mm256_madd_epi16(u.scales16, bsums);
                    acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(-y.d * u.dmin), _mm256_cvtepi32_ps(prod), acc[j]);
                }
                __m256i sumi = _mm256_setzero_si256();
                for (int c = 0; c < 8; c++) {
                    const __m256i yc = _mm256_loadu_si256((const __m256i *) (y.qs + 32 * c));
                    __m256i p = _mm256_maddubs_epi16(u.w[c], yc);
                    if constexpr (T::kind == offset::four) p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(four, yc));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(u.sc[c], p));
                }
                if constexpr (T::kind == offset::mins4 || T::kind == offset::mins_scalar) {
                    const __m128i sums = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
                    const __m128i prod = _mm_madd_epi16(u.mins16, sums);
                    if constexpr (T::kind == offset::mins4) {
                        accm[j] = _mm_fmadd_ps(_mm_set1_ps(-y.d * u.dmin), _mm_cvtepi32_ps(prod), accm[j]);
                    } else {  // ggml: summs += dmin * the four lanes' sum, compiled to one fused multiply-add
                        const __m128i total = _mm_hadd_epi32(_mm_hadd_epi32(prod, _mm_setzero_si128()), _mm_setzero_si128());
                        const __m128 m = _mm_set_ss(-y.d * u.dmin);
                        summs[j] = _mm_cvtss_f32(_mm_fmadd_ss(m, _mm_cvtepi32_ps(total), _mm_set_ss(summs[j])));
                    }
                } else if constexpr (T::kind == offset::minus32) {
                    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bsums, u.scales16), 5));
                }
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(y.d * u.d), _mm256_cvtepi32_ps(sumi), acc[j]);
            }
        }
        for (int j = 0; j < NC && j < n; j++) {
            float v = hsum8(acc[j]);
            if constexpr (T::kind == offset::mins4) {  // as ggml reduces acc_m: (m0 + m2) + (m1 + m3)
                __m128 m = _mm_add_ps(accm[j], _mm_movehl_ps(accm[j], accm[j]));
                m = _mm_add_ss(m, _mm_movehdup_ps(m));
                v += _mm_cvtss_f32(m);
            } else if constexpr (T::kind == offset::mins_scalar) {
                v += summs[j];
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

}  // namespace specgen_few

#endif  // SPECGEN_FEW
