// AVX2 GEMM for W8A8: acc[m, n] = sum_k xq[m, k] * W[n, k] in exact int32, with the SPEC section 4
// epilogue applied to each register tile before it leaves the core.
//
// AVX2 has no VPDPBUSD. Its byte multiply, VPMADDUBSW, adds pairs of u8 x s8 products into a
// saturating int16, which int8 x int8 products overflow (2 x 255 x 128 with the +128 shift, and
// even 2 x 128 x 128 by the sign trick), so it cannot be exact. This GEMM multiplies int16
// instead: VPMADDWD adds a pair of int16 products into an int32 lane, exactly (|sum| <= 2^15), and
// VPADDD accumulates. The activations arrive as int16 from the quantizer; the weights stay int8
// in memory (so a small-M call streams N x K bytes, not twice that) and are widened in registers
// by VPMOVSXBW, once per vector for all the tile's rows. The int32 arithmetic wraps and the true
// sum fits in int32 for K <= kMaxK, so the result is exact.
//
// Packed weight layout (built once at load by pack_weights_avx2):
//   K is padded with zero weights to k_pad = round_up(K, 2) and N to n_pad = round_up(N, 8).
//   Columns are grouped in panels of 16 (the last panel may hold 8). Panel p starts at byte
//   p * 16 * k_pad and holds, for each k-step s = 0 .. k_pad/2 - 1, its nv (<= 2) vectors of 16
//   bytes: vector v, column j (column 16p + 8v + j) holds W[n, 2s], W[n, 2s + 1] at bytes 2j and
//   2j + 1. Widened, that is VPMADDWD's operand order, and a panel is one contiguous stream.
//
// Register tile: 6 rows x 16 columns (12 ymm accumulators, 2 weight vectors, a broadcast
// activation pair and a product: all 16 registers): per k-step 2 weight loads for 12 VPMADDWD.
// Long K is cut into blocks that every row of the call shares while the block is in L2 (see
// avx2_gemm.cc).
//
// Compiled with AVX2 flags: call only after the host passed avx2_isa_status(). Functions are
// plain and reentrant; concurrent calls on disjoint outputs are safe.
#pragma once

#include <cstdint>

#include "kernels/cpu/epilogue_args.h"

namespace qlinear::cpu {

inline constexpr int64_t kAvx2Panel = 16;  // columns per panel (2 ymm of int32)
inline constexpr int64_t kAvx2Mr = 6;      // rows per register tile: 6 x 2 accumulators
// Most rows per call of gemm_s16s8_avx2: the size of its accumulator scratch for long K
// (516 x 16 x 4 = 33 KiB).
inline constexpr int64_t kAvx2MaxRows = 516;

// Fills panels [p_begin, p_end) of `packed` (n_pad * k_pad bytes in all, see above) from w, [N, K]
// row-major, padding included. Disjoint panel ranges may be packed concurrently.
void pack_weights_avx2(const int8_t* w, int64_t n, int64_t k, int64_t k_pad, int64_t n_pad,
                       int8_t* packed, int64_t p_begin, int64_t p_end);

struct Avx2GemmArgs {
  const int8_t* packed = nullptr;  // the layout above
  int64_t n = 0;                   // real N: columns >= n are never written
  int64_t k_pad = 0;
  int64_t n_pad = 0;
  const int16_t* x16 = nullptr;  // [M, ldx] int16 xq; elements [K, k_pad) of a row must be 0
  int64_t ldx = 0;               // in elements, even
  // Prefetch weights this many bytes ahead of use (0: no prefetch). Pays off when they stream
  // from DRAM (small M), not when a panel is reused from L2 across many row tiles.
  int64_t prefetch_bytes = 0;
  EpilogueArgs epi;  // comp must be null: the sums are exact as they are
  // When set, the exact int32 accumulators acc[m * ld_acc + n] are written here instead of y
  // (no epilogue): for other epilogues and for testing the GEMM on its own.
  int32_t* acc_out = nullptr;
  int64_t ld_acc = 0;
};

// y[m, n] (or acc_out) for rows [m_begin, m_end) (at most kAvx2MaxRows) and the columns of panels
// [p_begin, p_end). acc_scratch: kAvx2MaxRows x kAvx2Panel int32, 32-byte aligned, private to the
// calling thread.
void gemm_s16s8_avx2(const Avx2GemmArgs& args, int64_t m_begin, int64_t m_end, int64_t p_begin,
                     int64_t p_end, int32_t* acc_scratch);

}  // namespace qlinear::cpu
