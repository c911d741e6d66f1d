// The monotonic clock in nanoseconds, for timings and timeouts (never the wall clock).
#pragma once

#include <chrono>
#include <cstdint>

namespace qlinear {

inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace qlinear
