// AMX (TDPBUSD) GEMM for W8A8: acc[m, n] = sum_k xq[m, k] * W[n, k] in exact int32, with the SPEC
// section 4 epilogue applied to each tile of accumulators before it leaves the core.
//
// The operands are those of the AVX-512 VNNI GEMM (avx512_vnni_gemm.h): the activations enter as
// xu = xq + 128 (uint8, TDPBUSD multiplies unsigned by signed bytes), the weights in
// vnni_pack.h's panels, and comp[n] = -128 * colsum[n] recovers the int8 x int8 sums. Here K is
// padded to k_pad = round_up(K, 64) (zero weights past K): a panel's 16 k-steps of one vector of
// 16 columns are one B tile (16 rows of 64 bytes, one row per k-step, the panel's bytes per k-step
// apart), and 16 rows of xu over the same 64 values of K one A tile, so every k-step of the call
// runs in whole tiles. Bytes [K, k_pad) of an xu row may hold any value: their weights are zero.
//
// Tiles: a panel's up to 4 vectors (64 columns) accumulate in 4 C tiles of 16 rows x 16 int32,
// one A tile loaded per 64 values of K and each of the panel's B tiles once per A: 4 TDPBUSD per
// 5 tile loads. A call's rows run in tiles of 16 (the last one shorter) under each panel, so a
// panel's weights are read from memory once per call and from L2 for its later row tiles.
//
// Compiled with AMX and AVX-512 flags: call only after amx_isa_status() passed on this host (the
// CPU has AMX-INT8 and the OS gave this process the tiles' state). Each call configures the tiles
// of its thread and releases them before it returns. Concurrent calls on disjoint outputs are
// safe.
#pragma once

#include <cstdint>

#include "kernels/cpu/avx512_vnni_gemm.h"

namespace qlinear::cpu {

inline constexpr int64_t kAmxRows = 16;      // rows per tile
inline constexpr int64_t kAmxKStep = 64;     // values of K per tile
inline constexpr int64_t kAmxMaxRows = 512;  // rows per call of gemm_u8s8_amx (any multiple of 16)

// y[m, n] (or args.acc_out) for rows [m_begin, m_end) (at most kAmxMaxRows) and the columns of
// panels [p_begin, p_end). args as for gemm_u8s8_vnni_avx512, but k_pad a multiple of kAmxKStep
// and ldx at least k_pad; prefetch_bytes, k_block and prefetch_next_block are not used.
// tile_scratch: kAmxRows x kVnniPanel int32, 64-byte aligned, private to the calling thread.
void gemm_u8s8_amx(const VnniGemmArgs& args, int64_t m_begin, int64_t m_end, int64_t p_begin,
                   int64_t p_end, int32_t* tile_scratch);

}  // namespace qlinear::cpu
