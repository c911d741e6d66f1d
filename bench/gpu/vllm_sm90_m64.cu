// The "vLLM" anchor's configuration M64 (vllm_sm90.h).
#include "bench/gpu/vllm_sm90.cuh"

namespace qlinear::gpu::vllm_sm90 {
QLINEAR_VLLM_DEFINE(m64, M64)
}  // namespace qlinear::gpu::vllm_sm90
