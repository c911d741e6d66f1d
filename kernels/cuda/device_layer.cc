#include "kernels/cuda/device_layer.h"

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

absl::StatusOr<std::shared_ptr<const DeviceLayer>> shared_device_layer(const LayerWeights& weights,
                                                                       bool* first) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* copies ABSL_GUARDED_BY(mu) =
      new absl::flat_hash_map<const LayerWeights*, std::weak_ptr<const DeviceLayer>>();
  // Held across the upload: two kernels of one layer prepared at once must not upload twice.
  absl::MutexLock lock(&mu);
  if (auto it = copies->find(&weights); it != copies->end()) {
    if (std::shared_ptr<const DeviceLayer> live = it->second.lock()) {
      *first = false;
      return live;
    }
  }
  absl::erase_if(*copies, [](const auto& kv) { return kv.second.expired(); });
  auto dev = std::make_shared<DeviceLayer>();
  RETURN_IF_ERROR(dev->upload(weights));
  (*copies)[&weights] = dev;
  *first = true;
  return std::shared_ptr<const DeviceLayer>(std::move(dev));
}

}  // namespace qlinear::gpu
