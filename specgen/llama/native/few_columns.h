// specgen: matrix products with few columns (quantized, F16 and F32 weights), for llama.cpp's CPU backend.
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
// Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 have AVX-512 VNNI variants (two columns per 512-bit register;
// few_q8_0.h, few_low_bits.h); Q2_K, Q3_K, Q4_K, Q5_K and Q6_K use 256-bit code on both AVX2 and
// AVX-512 hosts (few_k_quants.h); F32 and F16 follow ggml's own F32 and F16 paths (512-bit where the
// host has AVX-512, else 256-bit; few_float.h). Without AVX2, FMA and F16C there is no kernel and
// invariance falls back to ggml's one-column code.
//
// These files are specgen's own; specgen.llama.build copies them next to llamafile's sgemm.cpp, which
// calls matmul() below first for products of at most specgen::FEW_COLUMNS columns (see build.py).
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

}  // namespace specgen_few

#include "specgen_few_q8_0.h"
#include "specgen_few_low_bits.h"
#include "specgen_few_float.h"
#include "specgen_few_k_quants.h"

namespace specgen_few {

// Whether a weight of this type should stay in ggml's own layout (not be repacked at load) because a
// kernel here reads it: the repacked GEMV/GEMM would otherwise take its products.
static inline bool keeps_layout(ggml_type type) {
    if (!specgen::current().invariant) return false;
    return (type == GGML_TYPE_Q4_0 && specgen::kernel_on("q4_0")) ||
           (type == GGML_TYPE_Q2_K && specgen::kernel_on("q2_k")) ||  // repacked where the host has AVX-512
           (type == GGML_TYPE_Q4_K && specgen::kernel_on("q4_k"));
}

// What this build computes with specgen's kernels, for llama.cpp's system info (`specgen doctor`):
// the instruction set, then the weight types whose kernel is on, or "off".
static inline const char * describe() {
    static char text[96] = "";
    if (!text[0]) {
        const char * all[] = { "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
                               "f16", "f32", "q4_1x16", "q5_0x16" };
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
    } else if (a == GGML_TYPE_Q2_K && b == GGML_TYPE_Q8_K && specgen::kernel_on("q2_k")) {
        k_quants::matmul<k_quants::q2_K>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q3_K && b == GGML_TYPE_Q8_K && specgen::kernel_on("q3_k")) {
        k_quants::matmul<k_quants::q3_K>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q4_K && b == GGML_TYPE_Q8_K && specgen::kernel_on("q4_k")) {
        k_quants::matmul<k_quants::q4_K>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q6_K && b == GGML_TYPE_Q8_K && specgen::kernel_on("q6_k")) {
        k_quants::matmul<k_quants::q6_K>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_Q5_K && b == GGML_TYPE_Q8_K && specgen::kernel_on("q5_k")) {
        k_quants::matmul<k_quants::q5_K>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_F16 && b == GGML_TYPE_F16 && k % floats::STEP == 0 && specgen::kernel_on("f16")) {
        floats::matmul<uint16_t>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else if (a == GGML_TYPE_F32 && b == GGML_TYPE_F32 && k % floats::STEP == 0 && specgen::kernel_on("f32")) {
        floats::matmul<float>(n, k, A, lda, B, ldb, C, ldc, r0, r1);
    } else {
        return false;
    }
    return true;
}

}  // namespace specgen_few

#endif  // SPECGEN_FEW
