// The anchor of qlinear_cpu_bench on hosts where cpu.onednn cannot run (x86-64 without AVX-512
// VNNI): oneDNN's own int8 matmul, u8 x s8 -> s32 with the weights in the blocked layout it
// picks, as cpu.onednn calls it, but the GEMM alone: no quantization, no epilogue, its s32 result
// left in a scratch buffer. On these ISAs oneDNN multiplies with VPMADDUBSW, whose int16 pair sums
// saturate, so its result is not exact and it cannot serve; as a time it is the least that an op
// built on it would take.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/core/kernel.h"
#include "kernels/core/weights.h"

namespace qlinear::bench {

// Whether this binary was built with oneDNN.
bool onednn_anchor_available();

// The GEMM of `weights` as oneDNN runs it. Its run() reads only args.m: its u8 activations (all
// 0x85) and s32 output live in its own buffers.
absl::StatusOr<std::unique_ptr<PreparedKernel>> make_onednn_gemm_anchor(
    const LayerWeights& weights);

}  // namespace qlinear::bench
