// AVX-512 VNNI (VPDPBUSD) GEMM for W8A8: acc[m, n] = sum_k xq[m, k] * W[n, k] in exact int32,
// with the SPEC section 4 epilogue applied to each register tile before it leaves the core.
//
// VPDPBUSD multiplies unsigned by signed bytes, so the activations enter as xu = xq + 128 (uint8)
// and every accumulator starts at comp[n] = -128 * colsum[n]: sum_k (xq + 128) * W - 128 * colsum
// = sum_k xq * W. The int32 arithmetic wraps (VPDPBUSD does not saturate) and the true sum fits in
// int32 for K <= kMaxK, so the result is exact even where the intermediate sum wraps.
//
// Packed weight layout: see kernels/cpu/vnni_pack.h (built once at load by pack_weights_vnni).
//
// Register tile: 6 rows x 64 columns (24 zmm accumulators), the 4 weight vectors of a k-step
// loaded once and each activation dword broadcast once: 24 VPDPBUSD per 10 loads. Up to K = 4096
// a tile runs the whole K in registers; longer K is cut into 4096-deep blocks that every row of
// the call shares while the block is in L2 (see avx512_vnni_gemm.cc). Where the weights stream
// from DRAM under several row tiles, the caller may ask for shallower blocks whose row tiles
// stream the next block into L2 while they multiply (VnniGemmArgs::k_block).
//
// Compiled with AVX-512 flags: call only on hosts with avx512f, avx512bw, avx512vl and
// avx512_vnni. Functions are plain and reentrant; concurrent calls on disjoint outputs are safe.
#pragma once

#include <cstdint>

#include "kernels/cpu/epilogue_avx512.h"
#include "kernels/cpu/vnni_pack.h"

namespace qlinear::cpu {

inline constexpr int64_t kVnniMr = 6;  // rows per register tile: 6 x 4 accumulators
// Most rows per call of gemm_u8s8_vnni_avx512: the size of its accumulator scratch for long K
// (516 x 64 x 4 = 129 KiB, which stays in L2 next to a 256 KiB block of weights; 258 and 516
// measured 1-2% faster than 1536 at M = 1024, K = 14336).
inline constexpr int64_t kVnniMaxRows = 516;

struct VnniGemmArgs {
  const int8_t* packed = nullptr;  // vnni_pack.h's layout
  const int32_t* comp = nullptr;   // [n_pad]
  int64_t n = 0;                   // real N: columns >= n are never written
  int64_t k_pad = 0;
  int64_t n_pad = 0;
  const uint8_t* xu = nullptr;  // [M, ldx] uint8 (xq + 128); bytes [K, k_pad) of a row: any value
  int64_t ldx = 0;
  // Prefetch weights this many bytes ahead of use (0: no prefetch). Pays off when they stream
  // from DRAM (small M), not when a panel is reused from L2 across many row tiles.
  int64_t prefetch_bytes = 0;
  // K blocking where a call's rows span several row tiles: 0 blocks K only beyond 4096, in
  // 4096-deep blocks; else K is cut into blocks of k_block (rounded down to a multiple of 4, at
  // least 4) that every row tile of the call runs in turn while the block is in cache.
  int64_t k_block = 0;
  // In blocked runs, the full row tiles of each block prefetch the next block into L2 (each a
  // share; after a panel's last block, the first of the call's next panel), so the weights keep
  // streaming from DRAM while the tiles multiply.
  bool prefetch_next_block = false;
  EpilogueArgs epi;  // comp must be null here: it is folded into the accumulators
  // When set, the exact int32 accumulators acc[m * ld_acc + n] are written here instead of y
  // (no epilogue): for other epilogues and for testing the GEMM on its own.
  int32_t* acc_out = nullptr;
  int64_t ld_acc = 0;
};

// Writes finished accumulator rows [m, m + rows) of columns [n0, n0 + cols) (tile: their int32
// sums, kVnniPanel apart): through the epilogue to y, or raw to args.acc_out. Shared with the
// AMX GEMM, whose tiles end in the same form.
void finish_vnni_rows(const VnniGemmArgs& args, const int32_t* tile, int64_t m, int64_t rows,
                      int64_t n0, int64_t cols);

// y[m, n] (or acc_out) for rows [m_begin, m_end) (at most kVnniMaxRows) and the columns of
// panels [p_begin, p_end). acc_scratch: kVnniMaxRows x kVnniPanel int32, 64-byte aligned, private
// to the calling thread.
void gemm_u8s8_vnni_avx512(const VnniGemmArgs& args, int64_t m_begin, int64_t m_end,
                           int64_t p_begin, int64_t p_end, int32_t* acc_scratch);

}  // namespace qlinear::cpu
