// Activation quantization (SPEC section 2) with AVX-512, bit-exact with
// reference::quantize_activations for every scheme and input dtype.
//
// Compiled with AVX-512 flags: call only after the host passed avx512_vnni_supported() (or its
// own check for avx512f + avx512bw + avx512vl). These are plain functions on raw pointers, safe to
// call from several threads on disjoint rows.
#pragma once

#include <cstdint>

#include "kernels/cpu/quantize_args.h"

namespace qlinear::cpu {

// Quantizes rows [row_begin, row_end). Returns the first row in that range that holds a NaN or
// +-Inf (and stops there), or -1 when every row was finite.
int64_t quantize_rows_avx512(const QuantizeArgs& args, int64_t row_begin, int64_t row_end);

}  // namespace qlinear::cpu
