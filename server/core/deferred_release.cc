#include "server/core/deferred_release.h"

#include <new>
#include <utility>

namespace qlinear {

thread_local int DeferredRelease::depth_ = 0;

DeferredRelease::DeferredRelease() : thread_([this] { run(); }) {}

DeferredRelease::~DeferredRelease() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void DeferredRelease::release(std::shared_ptr<const void> p) {
  absl::MutexLock lock(&mu_);
  if (stop_) return;  // (p is dropped here, on the caller's thread)
  try {
    items_.push_back(std::move(p));
  } catch (const std::bad_alloc&) {
    // Dropped on the caller's thread after all.
  }
}

void DeferredRelease::release_owned(const void* p, void (*destroy)(const void*)) {
  std::shared_ptr<const void> owned;
  try {
    owned = std::shared_ptr<const void>(p, destroy);
  } catch (const std::bad_alloc&) {
    return;  // (shared_ptr's constructor destroyed p with `destroy`, on this thread)
  }
  release(std::move(owned));
}

void DeferredRelease::run() {
  ReleaseHere here;  // an object dropped here whose own drops would come back is destroyed here
  for (;;) {
    std::vector<std::shared_ptr<const void>> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DeferredRelease* d)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) { return d->stop_ || !d->items_.empty(); },
          this));
      if (items_.empty()) return;  // stopped, nothing left
      batch.swap(items_);
    }
    batch.clear();  // outside the lock: a layer's release may take milliseconds
  }
}

}  // namespace qlinear
