// Releases shared objects on a thread of its own. A request that drops the last reference to a
// replaced or unloaded layer would otherwise free it on the request's thread, before its answer
// goes out: the layer's queue worker joined, its weights and every kernel's copies freed (GPU
// memory among them, whose release can wait for the whole device).
//
// Thread safety: release() may be called from any number of threads.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace qlinear {

class DeferredRelease {
 public:
  DeferredRelease();
  ~DeferredRelease();  // releases what it still holds, then joins its thread
  DeferredRelease(const DeferredRelease&) = delete;
  DeferredRelease& operator=(const DeferredRelease&) = delete;

  // Drops `p` on the release thread (on the caller's, where that cannot be arranged).
  void release(std::shared_ptr<const void> p);

 private:
  void run();

  absl::Mutex mu_;
  std::vector<std::shared_ptr<const void>> items_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace qlinear
