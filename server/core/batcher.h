// Dynamic batching: one queue per served layer, one batch executing at a time. A request that
// finds the layer idle runs at once on its caller's thread; otherwise callers block in `run`
// while a worker thread coalesces compatible queued requests (same x dtype, output dtype and forced
// kernel) into one GEMM of up to `max_batch_rows` rows (and `max_batch_bytes` of x and y), then
// splits the result back. Per-token quantization makes every row independent, so a batched request
// gets exactly the bits it would get alone.
//
// Thread safety: `run` may be called from any number of threads. The queue is bounded: when it
// holds `max_queue_requests`, `run` fails at once with RESOURCE_EXHAUSTED. Expired or cancelled
// requests are answered before compute and never reach a kernel (nor reach it again after a batch
// that failed); a queued one leaves the queue at its deadline, or within kQueuedPollInterval of its
// call's cancellation.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/core/layer.h"
#include "server/core/metrics.h"

namespace qlinear {

class Engine;
struct InferInput;
struct InferOutput;

// The largest max_batch_rows and max_queue_delay_us a server or a layer may ask for, and the most
// bytes of x and y together one batch concatenates by default (a request of more still runs,
// alone): a wide layer's rows of y, and the kernels' scratch that grows with them, stay bounded
// however many small requests join.
inline constexpr int64_t kMaxBatchRows = 65536;
inline constexpr int64_t kMaxQueueDelayUs = 10'000'000;
inline constexpr int64_t kMaxBatchBytes = int64_t{256} << 20;

struct BatchOptions {
  int64_t max_batch_rows = 256;              // 1 turns batching off
  int64_t max_queue_delay_us = 0;            // 0: batch only what is already queued
  int64_t max_queue_requests = 1024;         // per layer
  int64_t max_batch_bytes = kMaxBatchBytes;  // of x and y, the requests' rows together
};

// What the transport knows about a call: its deadline and whether it was cancelled.
struct CallContext {
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // May be empty. May be costly: gRPC's synchronous server answers it by polling the call's
  // completion queue (about 25 us on a 2-core VM), so the queue asks it only for requests that
  // waited in the queue, where dropping a cancelled one saves a kernel run.
  std::function<bool()> is_cancelled;
};

class BatchQueue {
 public:
  BatchQueue(std::shared_ptr<const Layer> layer, const Engine* engine, BatchOptions options,
             Metrics* metrics);
  ~BatchQueue();  // closes the queue, lets the worker finish what is queued, joins it
  BatchQueue(const BatchQueue&) = delete;
  BatchQueue& operator=(const BatchQueue&) = delete;

  // Queues the (already validated) request and waits for its result.
  absl::Status run(const InferInput& in, const CallContext& call, std::string* y, InferOutput* out);

  // Stops accepting requests; queued ones still run.
  void close();
  int64_t depth() const;
  // Sets the queue-depth gauge to the depth now (after the layer's gauges changed owner).
  void report_depth() const;
  // When the watched batch executing now started (steady clock, ns); 0 when none is. A batch is
  // watched where the layer's kernels run on a GPU and the batch does not force a CPU kernel:
  // a GPU batch takes milliseconds, so one that has run for a minute is stuck, where a CPU
  // kernel (cpu.reference, forced on a large request) may legitimately take minutes. Read
  // without a lock; shared, so that it outlives the queue and a watchdog reads it without holding
  // the queue (whose last release would wait for its stuck batch).
  std::shared_ptr<const std::atomic<int64_t>> running_since() const { return running_since_ns_; }
  const BatchOptions& options() const { return options_; }
  const std::shared_ptr<const Layer>& layer() const { return layer_; }
  // The layer's metric series (null without metrics).
  Metrics::LayerSeries* series() const { return series_.get(); }

 private:
  struct Pending;
  // How often a queued request's caller asks whether its call was cancelled (the probe's cost, see
  // CallContext, is paid once per interval per queued request).
  static constexpr absl::Duration kQueuedPollInterval = absl::Milliseconds(100);
  // Waits for a queued request's answer; a request whose deadline passes or whose call is
  // cancelled while it is still queued leaves the queue and is answered then, not when the
  // batches ahead of it end (its thread, and a server's drain, are not held for them).
  absl::Status wait_queued(Pending* p);
  void worker();
  // `forced`: the batch's forced kernel (empty: none), which decides whether it is watched.
  void set_busy(bool busy, absl::string_view forced = {}) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool compatible(const Pending& a, const Pending& b) const;
  // Answers every request of `batch`; throws nothing (it may run on the worker thread).
  void execute(absl::Span<Pending* const> batch) noexcept;
  // Answers p if its deadline passed, or if it waited in the queue and its call was cancelled;
  // true if it did. rerun: after p's batch failed (the message says so).
  bool answered_if_gone(Pending* p, bool rerun = false) noexcept;
  // Runs p alone and answers it (recheck: answered_if_gone first).
  void run_alone(Pending* p, bool recheck) noexcept;
  // Runs the requests' rows as one call and answers each; false, with none answered, if the call
  // failed.
  bool run_together(absl::Span<Pending* const> live) noexcept;
  // A batch's metrics.
  void record(const InferOutput& o, int64_t requests, int64_t rows) noexcept;

  std::shared_ptr<const Layer> layer_;
  const Engine* engine_;
  const BatchOptions options_;
  Metrics* metrics_;
  // Set once the worker has started (a queue that cannot start takes no layer label); the worker
  // reads it only for requests, which reach the queue after the constructor.
  std::unique_ptr<Metrics::LayerSeries> series_;

  mutable absl::Mutex mu_;
  std::deque<Pending*> queue_ ABSL_GUARDED_BY(mu_);
  // Counts every push to and removal from queue_, so that a wait can tell any change (a size can
  // come back to what it was: one request leaving, another arriving).
  uint64_t queue_changes_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a batch is executing (worker or caller thread)
  // When the batch executing started, and how long the last one took (set with busy_ where the
  // queue waits for company): how long before a queued request's deadline that wait ends.
  int64_t busy_since_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_batch_ns_ ABSL_GUARDED_BY(mu_) = 0;
  static constexpr int64_t kDeadlineLeadNs = 20'000'000;
  // Set and cleared with busy_.
  const std::shared_ptr<std::atomic<int64_t>> running_since_ns_ =
      std::make_shared<std::atomic<int64_t>>(0);
  const bool on_gpu_;  // the layer's kernels run on a GPU
  std::thread worker_;
};

}  // namespace qlinear
