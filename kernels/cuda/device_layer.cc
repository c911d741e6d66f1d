#include "kernels/cuda/device_layer.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace qlinear::gpu {

absl::Status DeviceLayer::upload(const LayerWeights& weights) {
  const LayerConfig& c = weights.config;
  RETURN_IF_ERROR(w.allocate(static_cast<size_t>(c.n * c.k),
                             absl::StrCat("the layer's weights [", c.n, ", ", c.k, "] int8")));
  RETURN_IF_CUDA_ERROR(cudaMemcpy(w.get(), weights.w.data(), w.size(), cudaMemcpyHostToDevice));
  RETURN_IF_ERROR(sb.allocate(static_cast<size_t>(c.n) * 4, "the weight scales"));
  RETURN_IF_CUDA_ERROR(cudaMemcpy(sb.get(), weights.sb.data(), sb.size(), cudaMemcpyHostToDevice));
  if (c.has_bias) {
    RETURN_IF_ERROR(bias.allocate(static_cast<size_t>(c.n) * 4, "the bias"));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpy(bias.get(), weights.bias.data(), bias.size(), cudaMemcpyHostToDevice));
  }
  if (is_asymmetric(c.scheme)) {
    RETURN_IF_ERROR(azp_adj.allocate(static_cast<size_t>(c.n) * 4, "the zero-point adjustment"));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpy(azp_adj.get(), weights.azp_adj.data(), azp_adj.size(), cudaMemcpyHostToDevice));
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}

}  // namespace qlinear::gpu
