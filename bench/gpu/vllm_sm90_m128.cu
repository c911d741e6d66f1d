// The "vLLM" anchor's configuration M128 (vllm_sm90.h).
#include "bench/gpu/vllm_sm90.cuh"

namespace qlinear::gpu::vllm_sm90 {
QLINEAR_VLLM_DEFINE(m128, M128)
}  // namespace qlinear::gpu::vllm_sm90
