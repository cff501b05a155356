// specgen: what llama.cpp's repack buffer asks of specgen's packed weight types (packed_q4_1.h,
// packed_q5_0.h), once for all of them: repack a tensor at load, size the scratch, and compute a
// product of any number of columns (each column quantized as ggml quantizes one row, with the few
// integers per column block a kernel needs beside it, then each thread's share of the row groups).
//
// A kernel K gives: WEIGHT and COLUMN (ggml types), NAME (its SPECGEN_KERNELS key), ROWS and QK,
// `row` and `packed` (its blocks), EXTRA (int32s per column block, 0 for none), extras(column, nb,
// out), pack(rows of blocks, rows, nb, packed) and matmul(nb, packed, g0, g1, columns, row_bytes,
// extras, n, dst, ldc).
//
// This file is specgen's own; specgen.llama.build copies it into ggml-cpu, where the packed headers
// include it inside repack.cpp.
#pragma once

namespace specgen_packed_traits {

template <typename K>
class traits : public ggml::cpu::repack::tensor_traits_base {
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
template <typename K>
static inline const ggml::cpu::tensor_traits * traits_for(const ggml_tensor * t) {
    static const traits<K> instance;
    const bool takes = t->type == K::WEIGHT && ggml_n_dims(t) == 2 && t->ne[1] % K::ROWS == 0 && t->ne[0] % K::QK == 0 &&
                       specgen::current().invariant && specgen::kernel_on(K::NAME);
    return takes ? &instance : nullptr;
}

}  // namespace specgen_packed_traits
