// Periodic (server/core/periodic.h): its function runs every period on a thread of its own, one
// call at a time, and not at all once it is destroyed; a host that cannot start the thread gets
// RESOURCE_EXHAUSTED, not an exception.
#include "server/core/periodic.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "tests/thread_limit.h"

namespace qlinear {
namespace {

TEST(Periodic, RunsEveryPeriodOffTheCallersThread) {
  std::atomic<int> calls{0}, in_call{0}, overlapped{0};
  std::atomic<bool> on_caller{false};
  const std::thread::id caller = std::this_thread::get_id();
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<int64_t> first_us{-1};
  auto p = Periodic::start(absl::Milliseconds(20), [&] {
    if (in_call.fetch_add(1) != 0) overlapped.fetch_add(1);
    if (std::this_thread::get_id() == caller) on_caller = true;
    int64_t none = -1;
    first_us.compare_exchange_strong(none, std::chrono::duration_cast<std::chrono::microseconds>(
                                               std::chrono::steady_clock::now() - t0)
                                               .count());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    calls.fetch_add(1);
    in_call.fetch_sub(1);
  });
  ASSERT_TRUE(p.ok()) << p.status();
  for (int i = 0; i < 500 && calls.load() < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(calls.load(), 5);
  EXPECT_GE(first_us.load(), 19000) << "the first call came before one period";
  EXPECT_FALSE(on_caller.load());
  EXPECT_EQ(overlapped.load(), 0);
  p->reset();
  const int after = calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(calls.load(), after) << "a call came after the destructor returned";
}

TEST(Periodic, StopsWithoutWaitingForTheNextPeriod) {
  std::atomic<int> calls{0};
  auto p = Periodic::start(absl::Hours(1), [&] { calls.fetch_add(1); });
  ASSERT_TRUE(p.ok()) << p.status();
  const auto t0 = std::chrono::steady_clock::now();
  p->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(calls.load(), 0);
}

TEST(Periodic, APeriodThatIsNotPositiveIsInvalid) {
  for (absl::Duration d : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    auto p = Periodic::start(d, [] {});
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  }
}

TEST(PeriodicDeathTest, AThreadThatCannotStartIsResourceExhausted) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto without_threads = [] {
    if (const std::string why = testing::forbid_new_threads(); !why.empty()) {
      std::fprintf(stderr, "%s\n", why.c_str());
      _exit(2);
    }
    auto p = Periodic::start(absl::Seconds(1), [] {});
    if (p.ok() || p.status().code() != absl::StatusCode::kResourceExhausted ||
        !absl::StrContains(p.status().message(), "housekeeping thread could not be started")) {
      std::fprintf(stderr, "got %s\n", p.status().ToString().c_str());
      _exit(1);
    }
    std::fprintf(stderr, "refused: %s\n", std::string(p.status().message()).c_str());
    _exit(0);
  };
  EXPECT_EXIT(without_threads(), ::testing::ExitedWithCode(0), "refused: the housekeeping");
}

}  // namespace
}  // namespace qlinear
