// The epilogue of SPEC section 4 with AVX2: int32 accumulators to y, in the SPEC's exact
// operation order (explicit FMAs where the SPEC has fma, nowhere else), so the result is
// bit-exact with reference::epilogue.
//
// Compiled with AVX2 flags: call only after the host passed avx2_isa_status(). Safe to call from
// several threads on disjoint tiles of y.
#pragma once

#include <cstdint>

#include "kernels/cpu/epilogue_args.h"

namespace qlinear::cpu {

// y[m, n] for m in [m0, m0 + rows), n in [n0, n0 + cols), from acc (element (m0, n0) of an
// int32 tile with row stride ld_acc).
void epilogue_s32_avx2(const EpilogueArgs& args, const int32_t* acc, int64_t ld_acc, int64_t m0,
                       int64_t rows, int64_t n0, int64_t cols);

}  // namespace qlinear::cpu
