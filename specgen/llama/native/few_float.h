// specgen: F32 and F16 weights, few columns; called from few_columns.h's
// matmul(); its helpers (scratch, fp16, hsum8, with_count, PREFETCH_ROWS) are few_common.h's.
#pragma once

#include "few_common.h"

#ifdef SPECGEN_FEW

namespace specgen_few {

// F32 weights x F32 columns and F16 weights x F16 columns: ggml_vec_dot_f32's and ggml_vec_dot_f16's
// arithmetic per (row, column), which is the same once F16 values are loaded as F32 (ggml's F32Cx16
// and F32Cx8 loads), on its own AVX-512 or AVX path (simd-mappings.h): GGML_F32_ARR = GGML_F16_ARR = 4
// accumulators of one register each, a step of 4
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
namespace floats {

constexpr int ARR = 4;
#if defined(__AVX512F__)
using vec = __m512;
constexpr int EPR = 16;
static inline vec load(const float * p) { return _mm512_loadu_ps(p); }
static inline vec load(const uint16_t * p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) p)); }
static inline void store(float * p, vec x) { _mm512_storeu_ps(p, x); }
static inline vec zero() { return _mm512_setzero_ps(); }
static inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline float lanes(vec x) { return _mm512_reduce_add_ps(x); }
#else
using vec = __m256;
constexpr int EPR = 8;
static inline vec load(const float * p) { return _mm256_loadu_ps(p); }
static inline vec load(const uint16_t * p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p)); }
static inline void store(float * p, vec x) { _mm256_storeu_ps(p, x); }
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

// One row, one column: ggml_vec_dot_f32 (W = float) or ggml_vec_dot_f16 (W = uint16_t, F16 bits).
template <typename W>
static inline float dot(int64_t k, const W * a, const W * y) {
    vec acc[ARR];
    for (int j = 0; j < ARR; j++) acc[j] = zero();
    for (int64_t s = 0; s < k; s += STEP)
        for (int j = 0; j < ARR; j++) acc[j] = fma(load(a + s + j * EPR), load(y + s + j * EPR), acc[j]);
    return reduce(acc);
}

// Rows i .. i+R times columns j0 .. j0+NC, chain after chain. With `fetch`, the R rows AHEAD tiles on
// are fetched into L2, R lines per step, in address order.
template <typename W, int R, int NC>
static inline void tile(int64_t k, const W * A, int64_t lda, int64_t i, const float * B, int64_t ldb, float * C,
                        int64_t ldc, int64_t j0, bool fetch) {
    constexpr int64_t PER_LINE = 64 / sizeof(W);
    vec part[R][NC][ARR];
    const W * next = A + lda * (i + AHEAD * R);
    int64_t row = 0, line = 0;
    for (int j = 0; j < ARR; j++) {
        vec acc[R][NC];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < NC; c++) acc[r][c] = zero();
        for (int64_t s = j * EPR; s < k; s += STEP) {
            if (fetch && row < R) {
                for (int r = 0; r < R; r++) {
                    _mm_prefetch((const char *) (next + lda * row + line * PER_LINE), _MM_HINT_T1);
                    if (++line == k / PER_LINE) line = 0, row++;
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

template <typename W, int R>
static inline void rows(int64_t n, int64_t k, const W * A, int64_t lda, int64_t i, const float * B, int64_t ldb,
                        float * C, int64_t ldc) {
    for (int64_t j0 = 0; j0 < n; j0 += TC) {
        const bool fetch = j0 == 0;
        switch (n - j0 < TC ? n - j0 : TC) {
            case 4: tile<W, R, 4>(k, A, lda, i, B, ldb, C, ldc, j0, fetch); break;
            case 3: tile<W, R, 3>(k, A, lda, i, B, ldb, C, ldc, j0, fetch); break;
            case 2: tile<W, R, 2>(k, A, lda, i, B, ldb, C, ldc, j0, fetch); break;
            default: tile<W, R, 1>(k, A, lda, i, B, ldb, C, ldc, j0, fetch); break;
        }
    }
}
static_assert(TC == 4, "rows() has a case for each width up to TC");

template <typename W>
static inline void matmul(int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, float * C,
                          int64_t ldc, int64_t r0, int64_t r1) {
    const W * a = (const W *) A;
    if (n == 1) {
        for (int64_t i = r0; i < r1; i++) C[i] = dot(k, a + lda * i, (const W *) B);
        return;
    }
    const float * b = (const float *) B;
    if constexpr (!std::is_same<W, float>::value) {  // F16 columns widened once (exactly), not once per tile
        static thread_local std::vector<char> bytes;
        float * wide = scratch<float>(bytes, (size_t) (n * k));
        for (int64_t j = 0; j < n; j++)
            for (int64_t s = 0; s < k; s += EPR) store(wide + k * j + s, load((const W *) B + ldb * j + s));
        b = wide, ldb = k;
    }
    int64_t i = r0;
    for (; i + TR <= r1; i += TR) rows<W, TR>(n, k, a, lda, i, b, ldb, C, ldc);
    for (; i < r1; i++) rows<W, 1>(n, k, a, lda, i, b, ldb, C, ldc);
}

}  // namespace floats

}  // namespace specgen_few

#endif  // SPECGEN_FEW
