#include "bench/gpu/vllm_sm90.h"

namespace qlinear::gpu::vllm_sm90 {

namespace {

enum class Config { kM32NSmall, kM32NBig, kM64, kM128, kDefault };

// vLLM's rule: M rounded up to a power of two, at least 32; N below 8192 or not.
Config config_for(const Args& a) {
  int mp2 = 32;
  while (mp2 < a.m) mp2 *= 2;
  if (mp2 <= 32) return a.n < 8192 ? Config::kM32NSmall : Config::kM32NBig;
  if (mp2 <= 64) return Config::kM64;
  if (mp2 <= 128) return Config::kM128;
  return Config::kDefault;
}

}  // namespace

const char* config_name(const Args& a) {
  switch (config_for(a)) {
    case Config::kM32NSmall:
      return "64x64x256 cluster 1x8 TMA-WS";
    case Config::kM32NBig:
      return "64x128x256 cluster 1x4 TMA-WS";
    case Config::kM64:
      return "64x64x256 TMA-WS";
    case Config::kM128:
      return "64x128x128 cluster 2x1 ping-pong";
    case Config::kDefault:
      break;
  }
  return "128x128x128 cluster 2x1 ping-pong";
}

size_t workspace_bytes(const Args& a) {
  switch (config_for(a)) {
    case Config::kM32NSmall:
      return workspace_bytes_m32_nsmall(a);
    case Config::kM32NBig:
      return workspace_bytes_m32_nbig(a);
    case Config::kM64:
      return workspace_bytes_m64(a);
    case Config::kM128:
      return workspace_bytes_m128(a);
    case Config::kDefault:
      break;
  }
  return workspace_bytes_default(a);
}

cudaError_t run(const Args& a, void* workspace, cudaStream_t stream) {
  if (a.k % 16 != 0 || a.n % 16 != 0) return cudaErrorNotSupported;
  switch (config_for(a)) {
    case Config::kM32NSmall:
      return run_m32_nsmall(a, workspace, stream);
    case Config::kM32NBig:
      return run_m32_nbig(a, workspace, stream);
    case Config::kM64:
      return run_m64(a, workspace, stream);
    case Config::kM128:
      return run_m128(a, workspace, stream);
    case Config::kDefault:
      break;
  }
  return run_default(a, workspace, stream);
}

}  // namespace qlinear::gpu::vllm_sm90
