// The demo layer a server creates at start-up (unless --no-demo-layer): deterministic from a
// fixed seed so that every server answers the same for the same input.
#pragma once

#include <cstdint>
#include <vector>

#include "server/core/engine.h"

namespace qlinear {

inline constexpr uint64_t kDemoSeed = 20240501;

// A dynamic-symmetric layer named `name` with int8 weights, per-channel scales around 1e-3 and
// a bias, all drawn from `seed`.
LoadRequest make_demo_layer_request(const std::string& name, int64_t n, int64_t k, uint64_t seed,
                                    std::vector<int8_t>* weights);

}  // namespace qlinear
