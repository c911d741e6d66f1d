// The "vLLM" anchor's configuration M32NSmall (vllm_sm90.h).
#include "bench/gpu/vllm_sm90.cuh"

namespace qlinear::gpu::vllm_sm90 {
QLINEAR_VLLM_DEFINE(m32_nsmall, M32NSmall)
}  // namespace qlinear::gpu::vllm_sm90
