// AMX (TDPBUSD) GEMM for W8A8: acc[m, n] = sum_k xq[m, k] * W[n, k] in exact int32, with the SPEC
// section 4 epilogue applied to each block of accumulators before it leaves the core.
//
// The operands are those of the AVX-512 VNNI GEMM (avx512_vnni_gemm.h): the activations enter as
// xu = xq + 128 (uint8, TDPBUSD multiplies unsigned by signed bytes), the weights in
// vnni_pack.h's panels, and comp[n] = -128 * colsum[n] recovers the int8 x int8 sums. Here K is
// padded to k_pad = round_up(K, 64) (zero weights past K): a panel's 16 k-steps of one vector of
// 16 columns are one B tile (16 rows of 64 bytes, one row per k-step, the panel's bytes per k-step
// apart). xu comes in tiles too (QuantizeArgs::xq_tiles): each 16 rows x 64 values of K one
// contiguous A tile of 1 KB, so that a tile load reads 16 consecutive cache lines rather than
// lines a row apart (16 pages apart where K = 4096). Bytes [K, k_pad) of an xu row may hold any
// value: their weights are zero.
//
// Tiles: two row tiles (32 rows) and two vectors (32 columns) at a time, in 4 C tiles fed by 2 A
// and 2 B tiles, each loaded tile used twice: one tile load per TDPBUSD, where one row tile
// against a panel's 4 vectors (a lone row tile: the last of a block, or the first of a short one)
// loads 5 per 4. The rows run in blocks of kAmxRowBlock under each panel, and K in blocks of
// kAmxKBlock (the C tiles stored to the scratch and loaded back between them), so that a block's
// activations stay in L2 while the panels pass. From kAmxReuseRows rows, while a panel is
// multiplied the next one is prefetched into L2, spread over its tile steps; a shorter block
// streams each panel from memory with its first row tile alone, which reads each k-step's bytes
// whole and in order (a pair's two vectors read half of them), prefetching them into L1 two tile
// steps ahead.
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
// Rows of a block (a multiple of 32) and values of K of a block (a multiple of 64): a block's
// activations, 1 MiB, stay in a core's L2 while the panels pass.
inline constexpr int64_t kAmxRowBlock = 256;
inline constexpr int64_t kAmxKBlock = 4096;
// From this many rows in a block, a panel is reused from L2 by its row pairs and the next panel is
// prefetched while they multiply; fewer rows stream the panel from memory (amx_gemm.cc).
inline constexpr int64_t kAmxReuseRows = 128;
// Tasks per thread where a call has one row tile (M <= 16) and streams the weights: smaller
// tasks spread the stream more evenly (kernels/cpu/amx_kernel.cc).
inline constexpr int64_t kAmxStreamTasksPerThread = 16;
// The accumulator scratch of one call: a row block of a panel's int32 sums.
inline constexpr int64_t kAmxScratchBytes = kAmxRowBlock * kVnniPanel * 4;

// y[m, n] (or args.acc_out) for rows [m_begin, m_end) (m_begin a multiple of kAmxRows, at most
// kAmxMaxRows rows) and the columns of panels [p_begin, p_end). args as for
// gemm_u8s8_vnni_avx512, but k_pad a multiple of kAmxKStep, ldx = k_pad and xu in tiles
// (QuantizeArgs::xq_tiles); prefetch_bytes, k_block and prefetch_next_block are not used.
// scratch: kAmxScratchBytes, 64-byte aligned, private to the calling thread.
void gemm_u8s8_amx(const VnniGemmArgs& args, int64_t m_begin, int64_t m_end, int64_t p_begin,
                   int64_t p_end, int32_t* scratch);

}  // namespace qlinear::cpu
