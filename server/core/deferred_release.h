// Releases shared objects on a thread of its own. A request that drops the last reference to a
// replaced or unloaded layer would otherwise free it on the request's thread, before its answer
// goes out: the layer's queue worker joined, its weights and every kernel's copies freed (GPU
// memory among them, whose release can wait for the whole device).
//
// An object made by own() goes to the release thread by itself, whoever drops its last
// reference and whenever: no holder has to know it may be the last.
//
// Thread safety: release() and own()'s objects' drops may come from any number of threads.
#pragma once

#include <memory>
#include <thread>
#include <utility>
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

  // Shares `p` so that its last reference, dropped on whichever thread, destroys it on `to`'s
  // release thread; on the dropping thread instead where that is the release thread, inside a
  // ReleaseHere, or once `to` is gone.
  template <typename T>
  static std::shared_ptr<T> own(std::unique_ptr<T> p, std::weak_ptr<DeferredRelease> to) {
    return std::shared_ptr<T>(p.release(), Deleter<T>{std::move(to)});
  }

  // While one lives on a thread, own()'s objects whose last reference that thread drops are
  // destroyed there (an unload that frees its layer before it answers). Nests.
  class ReleaseHere {
   public:
    ReleaseHere() { ++depth_; }
    ~ReleaseHere() { --depth_; }
    ReleaseHere(const ReleaseHere&) = delete;
    ReleaseHere& operator=(const ReleaseHere&) = delete;
  };

 private:
  template <typename T>
  struct Deleter {
    std::weak_ptr<DeferredRelease> to;
    void operator()(T* p) const {
      if (depth_ == 0) {
        if (std::shared_ptr<DeferredRelease> d = to.lock()) {
          d->release_owned(p, [](const void* v) { delete static_cast<const T*>(v); });
          return;  // (d, were it the last reference, joins the thread, which destroys p)
        }
      }
      delete p;
    }
  };

  // Destroys `p` with `destroy` on the release thread (on the caller's, where it cannot).
  void release_owned(const void* p, void (*destroy)(const void*));
  void run();

  // Inside a ReleaseHere, or on a release thread (whose drops would come back to it).
  static thread_local int depth_;

  absl::Mutex mu_;
  std::vector<std::shared_ptr<const void>> items_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace qlinear
