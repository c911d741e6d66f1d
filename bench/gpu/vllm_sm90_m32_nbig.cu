// The "vLLM" anchor's configuration M32NBig (vllm_sm90.h).
#include "bench/gpu/vllm_sm90.cuh"

namespace qlinear::gpu::vllm_sm90 {
QLINEAR_VLLM_DEFINE(m32_nbig, M32NBig)
}  // namespace qlinear::gpu::vllm_sm90
