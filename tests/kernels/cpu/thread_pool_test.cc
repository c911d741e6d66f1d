// The CPU kernels' thread pool (kernels/cpu/thread_pool.h): every task runs exactly once, with
// concurrent callers, nested calls and pools of any size.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace qlinear::cpu {
namespace {

void expect_each_task_once(ThreadPool& pool, int64_t tasks) {
  std::vector<std::atomic<int>> hits(tasks);
  pool.parallel_for(tasks, [&](int64_t t) { hits[t].fetch_add(1); });
  for (int64_t t = 0; t < tasks; ++t) ASSERT_EQ(hits[t].load(), 1) << "task " << t;
}

TEST(ThreadPool, EveryTaskRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), std::max(threads, 1));
    for (int64_t tasks : {0, 1, 2, 7, 64, 1000}) expect_each_task_once(pool, tasks);
  }
}

TEST(ThreadPool, ConcurrentAndNestedCallers) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int iter = 0; iter < 200; ++iter) {
        pool.parallel_for(8, [&](int64_t) {
          pool.parallel_for(3, [&](int64_t) { total.fetch_add(1); });  // runs inline
        });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 200 * 8 * 3);
}

TEST(ThreadPool, WorkersThatSleptWakeUp) {
  ThreadPool pool(2);
  expect_each_task_once(pool, 16);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin window
  expect_each_task_once(pool, 16);
}

TEST(ThreadPool, GlobalPoolUsesTheCpusOfThisProcess) {
  EXPECT_GE(ThreadPool::global().threads(), 1);
  expect_each_task_once(ThreadPool::global(), 33);
}

}  // namespace
}  // namespace qlinear::cpu
