#include "server/core/batcher.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/steady_clock.h"
#include "server/core/engine.h"
#include "server/core/metrics.h"

namespace qlinear {

namespace {

// A status whose message could not be built (out of memory) keeps its code, with no message.
template <typename Message>
absl::Status status_with(absl::StatusCode code, Message&& message) noexcept {
  try {
    return absl::Status(code, message());
  } catch (...) {
    return absl::Status(code, "");
  }
}

// A call's deadline on steady_now_ns's clock (INT64_MAX: none).
int64_t deadline_ns(const CallContext& call) {
  using namespace std::chrono;
  if (call.deadline == steady_clock::time_point::max()) return INT64_MAX;
  return duration_cast<nanoseconds>(call.deadline.time_since_epoch()).count();
}

constexpr char kCancelledMessage[] = "request cancelled while queued";

std::string expired_message(int64_t queue_ns) {
  return absl::StrCat("deadline expired after ", queue_ns / 1000,
                      " us in the queue, before compute");
}

// Whether x holds a NaN or an infinity (its exponent bits all set), which fails any kernel's call.
bool holds_non_finite(const InferInput& in) {
  const char* x = in.x.data();
  if (in.x_dtype == DType::kF32) {
    for (size_t i = 0; i + 4 <= in.x.size(); i += 4) {
      uint32_t v;
      std::memcpy(&v, x + i, 4);
      if ((v & 0x7f800000u) == 0x7f800000u) return true;
    }
    return false;
  }
  const uint16_t exponent = in.x_dtype == DType::kF16 ? 0x7c00 : 0x7f80;
  for (size_t i = 0; i + 2 <= in.x.size(); i += 2) {
    uint16_t v;
    std::memcpy(&v, x + i, 2);
    if ((v & exponent) == exponent) return true;
  }
  return false;
}

}  // namespace

struct BatchQueue::Pending {
  const InferInput* in;
  const CallContext* call;
  std::string* y;
  InferOutput* out;
  int64_t enqueued_ns;
  bool queued;  // waited in the queue (false: ran at once on its caller's thread)
  absl::Status status;
  absl::Notification done;
};

BatchQueue::BatchQueue(std::shared_ptr<const Layer> layer, const Engine* engine,
                       BatchOptions options, Metrics* metrics)
    : layer_(std::move(layer)),
      engine_(engine),
      options_(options),
      metrics_(metrics),
      on_gpu_(layer_->device() != "cpu") {
  worker_ = std::thread([this] { worker(); });
  if (metrics != nullptr) {
    try {
      series_ = metrics->layer_series(layer_->name());
    } catch (...) {
      close();
      worker_.join();
      throw;
    }
  }
}

BatchQueue::~BatchQueue() {
  close();
  worker_.join();
}

void BatchQueue::close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

int64_t BatchQueue::depth() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

void BatchQueue::report_depth() const {
  absl::MutexLock lock(&mu_);
  if (metrics_ != nullptr) metrics_->queue_depth(layer_.get(), layer_->name(), queue_.size());
}

absl::Status BatchQueue::run(const InferInput& in, const CallContext& call, std::string* y,
                             InferOutput* out) {
  Pending p{&in, &call, y, out, steady_now_ns(), false, absl::OkStatus(), {}};
  bool run_here = false;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return absl::UnavailableError(absl::StrCat("layer '", layer_->name(), "' is being unloaded"));
    }
    // An idle layer with nothing queued runs the request on the caller's thread: there is no one
    // to batch with (unless a delay asks to wait for company), and handing it to the worker and
    // back would cost two thread wake-ups.
    if (queue_.empty() && !busy_ && options_.max_queue_delay_us == 0) {
      set_busy(true, in.forced_kernel);
      run_here = true;
    } else if (static_cast<int64_t>(queue_.size()) >= options_.max_queue_requests) {
      return absl::ResourceExhaustedError(absl::StrCat("queue of layer '", layer_->name(),
                                                       "' is full (", options_.max_queue_requests,
                                                       " requests waiting); retry later"));
    } else {
      p.queued = true;
      queue_.push_back(&p);
      ++queue_changes_;
      if (metrics_ != nullptr) metrics_->queue_depth(layer_.get(), layer_->name(), queue_.size());
    }
  }
  if (run_here) {
    Pending* alone = &p;
    execute(absl::MakeConstSpan(&alone, 1));
    absl::MutexLock lock(&mu_);
    set_busy(false);  // lets the worker take what queued meanwhile
  }
  if (p.queued) return wait_queued(&p);
  p.done.WaitForNotification();
  return p.status;
}

absl::Status BatchQueue::wait_queued(Pending* p) {
  const CallContext& call = *p->call;
  for (;;) {
    absl::Duration wait = kQueuedPollInterval;
    if (call.deadline != std::chrono::steady_clock::time_point::max()) {
      wait = std::min(wait, absl::FromChrono(call.deadline - std::chrono::steady_clock::now()));
    }
    if (p->done.WaitForNotificationWithTimeout(std::max(wait, absl::ZeroDuration()))) break;
    const bool expired = std::chrono::steady_clock::now() >= call.deadline;
    if (!expired && !(call.is_cancelled && call.is_cancelled())) continue;
    bool left = false;
    {
      absl::MutexLock lock(&mu_);
      const auto it = std::find(queue_.begin(), queue_.end(), p);
      if (it != queue_.end()) {
        queue_.erase(it);
        ++queue_changes_;
        if (metrics_ != nullptr) metrics_->queue_depth(layer_.get(), layer_->name(), queue_.size());
        left = true;
      }
    }
    if (!left) {
      // Taken into a batch meanwhile: the batch answers it (dropping it if it is still expired or
      // cancelled when the batch starts) and holds it until then.
      p->done.WaitForNotification();
      break;
    }
    p->out->queue_ns = steady_now_ns() - p->enqueued_ns;
    if (series_ != nullptr) series_->queued(p->out->queue_ns * 1e-9);
    return expired ? status_with(absl::StatusCode::kDeadlineExceeded,
                                 [&] { return expired_message(p->out->queue_ns); })
                   : status_with(absl::StatusCode::kCancelled, [] { return kCancelledMessage; });
  }
  return p->status;
}

void BatchQueue::set_busy(bool busy, absl::string_view forced) {
  if (options_.max_queue_delay_us > 0) {  // (only the wait for company reads the batch time)
    if (busy) {
      busy_since_ns_ = steady_now_ns();
    } else if (busy_) {
      last_batch_ns_ = steady_now_ns() - busy_since_ns_;
    }
  }
  busy_ = busy;
  const absl::string_view kernel =
      forced.empty() ? absl::string_view(layer_->options().forced_kernel) : forced;
  const bool watched = busy && on_gpu_ && kernel_family(kernel) != "cpu";
  running_since_ns_->store(watched ? steady_now_ns() : 0, std::memory_order_relaxed);
}

bool BatchQueue::compatible(const Pending& a, const Pending& b) const {
  return a.in->x_dtype == b.in->x_dtype && a.in->y_dtype == b.in->y_dtype &&
         a.in->forced_kernel == b.in->forced_kernel;
}

void BatchQueue::worker() {
  std::vector<Pending*> batch;
  for (;;) {
    batch.clear();
    {
      absl::MutexLock lock(&mu_);
      // One batch at a time per layer: wait while a caller runs one on its own thread.
      mu_.Await(absl::Condition(
          +[](BatchQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
            return !q->busy_ && (q->closed_ || !q->queue_.empty());
          },
          this));
      if (queue_.empty()) return;  // closed and drained
      // Wait for company up to max_queue_delay_us after the head arrived, unless a full batch
      // is already queued or the queue is closing; and not so long that a queued request's
      // deadline passes before its batch can end: the wait ends the layer's last batch time and
      // kDeadlineLeadNs (for the thread's wake-up) before the earliest deadline. A request may
      // leave the queue meanwhile (wait_queued), the head too: the head is only ever read as the
      // queue's front, under the lock. A row's bytes of x and y (a batch's requests share both
      // dtypes).
      auto row_bytes = [this](const Pending* h) {
        return layer_->config().k * static_cast<int64_t>(dtype_size(h->in->x_dtype)) +
               layer_->config().n * static_cast<int64_t>(dtype_size(h->in->y_dtype));
      };
      if (options_.max_queue_delay_us > 0 && options_.max_batch_rows > 1) {
        auto full = [this, &row_bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (closed_ || queue_.empty()) return true;
          const Pending* head = queue_.front();
          int64_t rows = 0;
          for (Pending* q : queue_) {
            if (compatible(*head, *q)) rows += q->in->m;
          }
          return rows >= options_.max_batch_rows ||
                 rows * row_bytes(head) >= options_.max_batch_bytes;
        };
        // Each arrival or departure wakes the wait: it may bring an earlier deadline, or take the
        // head away.
        uint64_t seen = queue_changes_;
        auto full_or_change = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return queue_changes_ != seen || full();
        };
        while (!full()) {
          const Pending* head = queue_.front();
          int64_t end_ns = head->enqueued_ns + options_.max_queue_delay_us * 1000;
          for (Pending* q : queue_) {
            // A request that cannot join the head's batch runs after it: two batches' lead.
            const int64_t lead = (compatible(*head, *q) ? 1 : 2) * last_batch_ns_ + kDeadlineLeadNs;
            const int64_t d = deadline_ns(*q->call);
            end_ns = std::min(end_ns, d > INT64_MIN + lead ? d - lead : INT64_MIN);
          }
          const int64_t now = steady_now_ns();
          if (end_ns <= now) break;
          const int64_t left = end_ns - now;
          seen = queue_changes_;
          mu_.AwaitWithTimeout(absl::Condition(&full_or_change), absl::Nanoseconds(left));
        }
        if (queue_.empty()) continue;  // every queued request left while it waited
      }
      Pending* head = queue_.front();
      // Take the head and every compatible request after it, in order, up to the row budget and
      // max_batch_bytes of x and y.
      int64_t rows = 0;
      for (auto it = queue_.begin(); it != queue_.end();) {
        Pending* q = *it;
        if (!compatible(*head, *q) ||
            (rows > 0 && (rows + q->in->m > options_.max_batch_rows ||
                          (rows + q->in->m) * row_bytes(head) > options_.max_batch_bytes))) {
          ++it;
          continue;
        }
        try {
          batch.push_back(q);
        } catch (const std::bad_alloc&) {
          break;  // q stays queued for the next batch
        }
        rows += q->in->m;
        it = queue_.erase(it);
        ++queue_changes_;
        if (rows >= options_.max_batch_rows) break;
      }
      if (metrics_ != nullptr) metrics_->queue_depth(layer_.get(), layer_->name(), queue_.size());
      set_busy(true, head->in->forced_kernel);
    }
    execute(batch);
    absl::MutexLock lock(&mu_);
    set_busy(false);
  }
}

bool BatchQueue::answered_if_gone(Pending* p, bool rerun) noexcept {
  if (std::chrono::steady_clock::now() >= p->call->deadline) {
    p->status = status_with(absl::StatusCode::kDeadlineExceeded, [&] {
      return rerun ? absl::StrCat(
                         "deadline expired after its batch failed (another request's "
                         "input), before it ran again; ",
                         p->out->queue_ns / 1000, " us in the queue")
                   : expired_message(p->out->queue_ns);
    });
    p->done.Notify();
    return true;
  }
  if (p->queued && p->call->is_cancelled && p->call->is_cancelled()) {
    p->status = status_with(absl::StatusCode::kCancelled, [] { return kCancelledMessage; });
    p->done.Notify();
    return true;
  }
  return false;
}

void BatchQueue::record(const InferOutput& o, int64_t requests, int64_t rows) noexcept {
  if (series_ == nullptr) return;
  try {  // (a kernel's first batch adds its series)
    series_->batch_done(o.kernel, requests, rows, o.timings.quantize_ns * 1e-9,
                        o.timings.gemm_ns * 1e-9, o.timings.copy_ns * 1e-9);
  } catch (const std::bad_alloc&) {
    // The metrics miss one batch; the requests are answered.
  }
}

void BatchQueue::run_alone(Pending* p, bool recheck) noexcept {
  if (recheck && answered_if_gone(p, /*rerun=*/true)) return;
  p->status = engine_->execute(*layer_, *p->in, p->y, p->out);
  p->out->batch_requests = 1;
  if (p->status.ok()) record(*p->out, 1, p->in->m);
  p->done.Notify();
}

void BatchQueue::execute(absl::Span<Pending* const> batch) noexcept {
  const int64_t start = steady_now_ns();
  // Every allocation here is checked (this may be the queue's worker thread, which an exception
  // would end): one that fails answers the requests it concerns with RESOURCE_EXHAUSTED.
  std::vector<Pending*> live;
  try {
    live.reserve(batch.size());
  } catch (const std::bad_alloc&) {
    for (Pending* p : batch) {
      p->status = status_with(absl::StatusCode::kResourceExhausted,
                              [] { return "out of host memory for the batch"; });
      p->done.Notify();
    }
    return;
  }
  // Drop what expired or was cancelled while queued: it never reaches a kernel. Only requests that
  // waited are probed for cancellation: for one that runs at once, the probe (see CallContext)
  // could only catch a cancellation racing with its arrival, and costs a fifth of an M = 1 GEMM.
  // A passed deadline is told as such (the transport also reports such a call cancelled).
  for (Pending* p : batch) {
    p->out->queue_ns = start - p->enqueued_ns;
    if (series_ != nullptr) series_->queued(p->out->queue_ns * 1e-9);
    if (!answered_if_gone(p)) live.push_back(p);
  }
  if (live.empty()) return;
  if (live.size() == 1) {
    run_alone(live[0], /*recheck=*/false);
    return;
  }
  if (run_together(live)) return;

  // The batch failed. One request's bad data (a non-finite row) must not fail the others, nor cost
  // them a run each: the requests that hold a non-finite value run alone (each answer names its
  // row), and the rest run as one batch again. Where nothing was taken out (a forced kernel that
  // cannot take the batched shape, say), or the second batch fails too, each runs alone so every
  // one gets its own answer. Each is checked for its deadline and cancellation again first: the
  // failed batch took time.
  std::vector<Pending*> rest;
  try {
    rest.reserve(live.size());
  } catch (const std::bad_alloc&) {
    for (Pending* p : live) run_alone(p, /*recheck=*/true);
    return;
  }
  size_t bad = 0;
  for (Pending* p : live) {
    if (holds_non_finite(*p->in)) {
      run_alone(p, /*recheck=*/true);
      ++bad;
    } else {
      rest.push_back(p);
    }
  }
  if (bad > 0 && rest.size() > 1) {
    // (After the bad ones ran: what expired meanwhile is answered so.)
    size_t kept = 0;
    for (Pending* p : rest) {
      if (!answered_if_gone(p, /*rerun=*/true)) rest[kept++] = p;
    }
    rest.resize(kept);
    if (rest.size() > 1 && run_together(rest)) return;
  }
  for (Pending* p : rest) run_alone(p, /*recheck=*/true);
}

bool BatchQueue::run_together(absl::Span<Pending* const> live) noexcept {
  // Concatenate the rows, run once, split the rows back.
  const LayerConfig& c = layer_->config();
  const Pending& head = *live[0];
  const size_t x_row = static_cast<size_t>(c.k) * dtype_size(head.in->x_dtype);
  const size_t y_row = static_cast<size_t>(c.n) * dtype_size(head.in->y_dtype);
  int64_t rows = 0;
  bool explain = false;
  for (Pending* p : live) {
    rows += p->in->m;
    explain = explain || p->in->explain;
  }
  // The batched x failing to allocate fails the batch (each request then runs alone, each failing
  // alone where its own output cannot be allocated either).
  std::string x;
  try {
    x.reserve(rows * x_row);
  } catch (const std::bad_alloc&) {
    return false;
  }
  for (Pending* p : live) x.append(p->in->x.data(), p->in->x.size());
  InferInput in = *head.in;
  in.m = rows;
  in.x = x;
  in.explain = explain;
  std::string y;
  InferOutput out;
  if (!engine_->execute(*layer_, in, &y, &out).ok()) return false;
  record(out, static_cast<int64_t>(live.size()), rows);
  int64_t row = 0;
  for (Pending* p : live) {
    const int64_t m = p->in->m;
    InferOutput& o = *p->out;
    try {
      p->y->assign(y.data() + row * y_row, m * y_row);
      o.sa.assign(out.sa.begin() + row, out.sa.begin() + row + m);
      if (!out.azp.empty()) o.azp.assign(out.azp.begin() + row, out.azp.begin() + row + m);
      if (p->in->explain) o.explanation = out.explanation;
      o.kernel = out.kernel;
      o.device = out.device;
    } catch (const std::bad_alloc&) {
      p->status = status_with(absl::StatusCode::kResourceExhausted,
                              [] { return "out of host memory for the output"; });
      row += m;
      p->done.Notify();
      continue;
    }
    o.timings = out.timings;
    o.n = out.n;
    o.batch_requests = static_cast<int64_t>(live.size());
    o.batch_rows = rows;
    row += m;
    p->done.Notify();
  }
  return true;
}

}  // namespace qlinear
