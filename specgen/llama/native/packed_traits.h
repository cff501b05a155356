// specgen: specgen's packed weight layouts (packed_q4_0.h, packed_q4_1.h, packed_q5_0.h, packed_q5_1.h,
// packed_q8_0.h, packed_q3_k.h, packed_q4_k.h, packed_q5_k.h, packed_q6_k.h) as llama.cpp's repack buffer sees them, once for all of them: repack a tensor at
// load, size the scratch, and compute a product of any number of columns (each column quantized as
// ggml quantizes one row, with the few integers per column block a kernel needs beside it, then each
// thread's share of the row groups).
//
// A kernel K gives: WEIGHT and COLUMN (ggml types), NAME (its SPECGEN_KERNELS key), ROWS and QK,
// `row` and `packed` (its blocks), EXTRA (int32s per column block, 0 for none), extras(column, nb,
// out), pack(rows of blocks, rows, nb, packed) and matmul(nb, packed, g0, g1, columns, row_bytes,
// extras, n, dst, ldc). PACKED below lists them, the one list of them.
//
// The repack buffer's base class (ggml::cpu::repack::tensor_traits_base) is declared inside
// repack.cpp, so it is a template parameter here: repack.cpp passes it (patches/repack.cpp.patch,
// through kernels.h), and this header compiles with ggml's headers alone.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/.
#pragma once

#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-cpu-impl.h"
#include "traits.h"
#include "invariant.h"
#include "packed_q4_0.h"
#include "packed_q4_1.h"
#include "packed_q5_0.h"
#include "packed_q5_1.h"
#include "packed_q8_0.h"
#include "packed_q4_k.h"
#include "packed_q5_k.h"
#include "packed_q6_k.h"
#include "packed_q3_k.h"

#include <stdint.h>

#if defined(SPECGEN_PACKED) && defined(SPECGEN_PACKED_Q4_0) && defined(SPECGEN_PACKED_Q5_0) && defined(SPECGEN_PACKED_Q5_1) && defined(SPECGEN_PACKED_Q8_0) && \
    defined(SPECGEN_PACKED_Q3_K) && defined(SPECGEN_PACKED_Q4_K) && defined(SPECGEN_PACKED_Q5_K) && defined(SPECGEN_PACKED_Q6_K)
#define SPECGEN_PACKED_LAYOUTS 1

namespace specgen_packed_traits {

// Q4_1 weights x Q8_1 columns (packed_q4_1.h).
struct q4_1x16 {
    static constexpr ggml_type WEIGHT = GGML_TYPE_Q4_1, COLUMN = GGML_TYPE_Q8_1;
    static constexpr const char * NAME = "q4_1x16";
    static constexpr int64_t ROWS = specgen_packed::ROWS;
    static constexpr int QK = specgen_packed::QK;
    static constexpr int EXTRA = 0;  // Q8_1 carries its d * sum
    using row = specgen_packed::row_q4_1;
    using column = specgen_packed::column_q8_1;
    using packed = specgen_packed::block_q4_1x16;
    static void extras(const char *, int64_t, int32_t *) {}
    static void pack(const row * src, int64_t rows, int64_t nb, packed * dst) { specgen_packed::pack(src, rows, nb, dst); }
    static void matmul(int64_t nb, const packed * w, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                       const int32_t *, int64_t n, float * dst, int64_t ldc) {
        specgen_packed::matmul(nb, w, g0, g1, cols, row_bytes, n, dst, ldc);
    }
};

// Q4_0 weights x Q8_0 columns (packed_q4_0.h).
struct q4_0x16 {
    static constexpr ggml_type WEIGHT = GGML_TYPE_Q4_0, COLUMN = GGML_TYPE_Q8_0;
    static constexpr const char * NAME = "q4_0x16";
    static constexpr int64_t ROWS = specgen_packed_q4_0::ROWS;
    static constexpr int QK = specgen_packed_q4_0::QK;
    static constexpr int EXTRA = 1;  // each column block's offsets()
    using row = specgen_packed_q4_0::row_q4_0;
    using column = specgen_packed_q4_0::column_q8_0;
    using packed = specgen_packed_q4_0::block_q4_0x16;
    static void extras(const char * column_blocks, int64_t nb, int32_t * out) {
        specgen_packed_q4_0::offsets((const column *) column_blocks, nb, out);
    }
    static void pack(const row * src, int64_t rows, int64_t nb, packed * dst) { specgen_packed_q4_0::pack(src, rows, nb, dst); }
    static void matmul(int64_t nb, const packed * w, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                       const int32_t * offs, int64_t n, float * dst, int64_t ldc) {
        specgen_packed_q4_0::matmul(nb, w, g0, g1, cols, row_bytes, offs, n, dst, ldc);
    }
};

// Q5_0 weights x Q8_0 columns (packed_q5_0.h).
struct q5_0x16 {
    static constexpr ggml_type WEIGHT = GGML_TYPE_Q5_0, COLUMN = GGML_TYPE_Q8_0;
    static constexpr const char * NAME = "q5_0x16";
    static constexpr int64_t ROWS = specgen_packed_q5_0::ROWS;
    static constexpr int QK = specgen_packed_q5_0::QK;
    static constexpr int EXTRA = 1;  // each column block's offsets()
    using row = specgen_packed_q5_0::row_q5_0;
    using column = specgen_packed_q5_0::column_q8_0;
    using packed = specgen_packed_q5_0::block_q5_0x16;
    static void extras(const char * column_blocks, int64_t nb, int32_t * out) {
        specgen_packed_q5_0::offsets((const column *) column_blocks, nb, out);
    }
    static void pack(const row * src, int64_t rows, int64_t nb, packed * dst) { specgen_packed_q5_0::pack(src, rows, nb, dst); }
    static void matmul(int64_t nb, const packed * w, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                       const int32_t * offs, int64_t n, float * dst, int64_t ldc) {
        specgen_packed_q5_0::matmul(nb, w, g0, g1, cols, row_bytes, offs, n, dst, ldc);
    }
};

// Q5_1 weights x Q8_1 columns (packed_q5_1.h).
struct q5_1x16 {
    static constexpr ggml_type WEIGHT = GGML_TYPE_Q5_1, COLUMN = GGML_TYPE_Q8_1;
    static constexpr const char * NAME = "q5_1x16";
    static constexpr int64_t ROWS = specgen_packed_q5_1::ROWS;
    static constexpr int QK = specgen_packed_q5_1::QK;
    static constexpr int EXTRA = 0;  // Q8_1 carries its d * sum
    using row = specgen_packed_q5_1::row_q5_1;
    using column = specgen_packed_q5_1::column_q8_1;
    using packed = specgen_packed_q5_1::block_q5_1x16;
    static void extras(const char *, int64_t, int32_t *) {}
    static void pack(const row * src, int64_t rows, int64_t nb, packed * dst) { specgen_packed_q5_1::pack(src, rows, nb, dst); }
    static void matmul(int64_t nb, const packed * w, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                       const int32_t *, int64_t n, float * dst, int64_t ldc) {
        specgen_packed_q5_1::matmul(nb, w, g0, g1, cols, row_bytes, n, dst, ldc);
    }
};

// Q8_0 weights x Q8_0 columns (packed_q8_0.h).
struct q8_0x16 {
    static constexpr ggml_type WEIGHT = GGML_TYPE_Q8_0, COLUMN = GGML_TYPE_Q8_0;
    static constexpr const char * NAME = "q8_0x16";
    static constexpr int64_t ROWS = specgen_packed_q8_0::ROWS;
    static constexpr int QK = specgen_packed_q8_0::QK;
    static constexpr int EXTRA = 1;  // each column block's offsets()
    using row = specgen_packed_q8_0::row_q8_0;
    using column = specgen_packed_q8_0::column_q8_0;
    using packed = specgen_packed_q8_0::block_q8_0x16;
    static void extras(const char * column_blocks, int64_t nb, int32_t * out) {
        specgen_packed_q8_0::offsets((const column *) column_blocks, nb, out);
    }
    static void pack(const row * src, int64_t rows, int64_t nb, packed * dst) { specgen_packed_q8_0::pack(src, rows, nb, dst); }
    static void matmul(int64_t nb, const packed * w, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                       const int32_t * offs, int64_t n, float * dst, int64_t ldc) {
        specgen_packed_q8_0::matmul(nb, w, g0, g1, cols, row_bytes, offs, n, dst, ldc);
    }
};

// Q3_K weights x Q8_K columns (packed_q3_k.h: packed_q6_k.h's product with three-bit codes).
struct q3_kx16 {
    static constexpr ggml_type WEIGHT = GGML_TYPE_Q3_K, COLUMN = GGML_TYPE_Q8_K;
    static constexpr const char * NAME = "q3_kx16";
    static constexpr int64_t ROWS = specgen_packed_q3_k::ROWS;
    static constexpr int QK = specgen_packed_q3_k::QK;
    static constexpr int EXTRA = specgen_packed_q3_k::EXTRA;  // each column block's 16-value sums, in pairs
    using row = specgen_packed_q3_k::row_q3_K;
    using column = specgen_packed_common::column_q8_K;
    using packed = specgen_packed_q3_k::block_q3_Kx16;
    static void extras(const char * column_blocks, int64_t nb, int32_t * out) {
        specgen_packed_q3_k::extras((const column *) column_blocks, nb, out);
    }
    static void pack(const row * src, int64_t rows, int64_t nb, packed * dst) { specgen_packed_q3_k::pack(src, rows, nb, dst); }
    static void matmul(int64_t nb, const packed * w, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                       const int32_t * ex, int64_t n, float * dst, int64_t ldc) {
        specgen_packed_q3_k::matmul(nb, w, g0, g1, cols, row_bytes, ex, n, dst, ldc);
    }
};

// Q4_K weights x Q8_K columns (packed_q4_k.h), 256 values a block.
struct q4_kx16 {
    static constexpr ggml_type WEIGHT = GGML_TYPE_Q4_K, COLUMN = GGML_TYPE_Q8_K;
    static constexpr const char * NAME = "q4_kx16";
    static constexpr int64_t ROWS = specgen_packed_q4_k::ROWS;
    static constexpr int QK = specgen_packed_q4_k::QK;
    static constexpr int EXTRA = specgen_packed_q4_k::EXTRA;  // each column block's chunk sums, in pairs
    using row = specgen_packed_q4_k::row_q4_K;
    using column = specgen_packed_q4_k::column_q8_K;
    using packed = specgen_packed_q4_k::block_q4_Kx16;
    static void extras(const char * column_blocks, int64_t nb, int32_t * out) {
        specgen_packed_q4_k::extras((const column *) column_blocks, nb, out);
    }
    static void pack(const row * src, int64_t rows, int64_t nb, packed * dst) { specgen_packed_q4_k::pack(src, rows, nb, dst); }
    static void matmul(int64_t nb, const packed * w, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                       const int32_t * ex, int64_t n, float * dst, int64_t ldc) {
        specgen_packed_q4_k::matmul(nb, w, g0, g1, cols, row_bytes, ex, n, dst, ldc);
    }
};

// Q5_K weights x Q8_K columns (packed_q5_k.h: packed_q4_k.h's product with five-bit codes).
struct q5_kx16 {
    static constexpr ggml_type WEIGHT = GGML_TYPE_Q5_K, COLUMN = GGML_TYPE_Q8_K;
    static constexpr const char * NAME = "q5_kx16";
    static constexpr int64_t ROWS = specgen_packed_q5_k::ROWS;
    static constexpr int QK = specgen_packed_q5_k::QK;
    static constexpr int EXTRA = specgen_packed_q5_k::EXTRA;  // each column block's chunk sums, in pairs
    using row = specgen_packed_q5_k::row_q5_K;
    using column = specgen_packed_common::column_q8_K;
    using packed = specgen_packed_q5_k::block_q5_Kx16;
    static void extras(const char * column_blocks, int64_t nb, int32_t * out) {
        specgen_packed_q5_k::extras((const column *) column_blocks, nb, out);
    }
    static void pack(const row * src, int64_t rows, int64_t nb, packed * dst) { specgen_packed_q5_k::pack(src, rows, nb, dst); }
    static void matmul(int64_t nb, const packed * w, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                       const int32_t * ex, int64_t n, float * dst, int64_t ldc) {
        specgen_packed_q5_k::matmul(nb, w, g0, g1, cols, row_bytes, ex, n, dst, ldc);
    }
};

// Q6_K weights x Q8_K columns (packed_q6_k.h), 256 values a block.
struct q6_kx16 {
    static constexpr ggml_type WEIGHT = GGML_TYPE_Q6_K, COLUMN = GGML_TYPE_Q8_K;
    static constexpr const char * NAME = "q6_kx16";
    static constexpr int64_t ROWS = specgen_packed_q6_k::ROWS;
    static constexpr int QK = specgen_packed_q6_k::QK;
    static constexpr int EXTRA = specgen_packed_q6_k::EXTRA;  // each column block's 16-value sums, in pairs
    using row = specgen_packed_q6_k::row_q6_K;
    using column = specgen_packed_q6_k::column_q8_K;
    using packed = specgen_packed_q6_k::block_q6_Kx16;
    static void extras(const char * column_blocks, int64_t nb, int32_t * out) {
        specgen_packed_q6_k::extras((const column *) column_blocks, nb, out);
    }
    static void pack(const row * src, int64_t rows, int64_t nb, packed * dst) { specgen_packed_q6_k::pack(src, rows, nb, dst); }
    static void matmul(int64_t nb, const packed * w, int64_t g0, int64_t g1, const char * cols, size_t row_bytes,
                       const int32_t * ex, int64_t n, float * dst, int64_t ldc) {
        specgen_packed_q6_k::matmul(nb, w, g0, g1, cols, row_bytes, ex, n, dst, ldc);
    }
};

template <typename... K>
struct kernels {};

// specgen's packed layouts, the one list of them, in the order they are offered a weight.
using PACKED = kernels<q4_0x16, q4_1x16, q5_0x16, q5_1x16, q8_0x16, q3_kx16, q4_kx16, q5_kx16, q6_kx16>;

// The repack buffer's traits for kernel K; Base is repack.cpp's ggml::cpu::repack::tensor_traits_base.
template <typename K, typename Base>
class traits : public Base {
    static size_t columns_bytes(const ggml_tensor * src1) { return ggml_row_size(K::COLUMN, ggml_nelements(src1)); }

    // The columns' extras in wdata: from the first 64-byte boundary after the quantized columns.
    static int32_t * extras_of(void * wdata, const ggml_tensor * src1) {
        return (int32_t *) (((uintptr_t) wdata + columns_bytes(src1) + 63) & ~(uintptr_t) 63);
    }

    bool work_size(int /* n_threads */, const struct ggml_tensor * op, size_t & size) override {
        if (op->op != GGML_OP_MUL_MAT) return false;
        size = columns_bytes(op->src[1]) + 64 + (size_t) (ggml_nelements(op->src[1]) / K::QK) * K::EXTRA * sizeof(int32_t);
        return true;
    }

    bool compute_forward(struct ggml_compute_params * params, struct ggml_tensor * op) override {
        if (op->op != GGML_OP_MUL_MAT) return false;
        const ggml_tensor * src0 = op->src[0];
        const ggml_tensor * src1 = op->src[1];
        GGML_ASSERT(src1->type == GGML_TYPE_F32 && src1->nb[0] == sizeof(float) && src1->ne[3] == 1);
        GGML_ASSERT(op->nb[0] == sizeof(float) && op->nb[2] == op->nb[1] * op->ne[1] && op->ne[0] == src0->ne[1]);
        const int64_t k = src1->ne[0], n1 = src1->ne[1], n = n1 * src1->ne[2], nb = k / K::QK;
        const size_t row_bytes = ggml_row_size(K::COLUMN, k);
        char * cols = (char *) params->wdata;
        int32_t * extras = extras_of(params->wdata, src1);
        const ggml_from_float_t quantize = ggml_get_type_traits_cpu(K::COLUMN)->from_float;
        for (int64_t c = params->ith; c < n; c += params->nth) {  // each column quantized as one row is
            const char * x = (const char *) src1->data + (c % n1) * src1->nb[1] + (c / n1) * src1->nb[2];
            quantize((const float *) x, cols + c * row_bytes, k);
            if constexpr (K::EXTRA > 0) K::extras(cols + c * row_bytes, nb, extras + c * nb * K::EXTRA);
        }
        ggml_barrier(params->threadpool);
        const int64_t groups = src0->ne[1] / K::ROWS;
        const int64_t g0 = groups * params->ith / params->nth, g1 = groups * (params->ith + 1) / params->nth;
        K::matmul(nb, (const typename K::packed *) src0->data, g0, g1, cols, row_bytes, extras, n, (float *) op->data,
                  (int64_t) (op->nb[1] / sizeof(float)));
        return true;
    }

    int repack(struct ggml_tensor * t, const void * data, size_t data_size) override {
        const int64_t nb = t->ne[0] / K::QK, rows = t->ne[1];
        if (data_size != (size_t) (rows * nb) * sizeof(typename K::row)) return -1;
        K::pack((const typename K::row *) data, rows, nb, (typename K::packed *) t->data);
        return 0;
    }
};

// The traits for a weight that takes K's layout (2-D, whole groups of rows, the kernel on), else nullptr.
template <typename K, typename Base>
static inline const ggml::cpu::tensor_traits * traits_for(const ggml_tensor * t) {
    static const traits<K, Base> instance;
    const bool takes = t->type == K::WEIGHT && ggml_n_dims(t) == 2 && t->ne[1] % K::ROWS == 0 && t->ne[0] % K::QK == 0 &&
                       specgen::current().invariant && specgen::kernel_on(K::NAME);
    if (takes) {  // specgen's block structs are ggml's blocks, byte for byte
        GGML_ASSERT(ggml_type_size(K::WEIGHT) == sizeof(typename K::row) && ggml_blck_size(K::WEIGHT) == K::QK);
        GGML_ASSERT(ggml_type_size(K::COLUMN) == sizeof(typename K::column) && ggml_blck_size(K::COLUMN) == K::QK);
    }
    return takes ? &instance : nullptr;
}

// The first of the kernels whose layout the weight takes, else nullptr.
template <typename Base, typename... K>
static inline const ggml::cpu::tensor_traits * first_for(const ggml_tensor * t, kernels<K...>) {
    const ggml::cpu::tensor_traits * found = nullptr;
    ((found = found ? found : traits_for<K, Base>(t)), ...);
    return found;
}

// Calls f(K::NAME) for each kernel, in order.
template <typename F, typename... K>
static inline void each_name(F && f, kernels<K...>) {
    (f(K::NAME), ...);
}

}  // namespace specgen_packed_traits

#endif  // SPECGEN_PACKED, SPECGEN_PACKED_Q4_0, _Q5_0, _Q5_1, _Q8_0, _Q3_K, _Q4_K, _Q5_K, _Q6_K
