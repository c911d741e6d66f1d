// The CPU kernels' thread pool (kernels/cpu/thread_pool.h): every task runs exactly once, with
// concurrent callers, nested calls and pools of any size.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/thread_limit.h"

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

// A host at its limit of threads: the pool starts the workers it can (none here) and still runs
// every task, on the caller.
TEST(ThreadPool, AHostOutOfThreadsGetsANarrowerPool) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto without_threads = [] {
    if (const std::string why = testing::forbid_new_threads(); !why.empty()) {
      std::fprintf(stderr, "%s\n", why.c_str());
      _exit(2);
    }
    ThreadPool pool(4);
    if (pool.threads() != 1 || pool.threads_asked() != 4) {
      std::fprintf(stderr, "the pool has %d threads of %d\n", pool.threads(), pool.threads_asked());
      _exit(1);
    }
    std::vector<int> hits(100, 0);
    pool.parallel_for(100, [&](int64_t t) { ++hits[t]; });
    if (std::count(hits.begin(), hits.end(), 1) != 100) {
      std::fprintf(stderr, "not every task ran once\n");
      _exit(1);
    }
    std::fprintf(stderr, "the pool ran every task on its caller\n");
    _exit(0);
  };
  EXPECT_EXIT(without_threads(), ::testing::ExitedWithCode(0),
              "the pool ran every task on its caller");
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

// After a call the workers poll for the next one, then sleep: wait_until_asleep returns once all
// of them sleep, and a pool without workers never waits.
TEST(ThreadPool, WaitUntilAsleepReturnsWhenEveryWorkerSleeps) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int iter = 0; iter < 3; ++iter) {
      expect_each_task_once(pool, 64);
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(pool.wait_until_asleep(std::chrono::seconds(5))) << threads << " threads";
      EXPECT_EQ(pool.asleep(), threads - 1) << threads << " threads";
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    }
    // Still asleep: it returns at once.
    EXPECT_TRUE(pool.wait_until_asleep(std::chrono::microseconds(0)));
    expect_each_task_once(pool, 64);  // and they wake for the next call
  }
}

TEST(ThreadPool, GlobalPoolUsesTheCpusOfThisProcess) {
  EXPECT_GE(ThreadPool::global().threads(), 1);
  expect_each_task_once(ThreadPool::global(), 33);
}

// The pool's width follows a cgroup's CPU quota, rounded up, under the affinity mask's count.
TEST(UsableCpus, FollowsTheCgroupCpuQuota) {
  const std::string root = ::testing::TempDir() + "/usable_cpus." + std::to_string(getpid());
  const std::string cg = root + "/sys/fs/cgroup";
  std::filesystem::create_directories(cg + "/cpu");
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  };
  const int all = usable_cpus(root + "/none");
  ASSERT_GE(all, 1);
  // cgroup v1 only.
  write(cg + "/cpu/cpu.cfs_quota_us", "-1\n");
  write(cg + "/cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(usable_cpus(root), all) << "no quota";
  write(cg + "/cpu/cpu.cfs_quota_us", "50000\n");
  EXPECT_EQ(usable_cpus(root), 1) << "half a CPU";
  // cgroup v2 wins where both are present.
  write(cg + "/cpu.max", "max 100000\n");
  EXPECT_EQ(usable_cpus(root), all) << "no quota";
  write(cg + "/cpu.max", "150000 100000\n");
  EXPECT_EQ(usable_cpus(root), std::min(all, 2)) << "1.5 CPUs";
  write(cg + "/cpu.max", "100000000 100000\n");
  EXPECT_EQ(usable_cpus(root), all) << "a quota past the CPUs there are";
  write(cg + "/cpu.max", "garbage 100000\n");
  EXPECT_EQ(usable_cpus(root), all);
  // A systemd service with CPUQuota=150%, seeing the whole tree: its own cgroup's quota.
  std::filesystem::create_directories(root + "/proc/self");
  std::filesystem::create_directories(cg + "/system.slice/q.service");
  write(root + "/proc/self/cgroup", "0::/system.slice/q.service\n");
  write(cg + "/system.slice/q.service/cpu.max", "150000 100000\n");
  EXPECT_EQ(usable_cpus(root), std::min(all, 2)) << "the service's 1.5 CPUs";
  write(cg + "/system.slice/cpu.max", "50000 100000\n");
  EXPECT_EQ(usable_cpus(root), 1) << "its slice's half CPU";
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace qlinear::cpu
