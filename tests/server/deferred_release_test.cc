// DeferredRelease (server/core/deferred_release.h): what it is given is dropped on its own thread,
// never on the caller's, and nothing is left when it is destroyed.
#include "server/core/deferred_release.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace qlinear {
namespace {

TEST(DeferredRelease, DropsOnItsOwnThread) {
  DeferredRelease d;
  absl::Notification dropped;
  std::thread::id where;
  auto p = std::shared_ptr<const int>(new int(7), [&](const int* v) {
    where = std::this_thread::get_id();
    delete v;
    dropped.Notify();
  });
  std::weak_ptr<const int> seen = p;
  d.release(std::move(p));
  ASSERT_TRUE(dropped.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_NE(where, std::this_thread::get_id());
  EXPECT_TRUE(seen.expired());
}

TEST(DeferredRelease, NothingIsLeftAfterItIsDestroyed) {
  std::atomic<int> dropped{0};
  {
    DeferredRelease d;
    std::vector<std::thread> callers;
    for (int t = 0; t < 4; ++t) {
      callers.emplace_back([&] {
        for (int i = 0; i < 250; ++i) {
          d.release(std::shared_ptr<const int>(new int(i), [&](const int* v) {
            delete v;
            dropped.fetch_add(1);
          }));
        }
      });
    }
    for (auto& c : callers) c.join();
  }
  EXPECT_EQ(dropped.load(), 1000);
}

}  // namespace
}  // namespace qlinear
