// A persistent pool of worker threads for the CPU kernels: every core works on one call, with no
// thread created per call.
//
// The calling thread takes part in the work, so a pool of T threads has T - 1 workers. Workers
// poll for the next call for a while (back-to-back calls, as in decode loops, and the requests of
// a server's client then start without a wake-up), yielding the core to any thread that has work,
// and then sleep on a condition variable, so an idle server costs no CPU.
//
// Thread safety: parallel_for may be called from any number of threads at once. One call at a
// time gets the workers; a call that finds them busy (another request, or a nested call from
// inside a task) runs all of its tasks on its own thread. Either way every task runs exactly once
// and parallel_for returns after the last one finished.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace qlinear::cpu {

// The CPUs this process may use: its affinity mask, and inside a cgroup with a CPU quota (a
// container or a Kubernetes pod with a CPU limit) no more than the quota rounded up, at least 1.
// cgroup v2 (cpu.max) and v1 (cpu/cpu.cfs_quota_us over cpu.cfs_period_us) are read, in the
// process's own cgroup and each of its ancestors (kernels/core/cgroup.h: a systemd service's
// CPUQuota= is found too), the smallest quota applying; `root` prefixes their paths (tests give a
// directory laid out as /proc and /sys/fs/cgroup are). A pool wider than the quota would spend it
// on its workers' polling and be throttled.
int usable_cpus(const std::string& root = "");

class ThreadPool {
 public:
  // `threads` counts the caller: threads = 2 starts one worker. threads <= 1 runs inline. On a
  // host at its limit of threads the pool starts what workers it can (threads() tells).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // The threads it was asked for (at least 1): more than threads() where the host's limit of
  // threads stopped some of them.
  int threads_asked() const { return asked_; }

  // Runs fn(task) for every task in [0, tasks). Tasks are claimed in increasing order, one at a
  // time, by whichever thread is free: make tasks contiguous ranges of work, a few per thread.
  void parallel_for(int64_t tasks, absl::FunctionRef<void(int64_t task)> fn);

  // Waits until every worker sleeps, none polling for the next call, or until `max` has passed;
  // returns whether they all sleep. After a call the workers poll for a while (see kSpin in
  // thread_pool.cc), yielding their cores; autotune waits for this before it times a kernel that
  // runs on threads of its own (oneDNN's OpenMP team), so that no poller competes with them for
  // the cores. Calls running meanwhile from other threads may keep the workers busy past `max`.
  bool wait_until_asleep(std::chrono::microseconds max);

  // Workers asleep on the condition variable now (a snapshot).
  int asleep() const { return sleepers_.load(); }

  // The process-wide pool, sized to usable_cpus().
  static ThreadPool& global();

 private:
  struct Job {
    absl::FunctionRef<void(int64_t)> fn;
    int64_t tasks;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };

  static void run_tasks(Job* job);
  void worker_loop();

  int asked_ = 1;
  std::vector<std::thread> workers_;
  std::atomic<bool> busy_{false};        // one call holds the workers
  std::atomic<Job*> job_{nullptr};       // the job on offer, or null
  std::atomic<int> in_job_{0};           // workers that may be touching *job_
  std::atomic<uint64_t> generation_{0};  // bumped once per job
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace qlinear::cpu
