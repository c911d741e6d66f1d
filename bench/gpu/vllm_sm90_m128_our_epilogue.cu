// The "vLLM" anchor's configuration M128 with cuda.cutlass_sm90's epilogue (vllm_sm90.h).
#include "bench/gpu/vllm_sm90.cuh"

namespace qlinear::gpu::vllm_sm90 {
QLINEAR_VLLM_DEFINE(m128_our_epilogue, M128OurEpilogue)
}  // namespace qlinear::gpu::vllm_sm90
