// Runs a function every period on a thread of its own, until destroyed: the server's
// housekeeping (the GPU staging's trim and gauges), off every request's path.
//
// Thread safety: construct and destroy from one thread; the function runs on the periodic thread
// only, never two calls at once.
#pragma once

#include <functional>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace qlinear {

class Periodic {
 public:
  // Starts the thread, whose first call of `fn` comes one `period` from now. RESOURCE_EXHAUSTED
  // where the host cannot start a thread. `period` must be positive.
  static absl::StatusOr<std::unique_ptr<Periodic>> start(absl::Duration period,
                                                         std::function<void()> fn);
  ~Periodic();  // a call in progress finishes; no call starts after
  Periodic(const Periodic&) = delete;
  Periodic& operator=(const Periodic&) = delete;

 private:
  Periodic(absl::Duration period, std::function<void()> fn) : period_(period), fn_(std::move(fn)) {}
  void run();

  const absl::Duration period_;
  const std::function<void()> fn_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace qlinear
