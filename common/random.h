// Deterministic, portable random data for demo layers, tests, the CLI and benchmarks.
// (std::*_distribution differ between standard libraries; these do not.)
#pragma once

#include <cstdint>
#include <vector>

namespace qlinear {

// SplitMix64: a small generator with good statistical quality for test data.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t state_;
};

inline std::vector<int8_t> random_int8(SplitMix64& rng, size_t count) {
  std::vector<int8_t> v(count);
  size_t i = 0;
  while (i < count) {
    uint64_t bits = rng.next();
    for (int b = 0; b < 8 && i < count; ++b, bits >>= 8) v[i++] = static_cast<int8_t>(bits & 0xff);
  }
  return v;
}

inline std::vector<float> random_floats(SplitMix64& rng, size_t count, float lo, float hi) {
  std::vector<float> v(count);
  for (float& f : v) f = rng.uniform(lo, hi);
  return v;
}

}  // namespace qlinear
