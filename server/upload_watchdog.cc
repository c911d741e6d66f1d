#include "server/upload_watchdog.h"

#include <algorithm>

#include "common/steady_clock.h"

namespace qlinear {

UploadWatchdog::UploadWatchdog(absl::Duration idle_limit) : idle_limit_(idle_limit) {
  if (idle_limit_ > absl::ZeroDuration()) thread_ = std::thread([this] { run(); });
}

UploadWatchdog::~UploadWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<UploadWatchdog::Watch> UploadWatchdog::watch(grpc::ServerContext* ctx) {
  absl::MutexLock lock(&mu_);
  entries_.emplace_back();
  auto it = std::prev(entries_.end());
  it->ctx = ctx;
  it->last_ns.store(steady_now_ns(), std::memory_order_relaxed);
  return std::unique_ptr<Watch>(new Watch(this, it));
}

bool UploadWatchdog::Watch::finish() {
  if (!finished_) {
    absl::MutexLock lock(&dog_->mu_);
    timed_out_ = it_->timed_out;
    dog_->entries_.erase(it_);
    finished_ = true;
  }
  return timed_out_;
}

void UploadWatchdog::Watch::touch() {
  if (!finished_) it_->last_ns.store(steady_now_ns(), std::memory_order_relaxed);
}

void UploadWatchdog::run() {
  const int64_t limit_ns = absl::ToInt64Nanoseconds(idle_limit_);
  // Checked a few times per limit, and at least once a second.
  const absl::Duration period = std::min(idle_limit_ / 4, absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), period);
    if (stop_) break;
    const int64_t now = steady_now_ns();
    for (Entry& e : entries_) {
      // Under the lock Watch::finish takes: the context outlives this call.
      if (!e.timed_out && now - e.last_ns.load(std::memory_order_relaxed) > limit_ns) {
        e.timed_out = true;
        e.ctx->TryCancel();
      }
    }
  }
}

}  // namespace qlinear
