// Activation quantization (SPEC section 2) with AVX2, bit-exact with
// reference::quantize_activations for every scheme and input dtype.
//
// Compiled with AVX2 flags: call only after the host passed avx2_isa_status(). These are plain
// functions on raw pointers, safe to call from several threads on disjoint rows.
#pragma once

#include <cstdint>

#include "kernels/cpu/quantize_args.h"

namespace qlinear::cpu {

// Quantizes rows [row_begin, row_end). Returns the first row in that range that holds a NaN or
// +-Inf (and stops there), or -1 when every row was finite.
//
// With xq16 null, xq is written as quantize_rows_avx512 writes it. With xq16 set, each xq value is
// written sign-extended to int16 at xq16[m * args.xq_stride + i] instead (args.xq is unused, and
// args.shift_to_u8 must be false): the operand form of VPMADDWD, which the AVX2 GEMM multiplies.
int64_t quantize_rows_avx2(const QuantizeArgs& args, int16_t* xq16, int64_t row_begin,
                           int64_t row_end);

}  // namespace qlinear::cpu
