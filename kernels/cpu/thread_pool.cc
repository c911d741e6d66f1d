#include "kernels/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <new>
#include <sstream>
#include <system_error>

#include "kernels/core/cgroup.h"

namespace qlinear::cpu {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long an idle worker polls for the next job before it sleeps. A worker that slept costs the
// next call a futex wake-up, and the call runs on fewer threads until the worker is back (25-60 us
// on a 2-core VM). So the poll bridges back-to-back calls (a decode step's layers follow each other
// within microseconds) and also the gap between the requests of one client of the server, about
// 100 us over loopback there (its round trip outside the kernel), a LAN round trip too; past that
// the pool gives the cores back. The poll yields the core (see worker_loop), so a thread with work
// is never kept waiting by it.
constexpr auto kSpin = std::chrono::microseconds(500);

int affinity_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

// A cgroup's CPU quota in whole CPUs (rounded up), or 0 without one: `quota` and `period` in the
// same unit, a quota of "max" or below 0 being none.
int quota_cpus(const std::string& quota, const std::string& period) {
  int64_t q = 0, p = 0;
  std::istringstream qs(quota), ps(period);
  if (!(qs >> q) || !(ps >> p) || q <= 0 || p <= 0) return 0;
  const int64_t cpus = (q + p - 1) / p;
  return cpus > 1 << 20 ? 0 : static_cast<int>(cpus);
}

// The smallest CPU quota set on the process's cgroup or an ancestor, or 0 without one.
int cgroup_cpus(const std::string& root) {
  int cpus = 0;
  auto take = [&cpus](int quota) {
    if (quota > 0) cpus = cpus == 0 ? quota : std::min(cpus, quota);
  };
  bool v2 = false;
  for (const std::string& d : cgroup_v2_dirs(root)) {
    std::ifstream in(d + "/cpu.max");
    std::string quota, period;
    if (in >> quota >> period) {
      v2 = true;
      take(quota_cpus(quota, period));
    }
  }
  // cgroup v1 only where there is no v2 cpu controller: its cpu controller, mounted as "cpu" or
  // "cpu,cpuacct".
  if (v2) return cpus;
  for (const char* mount : {"cpu", "cpu,cpuacct"}) {
    for (const std::string& d : cgroup_v1_dirs("cpu", root, mount)) {
      std::ifstream q(d + "/cpu.cfs_quota_us"), p(d + "/cpu.cfs_period_us");
      std::string quota, period;
      if (q >> quota && p >> period) take(quota_cpus(quota, period));
    }
    if (cpus > 0) return cpus;
  }
  return cpus;
}

}  // namespace

int usable_cpus(const std::string& root) {
  const int cpus = affinity_cpus();
  const int quota = cgroup_cpus(root);
  return quota > 0 ? std::min(cpus, quota) : cpus;
}

ThreadPool::ThreadPool(int threads) : asked_(std::max(threads, 1)) {
  // Workers start from generation 0, whenever their threads get to run: one that starts late
  // still sees every job (or the stop) published after this constructor.
  // A host at its limit of threads gets a narrower pool (the caller alone, at worst) rather than
  // an exception from a request's first use of the pool.
  workers_.reserve(std::max(threads - 1, 0));
  for (int i = 1; i < threads; ++i) {
    try {
      workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::system_error&) {
      break;
    } catch (const std::bad_alloc&) {  // (the thread's state is allocated too)
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool* pool = new ThreadPool(usable_cpus());  // never destroyed: workers may be
  return *pool;                                             // mid-spin at exit
}

void ThreadPool::run_tasks(Job* job) {
  for (;;) {
    const int64_t t = job->next.fetch_add(1);
    if (t >= job->tasks) return;
    job->fn(t);
    job->done.fetch_add(1);
  }
}

void ThreadPool::parallel_for(int64_t tasks, absl::FunctionRef<void(int64_t)> fn) {
  if (tasks <= 0) return;
  if (tasks == 1 || workers_.empty() || busy_.exchange(true)) {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  Job job{fn, tasks};
  job_.store(&job);
  generation_.fetch_add(1);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  run_tasks(&job);
  while (job.done.load() < tasks) cpu_relax();
  // Retract the job, then wait for every worker that may have picked up its pointer to let go:
  // a worker increments in_job_ before it reads job_, so once in_job_ is zero after the
  // retraction, no worker can reach this stack frame any more.
  job_.store(nullptr);
  while (in_job_.load() != 0) cpu_relax();
  busy_.store(false);
}

bool ThreadPool::wait_until_asleep(std::chrono::microseconds max) {
  const auto deadline = std::chrono::steady_clock::now() + max;
  const int workers = static_cast<int>(workers_.size());
  while (sleepers_.load() < workers) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return true;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Wait for a new generation: poll for a while, then sleep. The poll yields rather than
    // pauses: on a machine with few cores, the gRPC thread that sends the response or the client
    // that reads it would otherwise wait for the poll to end (measured: 40-50 us per request of
    // one unary client on a 2-core VM). With nothing else runnable, yield returns at once.
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    while (generation_.load() == seen) {
      std::this_thread::yield();
      if (std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(lock, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        break;
      }
    }
    seen = generation_.load();
    if (stop_.load()) return;
    in_job_.fetch_add(1);
    if (Job* job = job_.load(); job != nullptr) run_tasks(job);
    in_job_.fetch_sub(1);
  }
}

}  // namespace qlinear::cpu
