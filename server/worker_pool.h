// A pool of threads for work that must not run on gRPC's own threads: the messages of the
// callback-API InferStream, whose reactions gRPC runs on its polling threads (a blocking
// inference there would stall every call's I/O). Threads start as work needs them, up to
// `max_threads`, and stay for the pool's life; work beyond them waits in order for the first free
// thread. The service bounds the work in flight by its call slots, so with max_threads at least
// the slots nothing waits.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qlinear {

class WorkerPool {
 public:
  explicit WorkerPool(int max_threads);
  // Runs the work still queued, then joins every thread.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs `task` on one of the pool's threads. Where no thread can be started (the process's limit
  // of threads) and the pool has none, it runs on the caller's, so that work is never lost.
  void run(std::function<void()> task);

  // The threads started so far (for tests and the start-up log).
  int threads() const;

 private:
  void work();

  const int max_threads_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  int idle_ = 0;  // threads waiting for work
  bool stopping_ = false;
};

}  // namespace qlinear
