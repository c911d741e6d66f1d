// The packed weight layout of the AVX-512 VNNI GEMM (avx512_vnni_gemm.h), and its packer. Plain
// C++ built with the generic flags: it runs, and is tested, on any host.
//
// Packed weight layout:
//   K is padded with zero weights to k_pad (round_up(K, 4) for cpu.avx512_vnni, round_up(K, 64)
//   for cpu.amx's tiles; any multiple of 4 at least K) and N to n_pad = round_up(N, 16).
//   Columns are grouped in panels of 64 (the last panel may hold 16, 32 or 48). Panel p starts at
//   byte p * 64 * k_pad and holds, for each k-step s = 0 .. k_pad/4 - 1, its nv (<= 4) vectors of
//   64 bytes: vector v, lane l (column 64p + 16v + l) holds W[n, 4s .. 4s+3]. That is the operand
//   order of VPDPBUSD, and a panel is one contiguous stream.
#pragma once

#include <cstdint>

namespace qlinear::cpu {

inline constexpr int64_t kVnniPanel = 64;  // columns per panel (4 zmm of int32)

// Fills panels [p_begin, p_end) of `packed` (n_pad * k_pad bytes in all, the layout above; every
// byte of those panels, padding included) and their columns of comp = -128 * sum_k W[n, k]
// (wrapping; 0 for padded columns). w is [N, K] row-major. Panels are independent: disjoint
// ranges may be packed at once, on different threads.
void pack_weights_vnni(const int8_t* w, int64_t n, int64_t k, int64_t k_pad, int64_t n_pad,
                       int8_t* packed, int32_t* comp, int64_t p_begin, int64_t p_end);

}  // namespace qlinear::cpu
