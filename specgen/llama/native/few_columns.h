// specgen: matrix products with few columns (quantized, F16 and F32 weights), for llama.cpp's CPU backend.
//
// Why: a decode of B tokens multiplies every weight matrix by B columns. For 2 or more columns
// llama.cpp hands quantized weights to llamafile's tinyBLAS or to the repacked GEMMs, which are
// compute-bound there and round differently from the one-column path (see invariant.h).
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
// AVX-512 hosts (few_k_quants.h); F32 and F16 take specgen's own 16-lane arithmetic on AVX-512 hosts
// (f32x16, f16x16: one chain of sums per lane, not vec_dot's bits) and follow ggml's own F32 and F16
// paths on AVX2 hosts, or on AVX-512 ones with those two off (few_float.h). Without AVX2, FMA and F16C
// there is no kernel and invariance falls back to ggml's one-column code.
//
// This file is specgen's own, as are the kernels it includes (few_*.h); specgen.llama.build copies
// native/ into ggml-cpu as specgen/, and patches/sgemm.cpp.patch makes llamafile_sgemm call matmul()
// below first for products of at most specgen::FEW_COLUMNS columns. Needs ggml.h for the type names.
#pragma once

#include "ggml.h"
#include "invariant.h"
#include "few_q8_0.h"
#include "few_low_bits.h"
#include "few_float.h"
#include "few_k_quants.h"


#ifdef SPECGEN_FEW

namespace specgen_few {

// A product kernel: C[ldc * j + i] = row i of A . column j of B for rows r0..r1 of A and n columns.
using kernel_fn = void (*)(int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb, float * C,
                           int64_t ldc, int64_t r0, int64_t r1);

struct product {
    const char * name;          // its SPECGEN_KERNELS key (and its word in llama.cpp's system info)
    ggml_type weight, column;   // A's type, and the vec_dot type ggml quantizes B to
    int64_t k_step;             // k must be a multiple of it (else ggml's code, which adds the leftovers)
    bool keeps_layout;          // such weights stay in ggml's layout (not repacked at load) while it is on
    kernel_fn matmul;
};

// specgen's product kernels, the one list of them (in the order the system info names them). Q4_0, Q2_K
// and Q4_K would otherwise be repacked at load (Q2_K where the host has AVX-512), and the repacked
// GEMV/GEMM would take their products.
static constexpr product PRODUCTS[] = {
    { "q8_0", GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, 1, false, q8_0::matmul },
    { "q4_0", GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, 1, true, low_bits::matmul<low_bits::q4_0> },
    { "q4_1", GGML_TYPE_Q4_1, GGML_TYPE_Q8_1, 1, false, low_bits::matmul<low_bits::q4_1> },
    { "q5_0", GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, 1, false, low_bits::matmul<low_bits::q5_0> },
    { "q5_1", GGML_TYPE_Q5_1, GGML_TYPE_Q8_1, 1, false, low_bits::matmul<low_bits::q5_1> },
    { "q2_k", GGML_TYPE_Q2_K, GGML_TYPE_Q8_K, 1, true, k_quants::matmul<k_quants::q2_K> },
    { "q3_k", GGML_TYPE_Q3_K, GGML_TYPE_Q8_K, 1, false, k_quants::matmul<k_quants::q3_K> },
    { "q4_k", GGML_TYPE_Q4_K, GGML_TYPE_Q8_K, 1, true, k_quants::matmul<k_quants::q4_K> },
    { "q5_k", GGML_TYPE_Q5_K, GGML_TYPE_Q8_K, 1, false, k_quants::matmul<k_quants::q5_K> },
    { "q6_k", GGML_TYPE_Q6_K, GGML_TYPE_Q8_K, 1, false, k_quants::matmul<k_quants::q6_K> },
#if defined(__AVX512F__)  // specgen's 16-lane arithmetic first: where it is on, it takes F16 and F32 products
    { "f16x16", GGML_TYPE_F16, GGML_TYPE_F16, lanes::STEP, false, lanes::matmul<uint16_t> },
    { "f32x16", GGML_TYPE_F32, GGML_TYPE_F32, lanes::STEP, false, lanes::matmul<float> },
#endif
    { "f16", GGML_TYPE_F16, GGML_TYPE_F16, floats::STEP, false, floats::matmul<uint16_t> },
    { "f32", GGML_TYPE_F32, GGML_TYPE_F32, floats::STEP, false, floats::matmul<float> },
};

// Whether a weight of this type should stay in ggml's own layout (not be repacked at load) because a
// kernel here reads it.
static inline bool keeps_layout(ggml_type type) {
    if (!specgen::current().invariant) return false;
    for (const product & p : PRODUCTS) {
        if (p.keeps_layout && p.weight == type && specgen::kernel_on(p.name)) return true;
    }
    return false;
}

// C[ldc * j + i] = row i of A . column j of B (A: weights of type `a`, B: the columns quantized to
// its vec_dot type `b`), for this thread's share of A's m rows (ggml calls every thread with its ith
// of nth). Returns false where llama.cpp's own code should do the product.
static inline bool matmul(int64_t m, int64_t n, int64_t k, const void * A, int64_t lda, const void * B, int64_t ldb,
                          float * C, int64_t ldc, ggml_type a, ggml_type b, int ith, int nth) {
    if (!specgen::invariant(n)) {
        return false;
    }
    for (const product & p : PRODUCTS) {
        if (p.weight == a && p.column == b && k % p.k_step == 0 && specgen::kernel_on(p.name)) {
            p.matmul(n, k, A, lda, B, ldb, C, ldc, m * ith / nth, m * (ith + 1) / nth);
            return true;
        }
    }
    return false;
}

}  // namespace specgen_few

#endif  // SPECGEN_FEW
