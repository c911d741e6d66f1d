#include "server/core/demo_layer.h"

#include "common/random.h"

namespace qlinear {

LoadRequest make_demo_layer_request(const std::string& name, int64_t n, int64_t k, uint64_t seed,
                                    std::vector<int8_t>* weights) {
  SplitMix64 rng(seed);
  *weights = random_int8(rng, static_cast<size_t>(n * k));
  LoadRequest r;
  r.name = name;
  r.spec.n = n;
  r.spec.k = k;
  r.spec.scheme = Scheme::kDynamicSymmetric;
  r.spec.weight_scale = random_floats(rng, static_cast<size_t>(n), 0.5e-3f, 2e-3f);
  r.spec.weight_scale_shape = {n};
  r.spec.bias = random_floats(rng, static_cast<size_t>(n), -1.f, 1.f);
  return r;
}

}  // namespace qlinear
