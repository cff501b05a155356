// specgen: Q8_0 x Q8_0 matrix products with few columns, for llama.cpp's CPU backend.
//
// Why: verifying a speculative tree needs logits on every row of the batch, so the output layer
// runs as a matrix product with one column per drafted token. For 2 or more columns ggml hands Q8_0
// weights to llamafile's tinyBLAS, whose 4x4 register tiles make the product compute-bound:
// gemma-3's 262,144 x 640 Q8_0 output layer took 17 ms for 2 columns against 6 for 1 (ggml's
// vec_dot), 24 for 4, 41 for 6 and 52 for 32, on two AVX-512 cores of an AMD EPYC. Here each weight
// row is read once for all columns, two columns to a 512-bit register: 3.7-4.5 ms for 1 to 6
// columns (the read of the weights), 6 for 8, 21 for 32, 53 for 80 (tinyBLAS: 109).
//
// Exactness: every output equals ggml's ggml_vec_dot_q8_0_q8_0 (the one-column path) bit for bit.
// Per (row, column) the same eight float lanes accumulate the same block products in the same
// order, d(row) * d(column) is rounded to float before the fused multiply-add, and the lanes are
// summed as hsum_float_8 sums them. So a batch's logits equal one-token decodes' logits as far as
// the output layer goes, which lossless greedy verification relies on.
//
// This file is specgen's own; specgen.build copies it next to llamafile's sgemm.cpp and calls it
// first for Q8_0 x Q8_0 products (see specgen/build.py, patch_llama_cpp).
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && !defined(_MSC_VER)
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__F16C__)
#define SPECGEN_Q8_0 "avx512vnni"
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECGEN_Q8_0 "avx2"
#endif
#endif

#ifdef SPECGEN_Q8_0

namespace specgen_q8_0 {

// SPECGEN_Q8_0=0 in the environment hands these products back to tinyBLAS (to compare the two).
static inline bool enabled() {
    static const bool on = [] {
        const char * env = getenv("SPECGEN_Q8_0");
        return env == nullptr || atoi(env) != 0;
    }();
    return on;
}

// Per-thread scratch for the packed columns, 64-byte aligned, grown as needed and then reused.
template <typename V>
static inline V * scratch(std::vector<char> & bytes, size_t count) {
    bytes.resize(count * sizeof(V) + 64);
    return (V *) (((uintptr_t) bytes.data() + 63) & ~(uintptr_t) 63);
}

// ggml's block_q8_0: an fp16 scale and 32 signed bytes.
struct block {
    uint16_t d;
    int8_t qs[32];
};
static_assert(sizeof(block) == 34, "block_q8_0 layout");

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

#if defined(__AVX512VNNI__)
// Two columns per 512-bit register, eight float lanes each. The weights enter vpdpbusd as unsigned
// bytes (a + 128); `corr` (-128 * the column's four-byte sums) takes the 128 back out exactly.
constexpr int GROUP = 16;  // columns per pass over the weights (8 registers of accumulators)
// Up to this many columns, which covers every tree specgen verifies (at most 80 rows, padded), one
// pass over the weights was faster than tinyBLAS in every shape measured: gemma-3's output layer
// took 84 against 172 ms for 128 columns (166 against 316 for 256). Bigger products are prompt
// processing, whose other shapes were not measured.
constexpr int64_t MAX_COLUMNS = 128;

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
constexpr int GROUP = 8;
// Where this code was faster than tinyBLAS on gemma-3's output layer: 50 against 65 ms for 33
// columns, 91 against 93 for 64, but 189 against 171 for 128.
constexpr int64_t MAX_COLUMNS = 64;

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

// C[ldc * j + i] = row i of A . column j of B, for this thread's share of A's m rows (ggml calls
// every thread with its ith of nth). Returns false where tinyBLAS should do the product instead.
static inline bool matmul(int64_t m, int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb,
                          float * C, int64_t ldc, int ith, int nth) {
    if (n < 1 || n > MAX_COLUMNS || !enabled()) {
        return false;
    }
    const int64_t r0 = m * ith / nth, r1 = m * (ith + 1) / nth;
    for (int64_t j0 = 0; j0 < n; j0 += GROUP) {
        const int cols = (int) (n - j0 < GROUP ? n - j0 : GROUP);
        columns(k, (const block *) A, lda, r0, r1, (const block *) B + ldb * j0, ldb, C + ldc * j0, ldc, cols);
    }
    return true;
}

}  // namespace specgen_q8_0

#endif  // SPECGEN_Q8_0
