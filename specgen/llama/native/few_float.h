// specgen: F32 and F16 weights, few columns; called from few_columns.h's
// matmul(); its helpers (scratch, fp16, hsum8, with_count, PREFETCH_ROWS) are few_common.h's.
#pragma once

#include "few_common.h"

#ifdef SPECGEN_FEW

namespace specgen_few {

// The columns as F32: F32 columns as they are; F16 ones widened (exactly) once per product, not once
// per tile, into per-thread scratch (`ldb` becomes k). k is a multiple of 8 wherever this is called.
template <typename W>
static inline const float * columns(int64_t n, int64_t k, const void * B, int64_t & ldb) {
    if constexpr (std::is_same<W, float>::value) {
        return (const float *) B;
    } else {
        static thread_local std::vector<char> bytes;
        float * wide = scratch<float>(bytes, (size_t) (n * k));
        for (int64_t j = 0; j < n; j++)
            for (int64_t s = 0; s < k; s += 8)
                _mm256_storeu_ps(wide + k * j + s,
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) ((const W *) B + ldb * j + s))));
        ldb = k;
        return wide;
    }
}

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
static inline vec zero() { return _mm512_setzero_ps(); }
static inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline float lanes(vec x) { return _mm512_reduce_add_ps(x); }
#else
using vec = __m256;
constexpr int EPR = 8;
static inline vec load(const float * p) { return _mm256_loadu_ps(p); }
static inline vec load(const uint16_t * p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p)); }
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
    const float * b = columns<W>(n, k, B, ldb);
    int64_t i = r0;
    for (; i + TR <= r1; i += TR) rows<W, TR>(n, k, a, lda, i, b, ldb, C, ldc);
    for (; i < r1; i++) rows<W, 1>(n, k, a, lda, i, b, ldb, C, ldc);
}

}  // namespace floats

#if defined(__AVX512F__)
// AVX-512, `lanes`: specgen's own arithmetic for F32 weights x F32 columns and F16 weights x F16 columns (F16
// values widened exactly to F32), the same for any number of columns, any thread count and any place
// in the batch. Per (row, column), 16 lane sums: lane l takes the products of elements l, l + 16,
// l + 32, ... in that order, each by one fused multiply-add (so k must be a multiple of 16); then
// lanes l and l + 8 are added, then l and l + 4, l and l + 2, and the last two.
// Why not ggml's vec_dot_f32 (four accumulators of one register, the row read in steps of four)? Its
// four chains make a tile of rows and columns either hold four times the sums or read each row in
// four passes over every fourth cache line; one chain per lane reads each row front to back, once for
// all the columns of a tile, so a few columns cost little more than one. Measured on an AMD EPYC with
// AVX-512, one thread, gemma-3-270m F32 with its screened output layer, a decode of 1 / 2 / 4 / 8
// tokens after 256: ggml's arithmetic (`floats`) 17.0 / 24.2 / 26.5 / 40.8 ms, this 17.6-18.4 / 19.4 /
// 23 / 34 (one column is a little slower: one chain of sums per lane against ggml's four).
// AVX2 hosts keep ggml's arithmetic (`floats`): the same lanes in two registers of 8 ran slower there
// than ggml's own loop (11.2 against 12.2-13.8 ms for one column, 15 against 21 for two).
// SPECGEN_KERNELS names it f32x16 (F32) and f16x16 (F16); without them, `floats` does these products.
namespace lanes {

#define SPECGEN_UNROLL _Pragma("GCC unroll 32")  // loops over registers, fully unrolled: they stay registers

constexpr int64_t STEP = 16;  // the lanes: k must be a multiple of this
constexpr int TC = 4;         // columns per tile, at most (tiles of 8 ran slower than two of 4)
using floats::vec;  // this namespace is AVX-512 only: floats' 512-bit register, loads and zero
using floats::load;
using floats::zero;

// Rows per tile for NC columns. One or two columns: one row at a time, read as one stream (in a decode,
// tiles of 2 to 8 rows ran slower: 19.5-22 against 18 ms for gemma-3-270m F32's one-token decode);
// from three, where the multiply-adds set the pace, 4 rows (NC * 4 registers of sums, 4 of weights,
// one of a column).
template <int NC> constexpr int rows_for() { return NC <= 2 ? 1 : 4; }

// l + (l + 8), then l + (l + 4), l + (l + 2), and the last two.
static inline float reduce(vec x) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

// Rows i .. i+R times columns j0 .. j0+NC, the rows read front to back once. From three columns (where
// the multiply-adds, not memory, set the pace) the next tile's rows are fetched meanwhile.
template <typename W, int R, int NC>
static inline void tile(int64_t k, const W * A, int64_t lda, int64_t i, const float * B, int64_t ldb, float * C,
                        int64_t ldc, int64_t j0) {
    vec acc[R][NC];
    SPECGEN_UNROLL for (int r = 0; r < R; r++)
        SPECGEN_UNROLL for (int c = 0; c < NC; c++) acc[r][c] = zero();
    for (int64_t s = 0; s < k; s += STEP) {
        if (NC >= 3)
            SPECGEN_UNROLL for (int r = 0; r < R; r++) _mm_prefetch((const char *) (A + lda * (i + R + r) + s), _MM_HINT_T0);
        vec w[R];
        SPECGEN_UNROLL for (int r = 0; r < R; r++) {
            w[r] = load(A + lda * (i + r) + s);
            __asm__("" : "+v"(w[r]));  // kept in a register, not re-read from memory for each column
        }
        SPECGEN_UNROLL for (int c = 0; c < NC; c++) {
            const vec y = load(B + ldb * (j0 + c) + s);
            SPECGEN_UNROLL for (int r = 0; r < R; r++) acc[r][c] = _mm512_fmadd_ps(w[r], y, acc[r][c]);
        }
    }
    SPECGEN_UNROLL for (int r = 0; r < R; r++)
        SPECGEN_UNROLL for (int c = 0; c < NC; c++) C[ldc * (j0 + c) + i + r] = reduce(acc[r][c]);
}

// Rows r0 .. r1 times columns j0 .. j0+NC: tiles of rows_for<NC>() rows, then one row at a time.
template <typename W, int NC>
static inline void band(int64_t k, const W * A, int64_t lda, const float * B, int64_t ldb, float * C, int64_t ldc,
                        int64_t j0, int64_t r0, int64_t r1) {
    constexpr int R = rows_for<NC>();
    int64_t i = r0;
    for (; i + R <= r1; i += R) tile<W, R, NC>(k, A, lda, i, B, ldb, C, ldc, j0);
    for (; i < r1; i++) tile<W, 1, NC>(k, A, lda, i, B, ldb, C, ldc, j0);
}

template <typename W>
static inline void matmul(int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, float * C,
                          int64_t ldc, int64_t r0, int64_t r1) {
    const W * a = (const W *) A;
    const float * b = columns<W>(n, k, B, ldb);
    // Bands of 64 rows: their weights stay in L2 while each group of columns passes over them.
    for (int64_t i0 = r0; i0 < r1; i0 += 64) {
        const int64_t i1 = i0 + 64 < r1 ? i0 + 64 : r1;
        for (int64_t j0 = 0; j0 < n; j0 += TC) {
            switch (n - j0 < TC ? n - j0 : TC) {
                case 4: band<W, 4>(k, a, lda, b, ldb, C, ldc, j0, i0, i1); break;
                case 3: band<W, 3>(k, a, lda, b, ldb, C, ldc, j0, i0, i1); break;
                case 2: band<W, 2>(k, a, lda, b, ldb, C, ldc, j0, i0, i1); break;
                default: band<W, 1>(k, a, lda, b, ldb, C, ldc, j0, i0, i1); break;
            }
        }
    }
}
static_assert(TC == 4, "matmul() has a case for each width up to TC");

#undef SPECGEN_UNROLL

}  // namespace lanes

#endif  // __AVX512F__

}  // namespace specgen_few

#endif  // SPECGEN_FEW
