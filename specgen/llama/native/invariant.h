// specgen: batch-invariant decoding on llama.cpp's CPU backend, and the switch for specgen's kernels.
//
// Why: greedy speculative decoding is lossless only if a token's logits are the same bits whether
// the target decoded it alone or inside a verification batch. llama.cpp's CPU backend computes a
// batch of 2 or more rows with other code than one row: tinyBLAS and the repacked GEMMs for the
// matrix products (their own block and lane order), and flash attention tiled from 64 query rows
// or split over threads for one row once the cache passes 512 cells. Each rounds differently, so
// a quantized target's greedy text under a speculative method drifted from its plain text.
//
// What: for products and attention with at most FEW_COLUMNS rows ("columns" of the product: the
// tokens of a decode), every row is computed as a one-row decode computes it: a specgen kernel
// where there is one for the weight type (few_columns.h: each weight block read once for all the
// rows, each row's arithmetic that of ggml's one-row vec_dot), ggml's own one-row code otherwise,
// the repacked types through their one-row GEMV, and attention through specgen's (attention.h: each
// row in F32 lanes, whatever else is in the batch) or else ggml's per-row flash-attention loop; the KV
// cache puts no new token in a cell freed by a rejected draft before it wraps around (both sum a
// row's cells in cell order). Each row's result then depends on
// neither the batch nor the thread count. Bigger batches (prompt processing) keep llama.cpp's kernels: a prompt is read the same way
// whatever method follows it.
//
// SPECGEN_KERNELS (read once per process):
//   unset or 1   batch invariance and every specgen kernel this build has
//   0            llama.cpp's own kernels everywhere (specgen's patch does nothing)
//   ggml         batch invariance with ggml's one-row code only (no specgen kernel)
//   q4_1,q8_0    batch invariance; specgen kernels only for the listed weight types (and "attention"
//                for specgen's attention; without it, ggml's per-row loop)
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, and the
// patches (specgen/llama/patches/*.patch: sgemm.cpp, repack.cpp, tiled.cpp, ops.cpp, llama-kv-cache.cpp,
// ggml-cpu.cpp) call invariant() where llama.cpp picks a kernel by batch size. Plain C++17.
#pragma once

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace specgen {

// The most rows a decode may have and still be computed row by row: auto's largest tree is 80.
constexpr int64_t FEW_COLUMNS = 128;

struct settings {
    bool invariant = true;
    bool all_kernels = true;
    char kernels[256] = "";  // ",q4_1,q8_0," when a list was given
};

static inline const settings & current() {
    static const settings s = [] {
        settings out;
        const char * env = getenv("SPECGEN_KERNELS");
        if (env == nullptr || strcmp(env, "1") == 0 || strcmp(env, "") == 0) {
            return out;
        }
        if (strcmp(env, "0") == 0) {
            out.invariant = out.all_kernels = false;
            return out;
        }
        out.all_kernels = false;
        if (strcmp(env, "ggml") != 0) {
            size_t n = 0;
            out.kernels[n++] = ',';
            for (const char * c = env; *c && n + 2 < sizeof(out.kernels); c++) {
                out.kernels[n++] = *c == ' ' ? ',' : (char) tolower((unsigned char) *c);
            }
            out.kernels[n++] = ',';
            out.kernels[n] = '\0';
        }
        return out;
    }();
    return s;
}

// Whether a product or attention with n rows is computed row by row.
static inline bool invariant(int64_t n) {
    return current().invariant && n >= 1 && n <= FEW_COLUMNS;
}

// Whether specgen's kernel for the weight type named `type` (ggml's name, e.g. "q4_1") is on.
static inline bool kernel_on(const char * type) {
    const settings & s = current();
    if (s.all_kernels) {
        return true;
    }
    char key[32];
    size_t n = strlen(type);
    if (n + 3 > sizeof(key)) {
        return false;
    }
    key[0] = ',';
    memcpy(key + 1, type, n);
    key[n + 1] = ',';
    key[n + 2] = '\0';
    return strstr(s.kernels, key) != nullptr;
}

}  // namespace specgen
