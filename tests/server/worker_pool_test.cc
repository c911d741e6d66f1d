// WorkerPool (server/worker_pool.h): threads start as work needs them, never more than the limit,
// work beyond them waits for a free one, and the pool's end runs what is still queued.
#include "server/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

namespace qlinear {
namespace {

// A gate that tasks wait at until it opens.
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // True once `n` tasks wait at the gate (within 5 s).
  bool waiting(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return waiting_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  bool open_ = false;
};

TEST(WorkerPoolTest, StartsThreadsAsWorkNeedsThemUpToItsLimit) {
  WorkerPool pool(3);
  EXPECT_EQ(pool.threads(), 0);
  Gate gate;
  std::atomic<int> done{0};
  std::mutex ids_mu;
  std::set<std::thread::id> ids;
  auto task = [&] {
    {
      std::lock_guard<std::mutex> lock(ids_mu);
      ids.insert(std::this_thread::get_id());
    }
    gate.wait();
    ++done;
  };
  pool.run(task);
  pool.run(task);
  ASSERT_TRUE(gate.waiting(2));
  EXPECT_EQ(pool.threads(), 2);
  // Five more: one starts the last thread, the other four wait for a free one.
  for (int i = 0; i < 5; ++i) pool.run(task);
  ASSERT_TRUE(gate.waiting(3));
  EXPECT_EQ(pool.threads(), 3);
  EXPECT_EQ(done.load(), 0);
  gate.open();
  for (int i = 0; i < 500 && done.load() < 7; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(done.load(), 7);
  EXPECT_EQ(pool.threads(), 3);
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 0u) << "a task ran on the caller's thread";
}

TEST(WorkerPoolTest, ItsEndRunsTheWorkStillQueued) {
  std::atomic<int> done{0};
  Gate gate;
  {
    WorkerPool pool(1);
    pool.run([&] {
      gate.wait();
      ++done;
    });
    ASSERT_TRUE(gate.waiting(1));
    for (int i = 0; i < 4; ++i) pool.run([&] { ++done; });
    gate.open();
  }
  EXPECT_EQ(done.load(), 5);
}

}  // namespace
}  // namespace qlinear
