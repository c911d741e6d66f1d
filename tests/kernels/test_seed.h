// The run's seed for the kernel tests that draw random data: QLINEAR_TEST_SEED when set (to replay
// a failure), otherwise fresh from std::random_device, so that every run draws new data. A test
// puts seed_trace() in a SCOPED_TRACE so that a failure prints it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace qlinear::testing {

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("QLINEAR_TEST_SEED"); s != nullptr && *s != '\0') {
      return static_cast<uint64_t>(std::strtoull(s, nullptr, 0));
    }
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  // Printed as it is first drawn, so that a run that crashes (where no assertion prints its
  // trace) can be replayed too.
  static const bool printed = [] {
    std::fprintf(stderr, "QLINEAR_TEST_SEED=%llu replays this run's random data\n",
                 static_cast<unsigned long long>(seed));
    return true;
  }();
  (void)printed;
  return seed;
}

inline std::string seed_trace() {
  return "QLINEAR_TEST_SEED=" + std::to_string(test_seed()) + " replays this run";
}

}  // namespace qlinear::testing
