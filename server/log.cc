#include "server/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace qlinear {

namespace {
std::atomic<bool> g_logging{true};
}  // namespace

void set_logging(bool enabled) { g_logging.store(enabled); }

void log_info(absl::string_view message) {
  if (!g_logging.load(std::memory_order_relaxed)) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
  // One fprintf per record keeps lines from different threads whole.
  std::fprintf(stderr, "%s.%03dZ qlinear-server: %.*s\n", stamp, ms,
               static_cast<int>(message.size()), message.data());
}

}  // namespace qlinear
