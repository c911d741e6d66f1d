// The anchor "vLLM": the int8 GEMM of vLLM's W8A8 path on Hopper (`cutlass_scaled_mm` with a
// bias, csrc/quantization/cutlass_w8a8/c3x/scaled_mm_c3x_sm90_int8_dispatch.cuh in vLLM), built
// here from the same CUTLASS 3.x pieces with the same choices, so that qlinear_gpu_bench sets our
// op beside what vLLM runs on the same GPU:
//   - the configuration by M (M rounded up to a power of two, at least 32) and N, as vLLM picks it
//     (tokens x channels x K, cluster tokens x channels, mainloop schedule):
//       M <= 32, N < 8192:   64 x 64 x 256,  cluster 1 x 8, TMA warp-specialized (one tile per CTA)
//       M <= 32, N >= 8192:  64 x 128 x 256, cluster 1 x 4, TMA warp-specialized
//       M in (32, 64]:       64 x 64 x 256,  cluster 1 x 1, TMA warp-specialized
//       M in (64, 128]:      64 x 128 x 128, cluster 2 x 1, ping-pong (persistent)
//       M > 128:             128 x 128 x 128, cluster 2 x 1, ping-pong (persistent)
//   - the stock CUTLASS mainloop (stages: whatever the epilogue's shared memory leaves), the
//     activations [M, K] as A and the weights [N, K] as B, launched in stream order;
//   - vLLM's epilogue with a bias (ScaledEpilogueBias): y = sa[m] * (sb[n] * f32(acc)) + bias[n],
//     bias in y's type, one epilogue visitor tree of CUTLASS's own nodes (multiplies, then
//     multiply_add, which nvcc contracts into one fma as in vLLM's build).
// For the dynamic symmetric scheme with per-channel scales this is our epilogue's order, so its y
// equals ours bit for bit (the benchmark checks it). What vLLM runs before it, the activations'
// quantization (`scaled_int8_quant`), the benchmark stands in for with our quantize kernel: the
// same function, one launch before the GEMM.
//
// CUDA only; needs the CUTLASS headers and sm_90a (a build without them leaves it out).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace qlinear::gpu::vllm_sm90 {

// One call: y [m, n] bf16 = epilogue(xq [m, k] int8 x w [n, k] int8), all device pointers.
struct Args {
  const int8_t* xq = nullptr;
  const int8_t* w = nullptr;
  const float* sa = nullptr;       // [m]
  const float* sb = nullptr;       // [n]
  const uint16_t* bias = nullptr;  // [n], bf16
  uint16_t* y = nullptr;           // [m, n], bf16
  // run_m128_our_epilogue only: cuda.cutlass_sm90's epilogue operands (CutlassSm90Args: the
  // zero-point term where adj is set, the bias in f32).
  const int32_t* azp = nullptr;   // [m]
  const int32_t* adj = nullptr;   // [n]
  const float* bias_f = nullptr;  // [n]
  int m = 0, n = 0, k = 0;
  int sm_count = 0;
};

// The configuration vLLM picks for a's M and N, in words (the table above).
const char* config_name(const Args& a);
// What run needs as workspace (0 for these configurations, by CUTLASS's own count).
size_t workspace_bytes(const Args& a);
// Sets the call's arguments up (as vLLM does on every call: its TMA descriptors are made on the
// host) and launches the GEMM on `stream`. cudaErrorNotSupported where CUTLASS cannot run the
// shape (K or N not a multiple of 16).
cudaError_t run(const Args& a, void* workspace, cudaStream_t stream);

// Each configuration's entry points, one translation unit each (vllm_sm90_*.cu).
#define QLINEAR_VLLM_CONFIG(name)               \
  size_t workspace_bytes_##name(const Args& a); \
  cudaError_t run_##name(const Args& a, void* workspace, cudaStream_t stream);
QLINEAR_VLLM_CONFIG(m32_nsmall)
QLINEAR_VLLM_CONFIG(m32_nbig)
QLINEAR_VLLM_CONFIG(m64)
QLINEAR_VLLM_CONFIG(m128)
QLINEAR_VLLM_CONFIG(default)
// Configuration M128 with cuda.cutlass_sm90's epilogue in place of vLLM's (not vLLM's; the
// benchmark's --vllm sets the two epilogues apart with it).
QLINEAR_VLLM_CONFIG(m128_our_epilogue)
#undef QLINEAR_VLLM_CONFIG

}  // namespace qlinear::gpu::vllm_sm90
