// DeferredRelease (server/core/deferred_release.h): what it is given is dropped on its own thread,
// never on the caller's, and nothing is left when it is destroyed; what own() makes goes there by
// itself, but inside a ReleaseHere, on the release thread and once it is gone.
#include "server/core/deferred_release.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
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

// Records the thread that destroys it.
struct Probe {
  explicit Probe(absl::Notification* done, std::thread::id* where) : done(done), where(where) {}
  ~Probe() {
    *where = std::this_thread::get_id();
    done->Notify();
  }
  absl::Notification* done;
  std::thread::id* where;
};

TEST(DeferredRelease, AnOwnedObjectIsDestroyedOnTheReleaseThreadWhoeverDropsIt) {
  auto d = std::make_shared<DeferredRelease>();
  for (bool other_thread : {false, true}) {
    absl::Notification done;
    std::thread::id where;
    std::shared_ptr<Probe> p = DeferredRelease::own(std::make_unique<Probe>(&done, &where), d);
    std::shared_ptr<Probe> second = p;
    std::thread::id dropper = std::this_thread::get_id();
    p.reset();
    EXPECT_FALSE(done.HasBeenNotified());  // (not the last reference)
    if (other_thread) {
      std::thread([&] {
        dropper = std::this_thread::get_id();
        second.reset();
      }).join();
    } else {
      second.reset();
    }
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_NE(where, dropper) << "other thread: " << other_thread;
    EXPECT_NE(where, std::this_thread::get_id());
  }
}

TEST(DeferredRelease, AnOwnedObjectIsDestroyedHereInsideAReleaseHere) {
  auto d = std::make_shared<DeferredRelease>();
  absl::Notification done;
  std::thread::id where;
  std::shared_ptr<Probe> p = DeferredRelease::own(std::make_unique<Probe>(&done, &where), d);
  {
    DeferredRelease::ReleaseHere here;
    p.reset();
  }
  ASSERT_TRUE(done.HasBeenNotified());
  EXPECT_EQ(where, std::this_thread::get_id());
  // Outside it, away again.
  absl::Notification done2;
  std::shared_ptr<Probe> q = DeferredRelease::own(std::make_unique<Probe>(&done2, &where), d);
  q.reset();
  ASSERT_TRUE(done2.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_NE(where, std::this_thread::get_id());
}

TEST(DeferredRelease, AnOwnedObjectOutlivingItsReleaseThreadIsDestroyedByItsLastHolder) {
  auto d = std::make_shared<DeferredRelease>();
  absl::Notification done;
  std::thread::id where;
  std::shared_ptr<Probe> p = DeferredRelease::own(std::make_unique<Probe>(&done, &where), d);
  d.reset();
  p.reset();
  ASSERT_TRUE(done.HasBeenNotified());
  EXPECT_EQ(where, std::this_thread::get_id());
}

// Handed to the release thread as it is, an owned object is destroyed there, not sent back to
// itself; and one whose release thread loses its last other reference meanwhile is destroyed
// all the same (the release thread's end must not wait for itself).
TEST(DeferredRelease, AnOwnedObjectDroppedOnTheReleaseThreadIsDestroyedThere) {
  for (int round = 0; round < 50; ++round) {
    auto d = std::make_shared<DeferredRelease>();
    absl::Notification done;
    std::thread::id where;
    std::shared_ptr<Probe> p = DeferredRelease::own(std::make_unique<Probe>(&done, &where), d);
    d->release(std::move(p));
    if (round % 2 == 1) d.reset();  // (joins the release thread, which drops p first)
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10))) << round;
    EXPECT_NE(where, std::this_thread::get_id()) << round;
  }
}

// An owned object whose destructor, running on the release thread, drops the last reference to
// another: that one is destroyed there and then (the release thread destroys what it drops), not
// queued behind the first, where it would wait on a release thread that may be ending.
struct Outer {
  std::shared_ptr<Probe> inner;
  absl::Notification* inner_done = nullptr;
  bool* inner_destroyed_first = nullptr;
  absl::Notification* done = nullptr;
  std::thread::id* where = nullptr;
  ~Outer() {
    inner.reset();
    *inner_destroyed_first = inner_done->HasBeenNotified();
    *where = std::this_thread::get_id();
    done->Notify();
  }
};

TEST(DeferredRelease, WhatTheReleaseThreadDropsIsDestroyedThere) {
  auto d = std::make_shared<DeferredRelease>();
  absl::Notification inner_done, outer_done;
  std::thread::id inner_where, outer_where;
  bool inner_destroyed_first = false;
  auto o = std::make_unique<Outer>();
  o->inner = DeferredRelease::own(std::make_unique<Probe>(&inner_done, &inner_where), d);
  o->inner_done = &inner_done;
  o->inner_destroyed_first = &inner_destroyed_first;
  o->done = &outer_done;
  o->where = &outer_where;
  std::shared_ptr<Outer> outer = DeferredRelease::own(std::move(o), d);
  outer.reset();
  ASSERT_TRUE(outer_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(inner_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(inner_destroyed_first) << "the inner object was queued, not destroyed at once";
  EXPECT_EQ(inner_where, outer_where);
  EXPECT_NE(outer_where, std::this_thread::get_id());
}

}  // namespace
}  // namespace qlinear
