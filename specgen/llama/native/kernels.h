// specgen: what llama.cpp's CPU backend asks of specgen's kernels as a whole: which layout a weight
// takes at load (repack.cpp) and what the build computes with them (ggml-cpu.cpp's system info, which
// `specgen doctor` reads). The kernels themselves are listed once each: the products in
// few_columns.h's PRODUCTS, the packed layouts in packed_traits.h's PACKED.
//
// This file is specgen's own; specgen.llama.build copies native/ into ggml-cpu as specgen/, and
// patches/repack.cpp.patch and patches/ggml-cpu.cpp.patch include it where llama.cpp is built with
// llamafile (whose sgemm.cpp calls the product kernels).
#pragma once

#include "few_columns.h"
#include "packed_traits.h"

#include <stdio.h>
#include <string.h>

#ifdef SPECGEN_FEW

namespace specgen_kernels {

// Where specgen decides a weight's layout, true and `out`: a packed layout's traits, or nullptr for
// ggml's own layout, which a product kernel reads (the repacked GEMV/GEMM would otherwise take its
// products). False where llama.cpp's own choice stands. Base: repack.cpp's tensor_traits_base.
template <typename Base>
static inline bool layout(const ggml_tensor * t, const ggml::cpu::tensor_traits *& out) {
#ifdef SPECGEN_PACKED_LAYOUTS
    out = specgen_packed_traits::first_for<Base>(t, specgen_packed_traits::PACKED());
    if (out != nullptr) return true;
#endif
    out = nullptr;
    return specgen_few::keeps_layout(t->type);
}

// What this build computes with specgen's kernels, for llama.cpp's system info (`specgen doctor`):
// the instruction set, then the names of the kernels that are on, or "off".
static inline const char * describe() {
    static char text[512] = "";  // room for every name (a name that does not fit would vanish from the list)
    if (!text[0]) {
        size_t n = (size_t) snprintf(text, sizeof(text), "%s:", SPECGEN_FEW);
        const size_t bare = n;
        auto add = [&](const char * name) {
            if (specgen::current().invariant && specgen::kernel_on(name) && n + 1 + strlen(name) < sizeof(text)) {
                n += (size_t) snprintf(text + n, sizeof(text) - n, " %s", name);
            }
        };
        for (const specgen_few::product & p : specgen_few::PRODUCTS) add(p.name);
#ifdef SPECGEN_PACKED_LAYOUTS
        specgen_packed_traits::each_name(add, specgen_packed_traits::PACKED());
#endif
        if (n == bare) snprintf(text, sizeof(text), "off");
    }
    return text;
}

}  // namespace specgen_kernels

#endif  // SPECGEN_FEW
