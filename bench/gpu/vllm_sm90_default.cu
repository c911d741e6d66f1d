// The "vLLM" anchor's configuration Default (vllm_sm90.h).
#include "bench/gpu/vllm_sm90.cuh"

namespace qlinear::gpu::vllm_sm90 {
QLINEAR_VLLM_DEFINE(default, Default)
}  // namespace qlinear::gpu::vllm_sm90
