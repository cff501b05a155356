// specgen: Q8_0 weights, few columns; called from few_columns.h's
// matmul(); its helpers (scratch, fp16, hsum8, with_count, PREFETCH_ROWS) are few_common.h's.
#pragma once

#include "few_common.h"

#ifdef SPECGEN_FEW

namespace specgen_few {

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

}  // namespace specgen_few

#endif  // SPECGEN_FEW
