#include "server/worker_pool.h"

#include <algorithm>
#include <system_error>
#include <utility>

namespace qlinear {

WorkerPool::WorkerPool(int max_threads) : max_threads_(std::max(1, max_threads)) {}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::run(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mu_);
  queue_.push_back(std::move(task));
  // A waiting thread takes it, unless every thread is busy and the pool may grow.
  if (idle_ >= static_cast<int>(queue_.size()) ||
      static_cast<int>(threads_.size()) >= max_threads_) {
    lock.unlock();
    wake_.notify_one();
    return;
  }
  try {
    threads_.emplace_back([this] { work(); });
    return;
  } catch (const std::system_error&) {
    if (!threads_.empty()) {  // a thread of the pool takes it once free
      lock.unlock();
      wake_.notify_one();
      return;
    }
  }
  std::function<void()> mine = std::move(queue_.back());
  queue_.pop_back();
  lock.unlock();
  mine();
}

int WorkerPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(threads_.size());
}

void WorkerPool::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace qlinear
