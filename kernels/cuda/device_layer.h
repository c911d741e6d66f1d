// A layer's weights and per-channel vectors in device memory, as the fused CUDA kernels keep them
// (native [N, K] int8 weights, sb, bias and azp_adj as LayerWeights holds them).
//
// Host compiler only (Abseil).
#pragma once

#include "absl/status/status.h"
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

}  // namespace qlinear::gpu
