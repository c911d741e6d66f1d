// Ends uploads whose client stopped sending: an upload holds its N*K weight buffer and a server
// thread from its header to its last chunk, so a client that sends a header and then nothing
// would hold both for as long as its connection lives. The watchdog cancels (ServerContext::
// TryCancel) every upload that has not been touched for the idle limit (its handler touches it
// for each chunk that carries bytes); its handler then returns CANCELLED and the buffer is freed.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"

namespace qlinear {

class UploadWatchdog {
 public:
  // `idle_limit` zero or less: off (no thread; watches never time out).
  explicit UploadWatchdog(absl::Duration idle_limit);
  ~UploadWatchdog();
  UploadWatchdog(const UploadWatchdog&) = delete;
  UploadWatchdog& operator=(const UploadWatchdog&) = delete;

  absl::Duration idle_limit() const { return idle_limit_; }

  struct Entry {
    grpc::ServerContext* ctx;
    std::atomic<int64_t> last_ns;
    bool timed_out = false;  // guarded by the watchdog's mutex
  };

  // One upload watched from its creation until finish() or its destruction (which must come
  // before the handler returns: the context is the handler's).
  class Watch {
   public:
    ~Watch() { finish(); }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // A message arrived.
    void touch();
    // Ends the watch and says whether the watchdog cancelled the upload, in one step under the
    // watchdog's lock: after it no cancellation can come, so the handler knows whether it must
    // return CANCELLED (ServerContext::TryCancel's contract). Later calls return the same.
    bool finish();

   private:
    friend class UploadWatchdog;
    Watch(UploadWatchdog* dog, std::list<Entry>::iterator it) : dog_(dog), it_(it) {}
    UploadWatchdog* dog_;
    std::list<Entry>::iterator it_;
    bool finished_ = false;
    bool timed_out_ = false;
  };
  std::unique_ptr<Watch> watch(grpc::ServerContext* ctx);

 private:
  void run();

  const absl::Duration idle_limit_;
  mutable absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace qlinear
