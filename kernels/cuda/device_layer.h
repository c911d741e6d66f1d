// A layer's weights and per-channel vectors in device memory, as every CUDA kernel reads them
// (native [N, K] int8 weights, sb, bias and azp_adj as LayerWeights holds them), and the one copy
// that the CUDA kernels prepared for the same layer share.
//
// Host compiler only (Abseil).
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/core/layer.h"
#include "kernels/cuda/cuda_context.h"

namespace qlinear::gpu {

struct DeviceLayer {
  DeviceBuffer w;        // [N, K] int8
  DeviceBuffer sb;       // [N] fp32
  DeviceBuffer bias;     // [N] fp32, when the layer has a bias
  DeviceBuffer azp_adj;  // [N] int32, asymmetric schemes

  // Allocates and copies; returns once the copies have landed (the requests' non-blocking
  // streams do not wait for the legacy stream the copies ran on).
  absl::Status upload(const LayerWeights& weights);

  size_t bytes() const { return w.size() + sb.size() + bias.size() + azp_adj.size(); }
};

// The device copy of `weights`, shared by every CUDA kernel prepared for them: the first call
// uploads it, later calls for the same LayerWeights (while some holder is alive) return the same
// copy, so a layer costs its weights once in device memory however many kernels serve it. The
// copy is freed with its last holder. *first is set to whether this call uploaded it (the
// holder that reports the bytes). Thread-safe.
//
// Keyed by the LayerWeights' address: every holder is a prepared kernel, which the kernel
// interface guarantees does not outlive its weights, so an address reused by new weights never
// finds a live copy of old ones.
absl::StatusOr<std::shared_ptr<const DeviceLayer>> shared_device_layer(const LayerWeights& weights,
                                                                       bool* first);

}  // namespace qlinear::gpu
