// specgen: what the few-column kernels (few_q8_0.h, few_low_bits.h, few_float.h, few_k_quants.h) share:
// the instruction set they are built for (SPECGEN_FEW, undefined without AVX2, FMA and F16C), per-thread
// scratch, fp16 reads, ggml's horizontal sum of eight floats, the prefetch distance, and the dispatch that
// makes a pass's column count a template parameter. Plain C++17 over <immintrin.h>: no ggml header.
#pragma once

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

#endif  // SPECGEN_FEW
