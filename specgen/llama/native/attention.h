// specgen: flash attention for a few query rows, batch-invariant, in three passes over the cache.
//
// Why: for at most FEW_COLUMNS query rows, batch invariance used to keep ggml's per-row flash-attention
// loop (ggml_compute_forward_flash_attn_ext_f16_one_chunk): one row at a time, one cell at a time, a
// scalar expf per cell and an F16 accumulator widened, multiplied-added and narrowed again per cell.
// At 16 rows attention cost 13.7x one row on smollm2 (docs/screening-and-kernels.md, the op profile),
// and its share grows with the context.
//
// What: the rows that read one K/V head (the tokens of a query head, the query heads of a KV group)
// form units of at most UNIT_ROWS. Per unit: (1) every row's score per cell, a block of cells at a
// time (the block's K rows widened once for the unit, K.q in F32 lanes, one fixed sum over the lanes,
// two rows per K load; then scaled, soft-capped and masked in lanes; a block no row sees skipped);
// (2) per row, the softmax: the visible cells' scores packed in cell order, their maximum, ggml's
// vectorized expf (ggml_v_expf, what its soft_max uses) over them, the sum in lanes; (3) the weights
// times V summed in cell order into F32 registers, up to four rows per widened V row. The K and V rows
// are fetched into L2 a few blocks ahead.
//
// Exactness: a row's result depends only on its query, its mask and the visible cells in cell order
// (not on their indices in the cache, which a sliding-window cache changes when it wraps), never on
// the other rows of its batch, its unit or the thread count: the same bits alone or in any batch
// (tests/test_kernels.py). They are not ggml's bits (F32 queries and accumulator where ggml rounds
// both to F16): SPECGEN_KERNELS=ggml, or a list without "attention", keeps ggml's loop.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, and
// patches/ops.cpp.patch includes it before ggml_compute_forward_flash_attn_ext_f16, which calls run()
// for few query rows. Needs ggml-cpu's headers: vec.h for ggml_v_expf, ggml-cpu-impl.h for the threadpool.
#pragma once

#include "ggml.h"
#include "ggml-cpu-impl.h"
#include "simd-mappings.h"
#include "vec.h"
#include "invariant.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace specgen_attention {

// The most rows of one unit (each keeps a row of scores in the thread's scratch).
constexpr int64_t UNIT_ROWS = 16;

struct row {
    int64_t iq1, iq2, iq3;
    const ggml_fp16_t * mask;  // this row's mask over the cells, or null
    float slope;               // the ALiBi slope the mask is multiplied by (1 without ALiBi)
    float S;                   // the softmax's sum
};

struct shape {
    const ggml_tensor *q, *k, *v, *mask, *sinks;
    int64_t DK, DV, neq1, neq2, neq3, nek1, rk2, rk3, rv2, rv3;
    float scale, max_bias, logit_softcap, m0, m1;
    uint32_t n_head_log2;
};

static inline shape read_shape(const ggml_tensor * dst) {
    shape s;
    s.q = dst->src[0];
    s.k = dst->src[1];
    s.v = dst->src[2];
    s.mask = dst->src[3];
    s.sinks = dst->src[4];
    s.DK = s.k->ne[0];
    s.DV = s.v->ne[0];
    s.neq1 = s.q->ne[1];
    s.neq2 = s.q->ne[2];
    s.neq3 = s.q->ne[3];
    s.nek1 = s.k->ne[1];
    s.rk2 = s.neq2 / s.k->ne[2];
    s.rk3 = s.neq3 / s.k->ne[3];
    s.rv2 = s.neq2 / s.v->ne[2];
    s.rv3 = s.neq3 / s.v->ne[3];
    s.scale = 1.0f;
    s.max_bias = 0.0f;
    s.logit_softcap = 0.0f;
    memcpy(&s.scale, (const float *) dst->op_params + 0, sizeof(float));
    memcpy(&s.max_bias, (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&s.logit_softcap, (const float *) dst->op_params + 2, sizeof(float));
    if (s.logit_softcap != 0) {
        s.scale /= s.logit_softcap;
    }
    s.n_head_log2 = 1u << (uint32_t) floor(log2((uint32_t) s.neq2));
    s.m0 = powf(2.0f, -(s.max_bias) / s.n_head_log2);
    s.m1 = powf(2.0f, -(s.max_bias / 2.0f) / s.n_head_log2);
    return s;
}

// A few lanes of floats: AVX-512, AVX2 with FMA and F16C, or one float at a time. ggml_v_expf is
// ggml's vectorized expf (its soft_max uses it), defined in vec.h for the first two.
#if defined(__AVX512F__) && defined(__AVX512DQ__)
using vec = __m512;
constexpr int64_t W = 16;
static inline vec vload(const float * p) { return _mm512_loadu_ps(p); }
static inline vec vload_h(const ggml_fp16_t * p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) p)); }
static inline void vstore(float * p, vec x) { _mm512_storeu_ps(p, x); }
static inline vec vset(float x) { return _mm512_set1_ps(x); }
static inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline vec vexp(vec x) { return ggml_v_expf(x); }
static inline float vsum(vec x) {  // lanes summed in one fixed tree
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
static inline float vhmax(vec x) { return _mm512_reduce_max_ps(x); }
// Whether some lane of a mask is not -inf (a cell seen, as the scalar `!= -INFINITY` says); then x where
// mv is not -inf, -inf where it is (a masked cell, whatever its K row held).
static inline bool vseen(vec mv) { return _mm512_cmp_ps_mask(mv, vset(-INFINITY), _CMP_NEQ_UQ) != 0; }
static inline vec vmasked(vec x, vec mv) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mv, vset(-INFINITY), _CMP_EQ_OQ), x, vset(-INFINITY));
}
// out[t] = the sum of a_t's lanes, by one tree for every t: lane i + lane i+8, then + lane i+4, then
// pairs (i, i+2), then (i, i+1).
static inline void sum4(vec a0, vec a1, vec a2, vec a3, float * out) {
    const __m512 c01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
    const __m512 c23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
    // c01 quarters: a0 (lanes i, i+4 of its fold), a0, a1, a1; the same for c23
    const __m512 d = _mm512_add_ps(_mm512_shuffle_f32x4(c01, c23, 0x88), _mm512_shuffle_f32x4(c01, c23, 0xDD));
    // d quarters: a0, a1, a2, a3, four lanes each
    const __m512 e = _mm512_add_ps(d, _mm512_permute_ps(d, 0x4E));
    const __m512 f = _mm512_add_ps(e, _mm512_permute_ps(e, 0xB1));
    _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), f)));
}
// The cells of one block of scores, and their sums: out[t] = the sum of a[t]'s lanes for t < 16, by
// sum4's tree (lane i + lane i+8, + lane i+4, pairs (i, i+2), then (i, i+1)), sixteen at a time.
constexpr int64_t BC = 16;
static inline void sum_block(const vec * a, float * out) {
    __m512 b[8], c[4];
    for (int j = 0; j < 8; j++) {  // halves: [a_2j: i + i+8 | a_2j+1: i + i+8]
        b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x44), _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xEE));
    }
    for (int j = 0; j < 4; j++) {  // quarters: a_4j .. a_4j+3, each lane i (+ i+8) + lane i+4 (+ i+12)
        c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88), _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xDD));
    }
    const __m512 e0 = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x44), _mm512_shuffle_ps(c[0], c[1], 0xEE));  // (i, i+2)
    const __m512 e1 = _mm512_add_ps(_mm512_shuffle_ps(c[2], c[3], 0x44), _mm512_shuffle_ps(c[2], c[3], 0xEE));
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(e0, e1, 0x88), _mm512_shuffle_ps(e0, e1, 0xDD));  // (i, i+1)
    // f's lane 4q+k holds a[4k+q]'s sum
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, f));
}
// A row of scores (cells, a multiple of BC) packed: the cells that are not -inf, in cell order, from
// packed[0]; returns how many. packed has room for cells + W floats.
static inline int64_t pack(const float * p, int64_t cells, float * packed) {
    int64_t n = 0;
    for (int64_t c = 0; c < cells; c += W) {
        const __m512 x = _mm512_loadu_ps(p + c);
        const __mmask16 k = _mm512_cmp_ps_mask(x, vset(-INFINITY), _CMP_NEQ_UQ);
        _mm512_storeu_ps(packed + n, _mm512_maskz_compress_ps(k, x));
        n += __builtin_popcount((unsigned) k);
    }
    return n;
}
// The packed weights back to their cells, 0 where the score was -inf.
static inline void unpack(float * p, int64_t cells, const float * packed) {
    int64_t j = 0;
    for (int64_t c = 0; c < cells; c += W) {
        const __m512 x = _mm512_loadu_ps(p + c);
        const __mmask16 k = _mm512_cmp_ps_mask(x, vset(-INFINITY), _CMP_NEQ_UQ);
        _mm512_storeu_ps(p + c, _mm512_maskz_expand_ps(k, _mm512_loadu_ps(packed + j)));
        j += __builtin_popcount((unsigned) k);
    }
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
using vec = __m256;
constexpr int64_t W = 8;
static inline vec vload(const float * p) { return _mm256_loadu_ps(p); }
static inline vec vload_h(const ggml_fp16_t * p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p)); }
static inline void vstore(float * p, vec x) { _mm256_storeu_ps(p, x); }
static inline vec vset(float x) { return _mm256_set1_ps(x); }
static inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm256_max_ps(a, b); }
static inline vec vexp(vec x) { return ggml_v_expf(x); }
static inline float vsum(vec x) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
// out[t] = the sum of a_t's lanes, by one tree for every t: lane i + lane i+4, then pairs twice.
static inline void sum4(vec a0, vec a1, vec a2, vec a3, float * out) {
    const __m256 c01 = _mm256_add_ps(_mm256_permute2f128_ps(a0, a1, 0x20), _mm256_permute2f128_ps(a0, a1, 0x31));
    const __m256 c23 = _mm256_add_ps(_mm256_permute2f128_ps(a2, a3, 0x20), _mm256_permute2f128_ps(a2, a3, 0x31));
    const __m256 h1 = _mm256_hadd_ps(c01, c23);  // [a0: 0+1, 2+3, a2: 0+1, 2+3 | a1..., a3...]
    const __m256 h2 = _mm256_hadd_ps(h1, h1);    // [a0, a2, a0, a2 | a1, a3, a1, a3]
    alignas(32) float t[8];
    _mm256_store_ps(t, h2);
    out[0] = t[0];
    out[1] = t[4];
    out[2] = t[1];
    out[3] = t[5];
}
constexpr int64_t BC = 8;
static inline void sum_block(const vec * a, float * out) {
    sum4(a[0], a[1], a[2], a[3], out);
    sum4(a[4], a[5], a[6], a[7], out + 4);
}
static inline bool vseen(vec mv) { return _mm256_movemask_ps(_mm256_cmp_ps(mv, vset(-INFINITY), _CMP_NEQ_UQ)) != 0; }
static inline vec vmasked(vec x, vec mv) {
    return _mm256_blendv_ps(x, vset(-INFINITY), _mm256_cmp_ps(mv, vset(-INFINITY), _CMP_EQ_OQ));
}
static inline float vhmax(vec x) {
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
#else
using vec = float;
constexpr int64_t W = 1;
static inline vec vload(const float * p) { return *p; }
static inline vec vload_h(const ggml_fp16_t * p) { return GGML_CPU_FP16_TO_FP32(*p); }
static inline void vstore(float * p, vec x) { *p = x; }
static inline vec vset(float x) { return x; }
static inline vec vmul(vec a, vec b) { return a * b; }
static inline vec vfma(vec a, vec b, vec c) { return fmaf(a, b, c); }
static inline vec vadd(vec a, vec b) { return a + b; }
static inline vec vsub(vec a, vec b) { return a - b; }
static inline vec vmax(vec a, vec b) { return a > b ? a : b; }
static inline vec vexp(vec x) { return expf(x); }
static inline float vsum(vec x) { return x; }
static inline float vhmax(vec x) { return x; }
static inline void sum4(vec a0, vec a1, vec a2, vec a3, float * out) {
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
}
constexpr int64_t BC = 4;
static inline void sum_block(const vec * a, float * out) { sum4(a[0], a[1], a[2], a[3], out); }
static inline bool vseen(vec mv) { return mv != -INFINITY; }
static inline vec vmasked(vec x, vec mv) { return mv == -INFINITY ? -INFINITY : x; }
#endif

#if !(defined(__AVX512F__) && defined(__AVX512DQ__))
static inline int64_t pack(const float * p, int64_t cells, float * packed) {
    int64_t n = 0;
    for (int64_t c = 0; c < cells; c++) {  // no branch: a cell's store is overwritten unless it counts
        packed[n] = p[c];
        n += p[c] != -INFINITY;
    }
    return n;
}
static inline void unpack(float * p, int64_t cells, const float * packed) {
    for (int64_t c = 0, j = 0; c < cells; c++) {
        const bool seen = p[c] != -INFINITY;
        p[c] = seen ? packed[j] : 0.0f;
        j += seen;
    }
}
#endif

// How many blocks ahead pass 1 fetches the K and V rows, into L2 (measured on a Zen 4, smollm2 at
// 1 and 8 rows: fetching into L1, or one block ahead, left pass 1 waiting on memory).
constexpr int64_t AHEAD = 4;
// The fetch of one K or V row into the caches, ahead of its use.
static inline void fetch(const char * p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) {
        __builtin_prefetch(p + off, 0, 2);
    }
}

// Whether run() computes this attention: F32 queries, an F16 cache (llama.cpp's default) and head
// sizes in whole lanes; anything else goes through ggml's loop, which is batch-invariant too.
static inline bool handles(const shape & sh) {
    return sh.q->type == GGML_TYPE_F32 && sh.k->type == GGML_TYPE_F16 && sh.v->type == GGML_TYPE_F16 &&
           sh.DK % W == 0 && sh.DV % W == 0 && sh.q->nb[0] == sizeof(float);
}

// out[r][t] = K's row t (widened, DK floats each, in kbuf) dotted with row r's query, for the BC cells
// of a block and R rows, BC/R cells of each row at a time (each K load serves the R rows): per cell,
// lanes multiplied then multiplied-added along the row, then summed by sum_block's one tree.
template <int R>
static inline void dots(const float * kbuf, const float * const * q, int64_t DK, float * const * out) {
    constexpr int C = (int) BC / R;
    for (int h = 0; h < BC; h += C) {
        vec a[BC];
        for (int r = 0; r < R; r++) {
            const vec q0 = vload(q[r]);
            for (int t = 0; t < C; t++) {
                a[r * C + t] = vmul(vload(kbuf + (h + t) * DK), q0);
            }
        }
        for (int64_t d = W; d < DK; d += W) {
            vec qd[R];
            for (int r = 0; r < R; r++) {
                qd[r] = vload(q[r] + d);
            }
            for (int t = 0; t < C; t++) {
                const vec kd = vload(kbuf + (h + t) * DK + d);
                for (int r = 0; r < R; r++) {
                    a[r * C + t] = vfma(kd, qd[r], a[r * C + t]);
                }
            }
        }
        float sums[BC];
        sum_block(a, sums);
        for (int r = 0; r < R; r++) {
            memcpy(out[r] + h, sums + r * C, C * sizeof(float));
        }
    }
}

// out[r][0 .. N*W) = the sum over cells, in cell order, of weight p[r][ic] times V's row ic (from `v`,
// rows nb1 bytes apart), for R rows that share each V row's widening; a row's cells of weight 0 are
// skipped (whatever the others weigh them).
template <int N, int R>
static inline void weigh(const float * const * p, const char * v, size_t nb1, int64_t nek1, float * const * out) {
    vec a[R][N];
    for (int r = 0; r < R; r++) {
        for (int j = 0; j < N; j++) {
            a[r][j] = vset(0.0f);
        }
    }
    for (int64_t ic = 0; ic < nek1; ++ic) {
        int weighed = 0;
        for (int r = 0; r < R; r++) {
            weighed += p[r][ic] != 0.0f;
        }
        if (weighed == 0) {
            continue;
        }
        const ggml_fp16_t * vc = (const ggml_fp16_t *) (v + ic * nb1);
        vec x[N];
        for (int j = 0; j < N; j++) {
            x[j] = vload_h(vc + j * W);
        }
        for (int r = 0; r < R; r++) {
            if (weighed == R || p[r][ic] != 0.0f) {
                const vec w = vset(p[r][ic]);
                for (int j = 0; j < N; j++) {
                    a[r][j] = vfma(w, x[j], a[r][j]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        for (int j = 0; j < N; j++) {
            vstore(out[r] + j * W, a[r][j]);
        }
    }
}

// weigh() for r <= 4 rows (1, 2 or 4) and N slices of W lanes.
template <int N>
static inline void weigh_rows(int r, const float * const * p, const char * v, size_t nb1, int64_t nek1, float * const * out) {
    switch (r) {
        case 4: weigh<N, 4>(p, v, nb1, nek1, out); break;
        case 2: weigh<N, 2>(p, v, nb1, nek1, out); break;
        default: weigh<N, 1>(p, v, nb1, nek1, out); break;
    }
}

// One unit: rows [r0, r1) of ggml's row order (ir = iq3*neq2*neq1 + iq2*neq1 + iq1), all of one K/V
// head, and where its passes keep their numbers (the thread's scratch).
struct unit_state {
    int64_t n;      // rows
    int64_t cells;  // a row of scores, in whole blocks of BC cells
    row rows[UNIT_ROWS];
    const float * qrow[UNIT_ROWS];  // each row's query
    int64_t same_mask[UNIT_ROWS];   // the first row with the same mask and slope (its mask is computed once)
    const char * kbase;             // the unit's K head, cell 0
    const char * vbase;             // the unit's V head, cell 0
    float * kbuf;                   // a block's K rows, widened
    float * mvs;                    // each row's mask over the block (slope times the mask; -inf: not seen)
    float * acc;                    // each row's weighted sum of V
    float * P;                      // row i's scores, then weights: P + i*cells
    float * packed;                 // one row's visible scores, packed (pass 2)
};

// The unit's rows: where each reads its query and mask, its ALiBi slope, which earlier row has the same
// mask, the K/V head they share, and the scratch cut into the passes' buffers.
static inline void start_unit(const shape & sh, int64_t r0, int64_t r1, std::vector<float> & scratch, unit_state & u) {
    const ggml_tensor *q = sh.q, *mask = sh.mask;
    const int64_t neq1 = sh.neq1, neq2 = sh.neq2;
    const int64_t n = u.n = r1 - r0;
    const int64_t cells = u.cells = (sh.nek1 + BC - 1) / BC * BC;

    scratch.resize((size_t) (BC * sh.DK + n * BC + n * sh.DV + n * cells + cells + W));
    u.kbuf = scratch.data();
    u.mvs = u.kbuf + BC * sh.DK;
    u.acc = u.mvs + n * BC;
    u.P = u.acc + n * sh.DV;
    u.packed = u.P + n * cells;

    for (int64_t i = 0; i < n; i++) {
        row & w = u.rows[i];
        const int64_t ir = r0 + i;
        w.iq3 = ir / (neq2 * neq1);
        w.iq2 = (ir - w.iq3 * neq2 * neq1) / neq1;
        w.iq1 = ir - w.iq3 * neq2 * neq1 - w.iq2 * neq1;
        const uint32_t h = (uint32_t) w.iq2;
        w.slope = (sh.max_bias > 0.0f) ? h < sh.n_head_log2 ? powf(sh.m0, h + 1) : powf(sh.m1, 2 * (h - sh.n_head_log2) + 1) : 1.0f;
        w.mask = mask ? (const ggml_fp16_t *) ((const char *) mask->data + w.iq1 * mask->nb[1] +
                                               (w.iq2 % mask->ne[2]) * mask->nb[2] + (w.iq3 % mask->ne[3]) * mask->nb[3])
                      : nullptr;
        u.qrow[i] = (const float *) ((const char *) q->data + (w.iq1 * q->nb[1] + w.iq2 * q->nb[2] + w.iq3 * q->nb[3]));
    }
    for (int64_t i = 0; i < n; i++) {
        u.same_mask[i] = i;
        for (int64_t j = 0; j < i; j++) {
            if (u.rows[j].mask == u.rows[i].mask && u.rows[j].slope == u.rows[i].slope) {
                u.same_mask[i] = j;
                break;
            }
        }
    }
    const int64_t ik2 = u.rows[0].iq2 / sh.rk2, ik3 = u.rows[0].iq3 / sh.rk3;
    const int64_t iv2 = u.rows[0].iq2 / sh.rv2, iv3 = u.rows[0].iq3 / sh.rv3;
    u.kbase = (const char *) sh.k->data + ik2 * sh.k->nb[2] + ik3 * sh.k->nb[3];
    u.vbase = (const char *) sh.v->data + iv2 * sh.v->nb[2] + iv3 * sh.v->nb[3];
}

// The K and V rows of cells [c0, c1) (and below nek1) fetched into L2.
static inline void fetch_cells(const shape & sh, const unit_state & u, int64_t c0, int64_t c1) {
    for (int64_t ic = c0; ic < c1 && ic < sh.nek1; ic++) {
        fetch(u.kbase + ic * sh.k->nb[1], sh.DK * sizeof(ggml_fp16_t));
        fetch(u.vbase + ic * sh.v->nb[1], sh.DV * sizeof(ggml_fp16_t));
    }
}

// Each row's mask over the block of nc cells from c0 into mvs (rows with an earlier row's mask share
// its), and whether the row sees some cell of it; returns whether any row does.
static inline bool mask_block(unit_state & u, int64_t c0, int64_t nc, bool * seen) {
    bool any = false;
    for (int64_t i = 0; i < u.n; i++) {
        const int64_t j = u.same_mask[i];
        if (j != i) {
            seen[i] = seen[j];
            continue;
        }
        float * mv = u.mvs + i * BC;
        const ggml_fp16_t * m = u.rows[i].mask;
        if (m && nc == BC) {
            for (int64_t l = 0; l < BC; l += W) {
                vstore(mv + l, vmul(vset(u.rows[i].slope), vload_h(m + c0 + l)));
            }
        } else {
            for (int64_t l = 0; l < BC; l++) {
                mv[l] = l >= nc ? -INFINITY : m ? u.rows[i].slope * GGML_CPU_FP16_TO_FP32(m[c0 + l]) : 0.0f;
            }
        }
        seen[i] = false;
        for (int64_t l = 0; l < BC; l += W) {
            seen[i] |= vseen(vload(mv + l));
        }
        any |= seen[i];
    }
    return any;
}

// Row i's scores over the block from c0: all -inf (no cell of it seen).
static inline void unseen_block(unit_state & u, int64_t i, int64_t c0) {
    for (int64_t l = 0; l < BC; l++) u.P[i * u.cells + c0 + l] = -INFINITY;
}

// The block's K rows widened to F32 into kbuf (cells past nc as zeros).
static inline void widen_k(const shape & sh, unit_state & u, int64_t c0, int64_t nc) {
    for (int64_t t = 0; t < BC; t++) {
        const ggml_fp16_t * kc = (const ggml_fp16_t *) (u.kbase + (c0 + t) * sh.k->nb[1]);
        for (int64_t d = 0; d < sh.DK; d += W) {
            vstore(u.kbuf + t * sh.DK + d, t < nc ? vload_h(kc + d) : vset(0.0f));
        }
    }
}

// A block of scores, as the score function makes them from the dot products: scaled, soft-capped,
// plus the mask (slope times ALiBi's bias), and -inf where masked.
static inline void finish_scores(const shape & sh, float * out, const float * mvr) {
    for (int64_t l = 0; l < BC; l += W) {
        vstore(out + l, vmul(vload(out + l), vset(sh.scale)));
    }
    if (sh.logit_softcap != 0.0f) {
        for (int64_t l = 0; l < BC; l++) out[l] = sh.logit_softcap * tanhf(out[l]);
    }
    for (int64_t l = 0; l < BC; l += W) {
        const vec mv = vload(mvr + l);
        vstore(out + l, vmasked(vadd(vload(out + l), mv), mv));
    }
}

// The block's scores of the rows that see some cell of it, two rows per K load (dots()); the others'
// are -inf.
static inline void score_block(const shape & sh, unit_state & u, int64_t c0, const bool * seen) {
    int64_t seeing[UNIT_ROWS], ns = 0;
    for (int64_t i = 0; i < u.n; i++) {
        if (seen[i]) {
            seeing[ns++] = i;
        } else {
            unseen_block(u, i, c0);
        }
    }
    for (int64_t s0 = 0; s0 < ns; s0 += 2) {
        const int R = ns - s0 >= 2 ? 2 : 1;
        const float * qs[2];
        float * outs[2];
        for (int r = 0; r < R; r++) {
            qs[r] = u.qrow[seeing[s0 + r]];
            outs[r] = u.P + seeing[s0 + r] * u.cells + c0;
        }
        if (R == 2) {
            dots<2>(u.kbuf, qs, sh.DK, outs);
        } else {
            dots<1>(u.kbuf, qs, sh.DK, outs);
        }
        for (int r = 0; r < R; r++) {
            finish_scores(sh, outs[r], u.mvs + u.same_mask[seeing[s0 + r]] * BC);
        }
    }
}

// Pass 1, every row's scores, a block of BC cells at a time: each row's mask over the block; where some
// row sees a cell of it, the block's K rows widened once for all the rows, and each row that sees one
// gets its BC dot products, scaled, soft-capped and masked in lanes. A block no row sees is skipped.
// The K and V rows AHEAD blocks on are fetched meanwhile.
static inline void scores(const shape & sh, unit_state & u) {
    fetch_cells(sh, u, 0, AHEAD * BC);
    for (int64_t c0 = 0; c0 < sh.nek1; c0 += BC) {
        const int64_t nc = sh.nek1 - c0 < BC ? sh.nek1 - c0 : BC;
        fetch_cells(sh, u, c0 + AHEAD * BC, c0 + (AHEAD + 1) * BC);
        bool seen[UNIT_ROWS];
        if (!mask_block(u, c0, nc, seen)) {
            for (int64_t i = 0; i < u.n; i++) unseen_block(u, i, c0);
            continue;
        }
        widen_k(sh, u, c0, nc);
        score_block(sh, u, c0, seen);
    }
}

// Pass 2 for row i, the softmax: the maximum (with the head's sink, where the model has one), exp in
// lanes, the sum into the row's S, and its scores replaced by their weights. The visible cells' scores
// are first packed in cell order, so a score's lane is its rank among them, not its cell: a
// sliding-window cache that wrapped around holds the same cells, in the same order, at other indices in
// a batch than alone.
static inline void softmax(const shape & sh, unit_state & u, int64_t i) {
    row & w = u.rows[i];
    const int64_t cells = u.cells;
    float * p = u.P + i * cells;
    float * packed = u.packed;
    const int64_t visible = pack(p, cells, packed);
    const int64_t lanes = (visible + W - 1) / W * W;
    for (int64_t c = visible; c < lanes; c++) {
        packed[c] = -INFINITY;
    }
    vec m = vset(-INFINITY);
    for (int64_t c = 0; c < lanes; c += W) {
        m = vmax(m, vload(packed + c));
    }
    float M = lanes ? vhmax(m) : -INFINITY;
    const float sink = sh.sinks ? ((const float *) sh.sinks->data)[w.iq2] : -INFINITY;
    M = sink > M ? sink : M;
    if (M == -INFINITY) {  // every cell masked: no weight anywhere (ggml's loop writes zeros too)
        for (int64_t c = 0; c < cells; c++) {
            p[c] = 0.0f;
        }
        w.S = 0.0f;
        return;
    }
    vec sum = vset(0.0f);
    const vec vm = vset(M);
    for (int64_t c = 0; c < lanes; c += W) {
        const vec e = vexp(vsub(vload(packed + c), vm));
        vstore(packed + c, e);
        sum = vadd(sum, e);
    }
    w.S = vsum(sum) + (sh.sinks ? expf(sink - M) : 0.0f);
    unpack(p, cells, packed);  // each weight back to its cell, 0 where masked
}

// Pass 3, the weighted sum of V in cell order into acc: up to four rows at a time share each V row's
// widening, N lanes-wide slices of each row's sum kept in registers.
static inline void weigh_v(const shape & sh, unit_state & u) {
    const int64_t DV = sh.DV, n = u.n, cells = u.cells;
    const int64_t slices = DV / W;
    constexpr int64_t ACC = W == 16 ? 16 : 8;  // sums kept in registers at once
    const int64_t N = slices % 8 == 0 && 8 <= ACC / 2 ? 8 : slices % 4 == 0 ? 4 : slices % 2 == 0 ? 2 : 1;
    const int64_t R = ACC / N < 4 ? ACC / N : 4;
    for (int64_t i0 = 0; i0 < n;) {
        const int64_t left = n - i0;
        const int r = (int) (left >= 4 && R >= 4 ? 4 : left >= 2 && R >= 2 ? 2 : 1);
        const float * p[4];
        float * a[4];
        for (int j = 0; j < r; j++) {
            p[j] = u.P + (i0 + j) * cells;
            a[j] = u.acc + (i0 + j) * DV;
        }
        for (int64_t d = 0; d < DV; d += N * W) {
            float * ad[4];
            for (int j = 0; j < r; j++) {
                ad[j] = a[j] + d;
            }
            const char * vd = u.vbase + d * sizeof(ggml_fp16_t);
            switch (N) {
                case 8: weigh_rows<8>(r, p, vd, sh.v->nb[1], sh.nek1, ad); break;
                case 4: weigh_rows<4>(r, p, vd, sh.v->nb[1], sh.nek1, ad); break;
                case 2: weigh_rows<2>(r, p, vd, sh.v->nb[1], sh.nek1, ad); break;
                default: weigh_rows<1>(r, p, vd, sh.v->nb[1], sh.nek1, ad); break;
            }
        }
        i0 += r;
    }
}

// Each row's weighted sum divided by its softmax's sum, into its place in dst.
static inline void write_rows(const shape & sh, const unit_state & u, ggml_tensor * dst) {
    for (int64_t i = 0; i < u.n; i++) {
        const row & w = u.rows[i];
        const float S_inv = w.S == 0.0f ? 0.0f : 1.0f / w.S;
        float * out = (float *) ((char *) dst->data + (w.iq3 * dst->ne[2] * dst->ne[1] + w.iq2 + w.iq1 * dst->ne[1]) * dst->nb[1]);
        const vec vs = vset(S_inv);
        for (int64_t d = 0; d < sh.DV; d += W) {
            vstore(out + d, vmul(vload(u.acc + i * sh.DV + d), vs));
        }
    }
}

// Rows [r0, r1), all of one K/V head, in three passes over the cells: each row's scores (K·q, scaled,
// soft-capped, masked), their softmax (the maximum, exp in lanes, the sum), then the weighted sum of V
// in F32. A row's arithmetic depends only on its query, its mask and the visible cells: cells in cell
// order, a score's lane its rank among the visible cells, masked cells weighing exactly 0 and skipped.
// So its result is the same bits in any batch, with any number of threads, and whichever rows share
// its unit.
static void unit(const shape & sh, ggml_tensor * dst, int64_t r0, int64_t r1, std::vector<float> & scratch) {
    unit_state u;
    start_unit(sh, r0, r1, scratch, u);
    scores(sh, u);
    for (int64_t i = 0; i < u.n; i++) {
        softmax(sh, u, i);
    }
    weigh_v(sh, u);
    write_rows(sh, u, dst);
}

// The units of a decode: each K/V group's rows (contiguous in ggml's order) cut into pieces of at
// most UNIT_ROWS, and into more pieces where there are fewer units than threads.
static inline int64_t units_per_group(int64_t group_rows, int64_t groups, int nth) {
    int64_t per = (group_rows + UNIT_ROWS - 1) / UNIT_ROWS;
    while (per * groups < nth && per < group_rows) {
        per++;
    }
    return per;
}

// Computes the attention of `dst` for few query rows and returns true, or returns false where ggml's
// loop must (this kernel turned off, rows past FEW_COLUMNS, a type or head size handles() refuses,
// K and V heads shared differently).
static bool run(const ggml_compute_params * params, ggml_tensor * dst) {
    const shape sh = read_shape(dst);
    if (!specgen::invariant(sh.neq1) || !specgen::kernel_on("attention")) {
        return false;
    }
    if (!handles(sh) || sh.rk2 != sh.rv2 || sh.rk3 != sh.rv3 || sh.rk2 < 1 || sh.rk3 < 1) {
        return false;
    }
    const int ith = params->ith, nth = params->nth;
    const int64_t group_rows = sh.rk2 * sh.neq1;
    const int64_t groups = sh.neq3 * (sh.neq2 / sh.rk2);
    const int64_t per = units_per_group(group_rows, groups, nth);
    const int64_t nunits = groups * per;

    static thread_local std::vector<float> scratch;

    if (ith == 0) {
        ggml_threadpool_chunk_set(params->threadpool, nth);
    }
    ggml_barrier(params->threadpool);

    for (int64_t u = ith; u < nunits; u = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        const int64_t g = u / per, p = u % per;
        const int64_t r0 = g * group_rows + (group_rows * p) / per;
        const int64_t r1 = g * group_rows + (group_rows * (p + 1)) / per;
        if (r1 > r0) {
            unit(sh, dst, r0, r1, scratch);
        }
    }
    return true;
}

}  // namespace specgen_attention
