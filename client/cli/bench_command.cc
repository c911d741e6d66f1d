// bench: a closed-loop load generator. C workers (bidi InferStreams, or unary callers) each keep
// one request in flight on their own channel (or one channel for all), for a duration or a
// request count after a warm-up; inputs are generated before the clock starts. Prints
// throughput, client latency percentiles of the successful requests (the failed ones counted
// apart, with the slowest), errors by status code, the server's own timing breakdown and batch
// sizes from the response metadata, and the kernels that ran. --echo runs the same loop on the Echo
// RPC (same bytes each way, no compute): the transport floor. --compare-echo runs both and prints
// the difference.
#include <google/protobuf/io/coded_stream.h>
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cli/cli.h"

namespace qlinear::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Error "code" of a response that came back OK but with the wrong shape or size.
constexpr int kBadResponse = -1;
// Upper bound on the bytes of pre-generated inputs; fewer distinct inputs per M above it (but
// always the rows of the largest M).
constexpr int64_t kPayloadBudget = int64_t{256} << 20;
// How long after the measured time ends calls still in flight are cancelled (and counted as
// failed): a server that stopped answering does not hold the report.
constexpr auto kInFlightGrace = std::chrono::seconds(5);
// The largest message the workers' channels send or take, in MiB.
constexpr int kMaxMessageMb = 1024;

enum class Rpc { kStream, kUnary, kEcho };

const char* rpc_name(Rpc r) {
  switch (r) {
    case Rpc::kStream:
      return "InferStream";
    case Rpc::kUnary:
      return "Infer";
    case Rpc::kEcho:
      return "Echo";
  }
  return "?";
}

struct Config {
  std::string server;
  ClientOptions transport;  // the workers' channels: TLS settings, message sizes
  std::string layer;
  int64_t n = 0, k = 0;
  std::string layer_note;  // "uploaded, random, dynamic_symmetric" / "existing, ..."
  int64_t m_min = 1, m_max = 1;
  v1::DType x_dtype = v1::DTYPE_BF16, y_dtype = v1::DTYPE_BF16;
  int64_t workers = 1;
  bool unary = false;  // infer passes: unary Infer instead of InferStream
  bool shared_channel = false;
  double warmup_s = 1, duration_s = 10;
  int64_t requests = 0;  // > 0: a request count instead of a duration
  int64_t deadline_ms = 0;
  // --timeout-s: a unary call's deadline (unless deadline_ms), and on a stream the longest wait
  // for each answer (0: none).
  std::chrono::milliseconds timeout{0};
  int64_t variants = 4;  // distinct inputs per M
  uint64_t seed = 1;
};

// Activations made before the clock starts (and before a random layer is uploaded): one buffer
// of m_max + variants - 1 rows, whose rows [v, v + M) are the v-th input of M. Its size is that
// of the largest request, plus a row per further variant within kPayloadBudget; each worker
// copies a request's rows into its own message as it sends it.
struct Inputs {
  std::string x;
  int64_t variants = 1;
  size_t row_bytes = 0;

  absl::string_view rows(int64_t m, int64_t variant) const {
    return absl::string_view(x).substr(static_cast<size_t>(variant) * row_bytes,
                                       static_cast<size_t>(m) * row_bytes);
  }
};

Inputs make_inputs(const Config& c) {
  Inputs in;
  in.row_bytes = static_cast<size_t>(c.k) * dtype_size(core_dtype(c.x_dtype));
  const int64_t budget_rows = kPayloadBudget / static_cast<int64_t>(in.row_bytes);
  in.variants = std::clamp<int64_t>(budget_rows - c.m_max + 1, 1, c.variants);
  SplitMix64 rng(c.seed ^ 0x5bd1e9955bd1e995ull);
  in.x = random_activations(rng, (c.m_max + in.variants - 1) * c.k, core_dtype(c.x_dtype));
  return in;
}

// The size of the largest request a pass of `rpc` sends (M = m_max), without building it.
size_t largest_request_bytes(const Config& c, Rpc rpc) {
  const uint64_t x_bytes = static_cast<uint64_t>(c.m_max * c.k) * dtype_size(core_dtype(c.x_dtype));
  size_t rest = 0;  // the message without its x: the other fields
  if (rpc == Rpc::kEcho) {
    v1::EchoRequest e;
    e.set_response_bytes(c.m_max * c.n * static_cast<int64_t>(dtype_size(core_dtype(c.y_dtype))));
    rest = e.ByteSizeLong();
  } else {
    v1::InferRequest r;
    r.set_layer(c.layer);
    r.set_x_dtype(c.x_dtype);
    r.set_output_dtype(c.y_dtype);
    r.set_m(c.m_max);
    rest = r.ByteSizeLong();
  }
  // x's tag (one byte), its length and its bytes.
  return rest + 1 + google::protobuf::io::CodedOutputStream::VarintSize64(x_bytes) + x_bytes;
}

struct ErrorTally {
  int64_t count = 0;
  std::string first_message;
};

// What one worker measured (requests issued after the warm-up only).
struct WorkerResult {
  int64_t ok = 0, rows = 0;
  std::vector<int64_t> latency_ns;   // successful requests'
  int64_t failed_max_ns = 0;         // the slowest failed request's latency
  std::map<int, ErrorTally> errors;  // by google.rpc code, or kBadResponse
  std::vector<int64_t> queue_us, quantize_us, gemm_us, copy_us, total_us;
  int64_t batch_requests = 0, batch_rows = 0;
  std::map<std::string, int64_t> kernels;
  std::string device;
  Clock::time_point last_done{};
  int64_t streams_reopened = 0;
};

// State shared by the workers and the progress loop.
struct Shared {
  Clock::time_point start, measure_from, measure_until;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> tickets{0};   // --requests: measured requests claimed
  std::atomic<int64_t> done{0};      // every completed request, warm-up included
  std::atomic<int64_t> errors{0};    // every failed one
  std::atomic<int64_t> finished{0};  // workers that have returned
};

std::string deadline_message(std::chrono::milliseconds deadline, absl::string_view flag) {
  return absl::StrCat("no answer within the call's deadline of ",
                      absl::FormatDuration(absl::FromChrono(deadline)), " (", flag, ")");
}

class Worker {
 public:
  Worker(int index, const Config& c, const Inputs& in, v1::QLinear::Stub* stub, Rpc rpc, Shared* sh,
         WorkerResult* r)
      : c_(c),
        in_(in),
        stub_(stub),
        rpc_(rpc),
        sh_(sh),
        r_(r),
        rng_(c.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(index) + 1) {
    infer_.set_layer(c.layer);
    infer_.set_x_dtype(c.x_dtype);
    infer_.set_output_dtype(c.y_dtype);
  }

  void run() {
    switch (rpc_) {
      case Rpc::kStream:
        run_stream();
        break;
      case Rpc::kUnary:
        run_unary();
        break;
      case Rpc::kEcho:
        run_echo();
        break;
    }
    sh_->finished.fetch_add(1);
  }

  // Cancels the call in flight, if any (from another thread): a stopped run does not wait for a
  // server that has stopped answering. The request in flight is counted as `code` with `why`,
  // not as the CANCELLED its call ends with. With `sent` given, only while the request in flight
  // is still the one sent then (its answer may have come since the caller looked, and the next
  // request gone out, which is not overdue).
  void cancel(grpc::StatusCode code, const std::string& why, Clock::time_point sent = {}) {
    absl::MutexLock lock(&live_mu_);
    if (live_ == nullptr) return;
    if (sent != Clock::time_point{} && in_flight_since() != sent) return;
    if (cut_code_ == grpc::StatusCode::OK) {
      cut_code_ = code;
      cut_why_ = why;
    }
    live_->TryCancel();
  }

  // When the request in flight was sent; Clock::time_point{} when none is.
  Clock::time_point in_flight_since() const {
    return Clock::time_point(Clock::duration(in_flight_since_.load(std::memory_order_relaxed)));
  }

 private:
  // The call this worker has in flight, for cancel(); a new call is not cut off yet.
  void set_live(grpc::ClientContext* ctx) {
    absl::MutexLock lock(&live_mu_);
    live_ = ctx;
    if (ctx != nullptr) cut_code_ = grpc::StatusCode::OK;
  }

  // (Under live_mu_, so that cancel() cuts only the request it looked at.)
  void set_in_flight(Clock::time_point since) {
    absl::MutexLock lock(&live_mu_);
    in_flight_since_.store(since.time_since_epoch().count(), std::memory_order_relaxed);
  }

  // What a call that ended with `s` counts as: the reason cancel() gave, where it cut it off.
  std::pair<int, std::string> failure(const grpc::Status& s) {
    absl::MutexLock lock(&live_mu_);
    if (cut_code_ != grpc::StatusCode::OK) {
      const int code = cut_code_;
      cut_code_ = grpc::StatusCode::OK;
      return {code, cut_why_};
    }
    if (s.ok()) return {grpc::StatusCode::UNKNOWN, "the stream ended without a response"};
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && rpc_ != Rpc::kStream) {
      return {s.error_code(),
              c_.deadline_ms > 0
                  ? deadline_message(std::chrono::milliseconds(c_.deadline_ms), "--deadline-ms")
                  : deadline_message(c_.timeout, "--timeout-s")};
    }
    return {s.error_code(), s.error_message()};
  }

  // Whether to issue another request; sets the send time and whether it is measured.
  bool next(Clock::time_point* t0, bool* measured) {
    if (sh_->stop.load(std::memory_order_relaxed)) return false;
    *t0 = Clock::now();
    *measured = *t0 >= sh_->measure_from;
    if (!*measured) return true;
    if (c_.requests > 0) return sh_->tickets.fetch_add(1, std::memory_order_relaxed) < c_.requests;
    return *t0 < sh_->measure_until;
  }

  // The next request's M and variant.
  std::pair<int64_t, int64_t> pick() {
    const int64_t m = c_.m_min == c_.m_max ? c_.m_min : rng_.range(c_.m_min, c_.m_max);
    const int64_t v = in_.variants == 1 ? 0 : rng_.range(0, in_.variants - 1);
    return {m, v};
  }

  // This worker's request of M rows, variant v (its x copied in before the send time is taken).
  const v1::InferRequest& infer_request(int64_t m, int64_t v) {
    const absl::string_view x = in_.rows(m, v);
    infer_.set_m(m);
    infer_.set_x(x.data(), x.size());
    return infer_;
  }

  // The deadline of a unary call: --deadline-ms, else --timeout-s.
  void set_deadline(grpc::ClientContext* ctx) const {
    const auto d = c_.deadline_ms > 0 ? std::chrono::milliseconds(c_.deadline_ms) : c_.timeout;
    if (d.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + d);
  }

  void error(bool measured, int code, const std::string& message, Clock::time_point t0,
             Clock::time_point t1) {
    sh_->done.fetch_add(1, std::memory_order_relaxed);
    sh_->errors.fetch_add(1, std::memory_order_relaxed);
    if (!measured) return;
    ErrorTally& e = r_->errors[code];
    if (e.count++ == 0) e.first_message = message;
    r_->failed_max_ns = std::max<int64_t>(
        r_->failed_max_ns, std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    r_->last_done = std::max(r_->last_done, t1);
  }

  void success(bool measured, int64_t m, Clock::time_point t0, Clock::time_point t1) {
    sh_->done.fetch_add(1, std::memory_order_relaxed);
    if (!measured) return;
    ++r_->ok;
    r_->rows += m;
    r_->latency_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    r_->last_done = std::max(r_->last_done, t1);
  }

  // A response of either infer RPC; per-message errors only come on streams.
  void infer_done(bool measured, const v1::InferRequest& req, const v1::InferResponse& resp,
                  Clock::time_point t0, Clock::time_point t1) {
    if (resp.status_code() != 0) {
      error(measured, resp.status_code(), resp.status_message(), t0, t1);
      return;
    }
    const size_t want = static_cast<size_t>(req.m() * c_.n) * dtype_size(core_dtype(c_.y_dtype));
    if (resp.m() != req.m() || resp.n() != c_.n || resp.y().size() != want) {
      error(measured, kBadResponse,
            absl::StrCat("y [", resp.m(), ", ", resp.n(), "] with ", resp.y().size(),
                         " bytes for a request of M=", req.m(), " (expected ", want, " bytes)"),
            t0, t1);
      return;
    }
    success(measured, req.m(), t0, t1);
    if (!measured) return;
    const v1::InferMetadata& md = resp.metadata();
    r_->queue_us.push_back(md.timings().queue_us());
    r_->quantize_us.push_back(md.timings().quantize_us());
    r_->gemm_us.push_back(md.timings().gemm_us());
    r_->copy_us.push_back(md.timings().copy_us());
    r_->total_us.push_back(md.timings().total_us());
    r_->batch_requests += md.batch_requests();
    r_->batch_rows += md.batch_rows();
    if (md.kernel() != last_kernel_ || kernel_count_ == nullptr) {
      last_kernel_ = md.kernel();
      kernel_count_ = &r_->kernels[last_kernel_];
    }
    ++*kernel_count_;
    if (r_->device.empty()) r_->device = md.device();
  }

  void run_stream() {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::InferRequest, v1::InferResponse>> rw;
    auto open = [&] {
      set_live(nullptr);
      ctx = std::make_unique<grpc::ClientContext>();
      rw = stub_->InferStream(ctx.get());
      set_live(ctx.get());
    };
    open();
    int64_t ok_on_stream = 0;
    v1::InferResponse resp;
    Clock::time_point t0;
    bool measured = false;
    for (;;) {
      auto [m, v] = pick();
      const v1::InferRequest& req = infer_request(m, v);
      if (!next(&t0, &measured)) break;
      set_in_flight(t0);
      const bool good = rw->Write(req) && rw->Read(&resp);
      set_in_flight({});
      const auto t1 = Clock::now();
      if (good) {
        ++ok_on_stream;
        infer_done(measured, req, resp, t0, t1);
        continue;
      }
      // The stream broke (or was cut off): count the request in flight, then open a new stream
      // (after a pause when this one never worked, so that a dead server is not hammered).
      const auto [code, why] = failure(rw->Finish());
      error(measured, code, why, t0, t1);
      if (sh_->stop.load(std::memory_order_relaxed)) {
        set_live(nullptr);
        return;  // stopped (perhaps by cancelling this stream): no new stream
      }
      if (ok_on_stream == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ++r_->streams_reopened;
      ok_on_stream = 0;
      open();
    }
    // Closing the stream waits for the server too: as long as a request would.
    set_in_flight(Clock::now());
    rw->WritesDone();
    while (rw->Read(&resp)) {
    }
    rw->Finish();
    set_in_flight({});
    set_live(nullptr);
  }

  // A unary call of `rpc` on `ctx`, timed for the watchdog and cancel().
  template <typename Call>
  grpc::Status unary_call(grpc::ClientContext* ctx, Clock::time_point t0, Call call) {
    set_deadline(ctx);
    set_live(ctx);
    set_in_flight(t0);
    const grpc::Status s = call();
    set_in_flight({});
    return s;
  }

  void run_unary() {
    v1::InferResponse resp;
    Clock::time_point t0;
    bool measured = false;
    for (;;) {
      auto [m, v] = pick();
      const v1::InferRequest& req = infer_request(m, v);
      if (!next(&t0, &measured)) break;
      grpc::ClientContext ctx;
      resp.Clear();
      const grpc::Status s = unary_call(&ctx, t0, [&] { return stub_->Infer(&ctx, req, &resp); });
      const auto t1 = Clock::now();
      if (!s.ok()) {
        const auto [code, why] = failure(s);
        set_live(nullptr);
        error(measured, code, why, t0, t1);
        if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        continue;
      }
      set_live(nullptr);
      infer_done(measured, req, resp, t0, t1);
    }
  }

  void run_echo() {
    v1::EchoRequest req;
    v1::EchoResponse resp;
    Clock::time_point t0;
    bool measured = false;
    const int64_t y_row_bytes = c_.n * static_cast<int64_t>(dtype_size(core_dtype(c_.y_dtype)));
    for (;;) {
      auto [m, v] = pick();
      const absl::string_view x = in_.rows(m, v);
      req.set_payload(x.data(), x.size());
      req.set_response_bytes(m * y_row_bytes);
      if (!next(&t0, &measured)) break;
      grpc::ClientContext ctx;
      const grpc::Status s = unary_call(&ctx, t0, [&] { return stub_->Echo(&ctx, req, &resp); });
      const auto t1 = Clock::now();
      if (!s.ok()) {
        const auto [code, why] = failure(s);
        set_live(nullptr);
        error(measured, code, why, t0, t1);
        if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        continue;
      }
      set_live(nullptr);
      if (static_cast<int64_t>(resp.payload().size()) != req.response_bytes()) {
        error(measured, kBadResponse,
              absl::StrCat("echo returned ", resp.payload().size(), " bytes, asked for ",
                           req.response_bytes()),
              t0, t1);
        continue;
      }
      success(measured, m, t0, t1);
    }
  }

  const Config& c_;
  const Inputs& in_;
  v1::QLinear::Stub* stub_;
  Rpc rpc_;
  Shared* sh_;
  WorkerResult* r_;
  SplitMix64 rng_;
  v1::InferRequest infer_;  // the request being sent, refilled for each
  std::string last_kernel_;
  int64_t* kernel_count_ = nullptr;
  std::atomic<Clock::rep> in_flight_since_{0};
  absl::Mutex live_mu_;
  grpc::ClientContext* live_ ABSL_GUARDED_BY(live_mu_) = nullptr;
  // Why cancel() cut off the call in flight (OK: it did not).
  grpc::StatusCode cut_code_ ABSL_GUARDED_BY(live_mu_) = grpc::StatusCode::OK;
  std::string cut_why_ ABSL_GUARDED_BY(live_mu_);
};

std::shared_ptr<grpc::Channel> bench_channel(const Config& c, int index) {
  grpc::ChannelArguments a;
  // A private subchannel pool and a distinct argument: channels with equal arguments would
  // otherwise share one connection.
  a.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  a.SetInt("qlinear.bench_channel", index);
  return make_channel(c.server, c.transport, a);
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Merged results of one pass.
struct PassResult {
  Rpc rpc = Rpc::kStream;
  int64_t ok = 0, failed = 0, rows = 0;
  double measured_s = 0, cpu_s = 0, wall_s = 0;
  int64_t variants = 1;
  bool interrupted = false;
  std::vector<int64_t> latency_ns;  // successful requests'
  int64_t failed_max_ns = 0;
  std::map<int, ErrorTally> errors;
  std::vector<int64_t> queue_us, quantize_us, gemm_us, copy_us, total_us;
  int64_t batch_requests = 0, batch_rows = 0;
  std::map<std::string, int64_t> kernels;
  std::string device;
  int64_t streams_reopened = 0;
};

template <typename T>
T percentile_sorted(const std::vector<T>& v, double q) {
  if (v.empty()) return T{};
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

template <typename T>
double mean(const std::vector<T>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (T x : v) s += static_cast<double>(x);
  return s / static_cast<double>(v.size());
}

std::string ms(int64_t ns) { return absl::StrFormat("%.3f ms", static_cast<double>(ns) * 1e-6); }

// `since`: the start of the interval that `rate` covers.
std::string progress_line(const Shared& sh, Clock::time_point since, Clock::time_point now,
                          int64_t rate) {
  const double t = std::chrono::duration<double>(now - sh.start).count();
  const char* phase = since < sh.measure_from ? " (warm-up)" : "";
  return absl::StrFormat("bench: %5.1f s%s  %lld requests  %lld req/s  %lld errors", t, phase,
                         static_cast<long long>(sh.done.load()), static_cast<long long>(rate),
                         static_cast<long long>(sh.errors.load()));
}

// Runs one pass: builds the inputs, opens the channels, runs the workers with a progress line.
absl::StatusOr<PassResult> run_pass(const Config& c, const Inputs& inputs, Rpc rpc) {
  const int workers = static_cast<int>(c.workers);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < (c.shared_channel ? 1 : workers); ++i) {
    channels.push_back(bench_channel(c, i));
  }
  std::vector<std::unique_ptr<v1::QLinear::Stub>> stubs;
  for (auto& ch : channels) stubs.push_back(v1::QLinear::NewStub(ch));
  // Connected before the clock starts. A channel that does not connect is asked why with one
  // short call, whose status (gRPC's reason, which fail() reads for its hints) ends the pass.
  for (size_t i = 0; i < channels.size(); ++i) {
    if (channels[i]->WaitForConnected(std::chrono::system_clock::now() +
                                      std::chrono::seconds(10))) {
      continue;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ListLayersResponse resp;
    const grpc::Status s = stubs[i]->ListLayers(&ctx, v1::ListLayersRequest(), &resp);
    if (!s.ok()) return from_grpc_status(s);  // else it connected after all
  }

  Shared sh;
  std::vector<WorkerResult> results(static_cast<size_t>(workers));
  const double cpu0 = cpu_seconds();
  sh.start = Clock::now();
  sh.measure_from = sh.start + std::chrono::microseconds(static_cast<int64_t>(c.warmup_s * 1e6));
  sh.measure_until =
      c.requests > 0
          ? Clock::time_point::max()
          : sh.measure_from + std::chrono::microseconds(static_cast<int64_t>(c.duration_s * 1e6));
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Worker>> ws;
  for (int i = 0; i < workers; ++i) {
    ws.push_back(std::make_unique<Worker>(i, c, inputs, stubs[c.shared_channel ? 0 : i].get(), rpc,
                                          &sh, &results[static_cast<size_t>(i)]));
  }
  for (auto& w : ws) threads.emplace_back([&w] { w->run(); });

  // Progress once a second: carriage-return updates on a terminal, plain lines otherwise.
  const bool tty = isatty(STDERR_FILENO) != 0;
  bool printed = false;
  auto next_tick = sh.start + std::chrono::seconds(1);
  int64_t last_done = 0;
  auto last_tick = sh.start;
  Clock::time_point interrupted_at{};
  bool told_waiting = false, cancelled = false;
  const std::string timed_out = deadline_message(c.timeout, "--timeout-s");
  const std::string overran =
      absl::StrCat("still in flight ", absl::FormatDuration(absl::FromChrono(kInFlightGrace)),
                   " after the measured time ended");
  while (sh.finished.load() < workers) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const bool interrupted = sigint_received();
    if (interrupted && !sh.stop.exchange(true)) interrupted_at = Clock::now();
    // A second after the stop, calls still in flight are cancelled: a server that stopped
    // answering does not hold the run (nor the report of what was measured).
    if (interrupted && !cancelled && Clock::now() - interrupted_at > std::chrono::seconds(1)) {
      cancelled = true;
      for (auto& w : ws) w->cancel(grpc::StatusCode::CANCELLED, "cancelled by Ctrl-C");
    }
    // The same for a stream's answer later than --timeout-s (a unary call has it as its
    // deadline), and for any call still in flight a while after the measured time.
    const auto now = Clock::now();
    for (auto& w : ws) {
      const Clock::time_point since = w->in_flight_since();
      if (since == Clock::time_point{}) continue;
      if (rpc == Rpc::kStream && c.timeout.count() > 0 && now - since > c.timeout) {
        w->cancel(grpc::StatusCode::DEADLINE_EXCEEDED, timed_out, since);
      } else if (c.requests == 0 && now > sh.measure_until + kInFlightGrace) {
        w->cancel(grpc::StatusCode::CANCELLED, overran, since);
      }
    }
    if (interrupted && !told_waiting && Clock::now() - interrupted_at > std::chrono::seconds(2)) {
      told_waiting = true;
      std::fprintf(stderr,
                   "%swaiting for %d worker(s) whose requests are still in flight; "
                   "Ctrl-C again to quit at once\n",
                   tty ? "\n" : "", static_cast<int>(workers - sh.finished.load()));
    }
    if (now < next_tick) continue;
    const int64_t done = sh.done.load();
    const double dt = std::chrono::duration<double>(now - last_tick).count();
    const int64_t rate =
        static_cast<int64_t>(std::llround((done - last_done) / std::max(dt, 1e-3)));
    const std::string line = progress_line(sh, last_tick, now, rate);
    last_done = done;
    last_tick = now;
    next_tick += std::chrono::seconds(1);
    if (tty) {
      std::fprintf(stderr, "\r%s\033[K", line.c_str());
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
    printed = true;
  }
  for (auto& t : threads) t.join();
  if (tty && printed) std::fprintf(stderr, "\n");

  PassResult pr;
  pr.rpc = rpc;
  pr.variants = inputs.variants;
  pr.interrupted = sigint_received();
  pr.wall_s = std::chrono::duration<double>(Clock::now() - sh.start).count();
  pr.cpu_s = cpu_seconds() - cpu0;
  Clock::time_point last = sh.measure_from;
  for (WorkerResult& r : results) {
    pr.ok += r.ok;
    pr.rows += r.rows;
    pr.latency_ns.insert(pr.latency_ns.end(), r.latency_ns.begin(), r.latency_ns.end());
    pr.failed_max_ns = std::max(pr.failed_max_ns, r.failed_max_ns);
    for (auto& [code, e] : r.errors) {
      ErrorTally& t = pr.errors[code];
      if (t.count == 0) t.first_message = e.first_message;
      t.count += e.count;
      pr.failed += e.count;
    }
    pr.queue_us.insert(pr.queue_us.end(), r.queue_us.begin(), r.queue_us.end());
    pr.quantize_us.insert(pr.quantize_us.end(), r.quantize_us.begin(), r.quantize_us.end());
    pr.gemm_us.insert(pr.gemm_us.end(), r.gemm_us.begin(), r.gemm_us.end());
    pr.copy_us.insert(pr.copy_us.end(), r.copy_us.begin(), r.copy_us.end());
    pr.total_us.insert(pr.total_us.end(), r.total_us.begin(), r.total_us.end());
    pr.batch_requests += r.batch_requests;
    pr.batch_rows += r.batch_rows;
    for (auto& [k, n] : r.kernels) pr.kernels[k] += n;
    if (pr.device.empty()) pr.device = r.device;
    pr.streams_reopened += r.streams_reopened;
    if (r.last_done > last) last = r.last_done;
  }
  pr.measured_s = std::chrono::duration<double>(last - sh.measure_from).count();
  for (auto* v :
       {&pr.latency_ns, &pr.queue_us, &pr.quantize_us, &pr.gemm_us, &pr.copy_us, &pr.total_us}) {
    std::sort(v->begin(), v->end());
  }
  return pr;
}

std::string code_name(int code) {
  if (code == kBadResponse) return "BAD_RESPONSE";
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

std::string describe_pass(const Config& c, Rpc rpc) {
  std::string what;
  if (rpc == Rpc::kEcho) {
    const size_t xs = dtype_size(core_dtype(c.x_dtype)), ys = dtype_size(core_dtype(c.y_dtype));
    what = absl::StrCat("echo (", c.k * static_cast<int64_t>(xs), " B/row up, ",
                        c.n * static_cast<int64_t>(ys), " B/row down, as for N=", c.n, " K=", c.k,
                        ")");
  } else {
    what = absl::StrCat("infer on layer '", c.layer, "' (N=", c.n, " K=", c.k, ", ", c.layer_note,
                        ")");
  }
  const std::string m = c.m_min == c.m_max ? absl::StrCat("M=", c.m_min)
                                           : absl::StrCat("M random in ", c.m_min, "..", c.m_max);
  const std::string who = absl::StrCat(
      c.workers, " ",
      rpc == Rpc::kStream
          ? (c.workers == 1 ? "InferStream" : "InferStreams")
          : absl::StrCat("unary ", rpc_name(rpc), c.workers == 1 ? " caller" : " callers"),
      c.shared_channel ? " on one channel" : (c.workers == 1 ? "" : " on their own channels"));
  const std::string length = c.requests > 0 ? absl::StrCat(c.requests, " requests")
                                            : absl::StrFormat("%g s", c.duration_s);
  return absl::StrCat(
      "bench: ", what, ", ", m, ", ", dtype_cli_name(c.x_dtype), " -> ", dtype_cli_name(c.y_dtype),
      ", ", who, ", ", length, absl::StrFormat(" after %g s warm-up", c.warmup_s),
      c.deadline_ms > 0 ? absl::StrCat(", deadline ", c.deadline_ms, " ms") : "", ", seed ", c.seed,
      ", server ", c.server, c.transport.credentials != nullptr ? " over TLS" : "");
}

void print_pass(const Config& c, const PassResult& r) {
  std::printf("%s\n", describe_pass(c, r.rpc).c_str());
  auto row = [](const char* key, const std::string& value) {
    std::printf("  %-12s%s\n", key, value.c_str());
  };
  row("requests", absl::StrFormat("%lld ok, %lld failed in %.3f s measured%s",
                                  static_cast<long long>(r.ok), static_cast<long long>(r.failed),
                                  r.measured_s, r.interrupted ? " (interrupted)" : ""));
  const double s = std::max(r.measured_s, 1e-9);
  row("throughput", absl::StrFormat("%.1f requests/s, %.1f rows/s", static_cast<double>(r.ok) / s,
                                    static_cast<double>(r.rows) / s));
  // The percentiles are the successful requests' (a failure's time says little of the server's
  // speed: a refusal is quick, a deadline long); the failed ones are counted apart, with the
  // slowest.
  if (r.latency_ns.empty()) {
    row("latency", "- (no successful request)");
  } else {
    row("latency",
        absl::StrCat("p50 ", ms(percentile_sorted(r.latency_ns, 0.5)), "   p90 ",
                     ms(percentile_sorted(r.latency_ns, 0.9)), "   p99 ",
                     ms(percentile_sorted(r.latency_ns, 0.99)), "   max ", ms(r.latency_ns.back()),
                     "   mean ", ms(static_cast<int64_t>(mean(r.latency_ns))), "   (client, ",
                     r.latency_ns.size(), " successful requests)"));
  }
  if (r.failed > 0) {
    row("", absl::StrCat(r.failed, r.failed == 1 ? " failed request" : " failed requests",
                         " not in the percentiles: max ", ms(r.failed_max_ns)));
  }
  if (r.errors.empty()) {
    row("errors", "none");
  } else {
    bool first = true;
    for (const auto& [code, e] : r.errors) {
      row(first ? "errors" : "",
          absl::StrCat(code_name(code), " x", e.count, ": ", e.first_message));
      first = false;
    }
  }
  if (r.streams_reopened > 0)
    row("streams", absl::StrCat(r.streams_reopened, " reopened after a break"));
  if (r.rpc != Rpc::kEcho && !r.total_us.empty()) {
    auto col = [&](const char* name, const std::vector<int64_t>& v) {
      return absl::StrFormat("%s %.1f us", name, mean(v));
    };
    auto col50 = [&](const char* name, const std::vector<int64_t>& v) {
      return absl::StrFormat("%s %lld us", name, static_cast<long long>(percentile_sorted(v, 0.5)));
    };
    row("server",
        absl::StrCat(col("queue", r.queue_us), "   ", col("quantize", r.quantize_us), "   ",
                     col("gemm", r.gemm_us), "   ", col("copies", r.copy_us), "   ",
                     col("total", r.total_us), "   (mean over ", r.total_us.size(), " responses)"));
    row("server p50",
        absl::StrCat(col50("queue", r.queue_us), "   ", col50("quantize", r.quantize_us), "   ",
                     col50("gemm", r.gemm_us), "   ", col50("copies", r.copy_us), "   ",
                     col50("total", r.total_us)));
    const double n = static_cast<double>(r.total_us.size());
    row("batch", absl::StrFormat("%.2f requests, %.2f rows per GEMM (mean over responses)",
                                 static_cast<double>(r.batch_requests) / n,
                                 static_cast<double>(r.batch_rows) / n));
    std::vector<std::string> ks;
    for (const auto& [k, count] : r.kernels) ks.push_back(absl::StrCat(k, " x", count));
    row("kernels", absl::StrCat(absl::StrJoin(ks, ", "), r.device.empty() ? "" : " on ", r.device));
  }
  row("client cpu", absl::StrFormat("%.2f s over %.2f s (%.2f cores), %lld distinct inputs per M",
                                    r.cpu_s, r.wall_s, r.cpu_s / std::max(r.wall_s, 1e-9),
                                    static_cast<long long>(r.variants)));
  std::fflush(stdout);
}

void print_overhead(const PassResult& infer, const PassResult& echo) {
  if (infer.latency_ns.empty() || echo.latency_ns.empty()) {
    std::printf("server overhead = latency - echo latency: - (a pass had no successful request)\n");
    return;
  }
  auto diff = [&](double q) {
    const int64_t a = percentile_sorted(infer.latency_ns, q);
    const int64_t b = percentile_sorted(echo.latency_ns, q);
    return absl::StrFormat("%.3f ms (%.3f - %.3f)", (a - b) * 1e-6, a * 1e-6, b * 1e-6);
  };
  std::printf("server overhead = latency - echo latency:  p50 %s   p99 %s%s\n", diff(0.5).c_str(),
              diff(0.99).c_str(),
              infer.rpc == Rpc::kStream ? "   (infer on InferStreams, echo unary)" : "");
  if (!infer.gemm_us.empty()) {
    std::printf("  for reference, the server's p50 quantize %lld us, gemm %lld us, total %lld us\n",
                static_cast<long long>(percentile_sorted(infer.quantize_us, 0.5)),
                static_cast<long long>(percentile_sorted(infer.gemm_us, 0.5)),
                static_cast<long long>(percentile_sorted(infer.total_us, 0.5)));
  }
}

// Uploads a random layer (int8 weights, per-channel scales, a bias) for the bench, with a
// progress line where it is large; Ctrl-C stops it (CANCELLED, nothing loaded).
absl::StatusOr<v1::LayerInfo> upload_random_layer(Client& client, const Config& c,
                                                  v1::Scheme scheme, int64_t max_batch_rows,
                                                  int64_t max_queue_delay_us) {
  SplitMix64 rng(c.seed);
  std::vector<int8_t> w = random_int8(rng, static_cast<size_t>(c.n * c.k));
  auto tensor = [&](const std::vector<float>& v) {
    v1::Tensor t;
    t.set_dtype(v1::DTYPE_FP32);
    t.add_shape(static_cast<int64_t>(v.size()));
    t.set_data(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    return t;
  };
  v1::LayerHeader h;
  h.set_name(c.layer);
  h.set_n(c.n);
  h.set_k(c.k);
  h.set_scheme(scheme);
  *h.mutable_weight_scale() = tensor(random_floats(rng, static_cast<size_t>(c.n), 0.5e-3f, 2e-3f));
  *h.mutable_bias() = tensor(random_floats(rng, static_cast<size_t>(c.n), -1.f, 1.f));
  if (scheme == v1::SCHEME_STATIC_SYMMETRIC || scheme == v1::SCHEME_STATIC_ASYMMETRIC) {
    h.set_input_scale(0.02f);
  }
  if (scheme == v1::SCHEME_STATIC_ASYMMETRIC) h.set_input_zero_point(3);
  if (max_batch_rows >= 0) h.set_max_batch_rows(max_batch_rows);
  if (max_queue_delay_us >= 0) h.set_max_queue_delay_us(max_queue_delay_us);
  const auto start = Clock::now();
  // (Ctrl-C stops the upload: the caller has a CatchSigint.)
  auto resp = upload_with_progress(client, std::move(h), w);
  if (!resp.ok()) {
    if (sigint_received()) {
      return absl::CancelledError(absl::StrCat("interrupted (Ctrl-C) while uploading layer '",
                                               c.layer, "'; nothing was loaded"));
    }
    return resp.status();
  }
  std::fprintf(stderr, "bench: uploaded random layer '%s' (%s in %.2f s)\n", c.layer.c_str(),
               human_bytes(c.n * c.k).c_str(),
               std::chrono::duration<double>(Clock::now() - start).count());
  return resp->layer();
}

std::string batching_note(const v1::LayerInfo& l) {
  return l.max_batch_rows() <= 1 ? "batching off"
                                 : absl::StrCat("batching up to ", l.max_batch_rows(), " rows, ",
                                                l.max_queue_delay_us(), " us delay");
}

}  // namespace

int cmd_bench(const CommandArgs& args) {
  Config c;
  std::string layer, scheme_arg = "dynamic_symmetric", dtype_arg = "bf16", output_dtype_arg;
  int64_t n = 0, k = 0, m = 0, m_min = 0, m_max = 0, streams = 1, requests = 0, deadline_ms = 0;
  int64_t seed = 1, inputs = 4, max_batch_rows = -1, max_queue_delay_us = -1;
  double duration = 0, warmup = 1;
  bool unary = false, echo = false, compare_echo = false, shared_channel = false, keep = false;
  ArgParser p(
      "qlinear-cli bench (--layer NAME | --n N --k K) [--m M | --m-min A --m-max B]\n"
      "                  [--streams C] [--unary] [--duration S | --requests R] [options]",
      "Load benchmark. C workers each keep one request in flight: bidirectional InferStreams\n"
      "(default) or, with --unary, unary Infer callers; each worker has its own channel (its own\n"
      "connection) unless --shared-channel. The layer is --layer, or a random one of --n x --k\n"
      "uploaded as bench-<pid>-<random> and unloaded at the end (unless --keep). M is --m, or\n"
      "uniform in --m-min..--m-max per request; inputs are generated before the clock starts (a\n"
      "few distinct ones per M). Requests sent during --warmup are not measured. A progress\n"
      "line goes to stderr once a second. The report gives throughput, client latency\n"
      "percentiles of the successful requests (the failed ones counted apart, with the\n"
      "slowest), errors by status code, the server's queue/quantize/gemm/total times and batch\n"
      "sizes averaged over the responses, and the kernels that ran.\n"
      "--echo runs the same loop on the Echo RPC (server flag --enable-echo; always unary):\n"
      "M*K*dtype bytes up and M*N*output dtype bytes down, no compute, i.e. the transport\n"
      "floor. --compare-echo runs the infer pass, then the echo pass, and prints the server\n"
      "overhead = latency - echo latency at p50 and p99. Ctrl-C stops early and reports (during\n"
      "the random layer's upload: stops it, nothing loaded; an upload over 4 MiB shows a\n"
      "progress line on a terminal).\n"
      "--timeout-s (default 60 s) bounds each request: a unary call's deadline unless\n"
      "--deadline-ms, and on a stream the wait for each answer (a later one cancels the stream,\n"
      "counts DEADLINE_EXCEEDED and opens a new stream); requests still in flight 5 s after the\n"
      "measured time are cancelled and counted as failed. The random layer's upload has a\n"
      "deadline only where --timeout-s is given.\n"
      "Exit 1 when no request succeeded or the server cannot be reached.");
  p.add("layer", &layer, "Existing layer to run (instead of --n/--k)");
  p.add("n", &n, "Output features of the random layer");
  p.add("k", &k, "Input features of the random layer");
  p.add("scheme", &scheme_arg, "Scheme of the random layer");
  p.add("max-batch-rows", &max_batch_rows,
        "Random layer: most rows per GEMM (1: batching off; -1: the server's default)");
  p.add("max-queue-delay-us", &max_queue_delay_us,
        "Random layer: longest wait for company (-1: the server's default)");
  p.add("m", &m, "Rows per request (0: --m-min..--m-max, else 1)");
  p.add("m-min", &m_min, "Smallest M of a random M");
  p.add("m-max", &m_max, "Largest M of a random M");
  p.add("dtype", &dtype_arg, "Activation dtype: bf16, fp16 or fp32");
  p.add("output-dtype", &output_dtype_arg, "Output dtype (default: --dtype)");
  p.add("streams", &streams, "Concurrent workers (streams, or unary callers with --unary)");
  p.add("unary", &unary, "Unary Infer calls instead of InferStreams");
  p.add("shared-channel", &shared_channel, "All workers on one channel (one connection)");
  p.add("duration", &duration, "Measured seconds (0: 10, unless --requests)");
  p.add("requests", &requests, "Measured requests in all, instead of --duration");
  p.add("warmup", &warmup, "Seconds of unmeasured requests first");
  p.add("deadline-ms", &deadline_ms, "Deadline of each unary call, 0-86400000 (0: --timeout-s)");
  p.add("inputs", &inputs, "Distinct inputs per M");
  p.add("seed", &seed, "Seed of the layer, the inputs and the M sequence");
  p.add("echo", &echo, "Only the echo pass (transport floor)");
  p.add("compare-echo", &compare_echo, "The infer pass, then the echo pass, and the difference");
  p.add("keep", &keep, "Leave the random layer loaded");
  if (int rc = parse_command_line(p, args); rc >= 0) return rc;

  // --- the command line ------------------------------------------------------------------------
  if (echo && compare_echo) return usage_error("--echo and --compare-echo exclude each other");
  if (!layer.empty() && (n != 0 || k != 0)) {
    return usage_error("give --layer or --n/--k, not both");
  }
  if (layer.empty() && (n < 1 || k < 2 || k > kMaxK)) {
    return usage_error(absl::StrCat("need --layer, or --n >= 1 and 2 <= --k <= ", kMaxK));
  }
  if (layer.empty() && n > (int64_t{1} << 34) / k) {  // (k >= 2 here: n * k cannot overflow)
    return usage_error("random layers are limited to 16 GiB");
  }
  auto scheme = parse_scheme(scheme_arg);
  if (!scheme.ok()) return usage_error(scheme.status().message());
  if (m < 0 || m_min < 0 || m_max < 0) return usage_error("--m, --m-min and --m-max must be >= 1");
  if (m > 0 && (m_min > 0 || m_max > 0)) return usage_error("give --m or --m-min/--m-max");
  if (m > 0) {
    c.m_min = c.m_max = m;
  } else if (m_min > 0 || m_max > 0) {
    c.m_min = m_min > 0 ? m_min : 1;
    c.m_max = m_max > 0 ? m_max : c.m_min;
    if (c.m_min > c.m_max) return usage_error("--m-min is above --m-max");
  }
  // A request's x is M x K values in one message of at most 64 MiB (the client's limit). Checked
  // on the M resolved: --m-min alone is the largest M too, and M x K must not overflow.
  constexpr int64_t kMaxM = int64_t{1} << 24;
  if (c.m_max > kMaxM) {
    return usage_error(absl::StrCat("--m, --m-min and --m-max must be at most ", kMaxM));
  }
  auto xt = parse_dtype(dtype_arg);
  if (!xt.ok()) return usage_error(xt.status().message());
  c.x_dtype = c.y_dtype = *xt;
  if (!output_dtype_arg.empty()) {
    auto yt = parse_dtype(output_dtype_arg);
    if (!yt.ok()) return usage_error(yt.status().message());
    c.y_dtype = *yt;
  }
  if (streams < 1 || streams > 4096) return usage_error("--streams must be in 1..4096");
  // (!(x >= 0 && x <= limit) also refuses NaN, which the number parser accepts.)
  constexpr double kMaxSeconds = 7 * 24 * 3600.0;
  if (requests < 0 || !(duration >= 0 && duration <= kMaxSeconds) ||
      !(warmup >= 0 && warmup <= kMaxSeconds)) {
    return usage_error("--requests must be >= 0, --duration and --warmup in 0..604800 s");
  }
  // A day at most, as --timeout-s: a deadline centuries away would wrap the clock into the past.
  constexpr int64_t kMaxDeadlineMs = 86'400'000;
  if (deadline_ms < 0 || deadline_ms > kMaxDeadlineMs) {
    return usage_error(absl::StrCat("--deadline-ms must be in 0..", kMaxDeadlineMs,
                                    " (a day; 0: --timeout-s), got ", deadline_ms));
  }
  if (requests > 0 && duration > 0) return usage_error("give --duration or --requests, not both");
  if (deadline_ms > 0 && !unary && !echo && !compare_echo) {
    return usage_error("--deadline-ms applies to unary calls (--unary, --echo, --compare-echo)");
  }
  if (inputs < 1) return usage_error("--inputs must be >= 1");
  if (max_batch_rows < -1 || max_queue_delay_us < -1) {
    return usage_error(
        "--max-batch-rows and --max-queue-delay-us must be >= -1 (-1: the server's default)");
  }
  if (!layer.empty() && (max_batch_rows >= 0 || max_queue_delay_us >= 0)) {
    return usage_error("--max-batch-rows/--max-queue-delay-us apply to the random layer only");
  }
  c.server = *args.server;
  c.transport = client_options(args);
  c.transport.max_message_mb = kMaxMessageMb;
  c.workers = streams;
  c.unary = unary;
  c.shared_channel = shared_channel;
  c.warmup_s = warmup;
  c.requests = requests;
  c.duration_s = requests > 0 ? 0 : (duration > 0 ? duration : 10);
  c.deadline_ms = deadline_ms;
  c.timeout = args.timeout;
  c.variants = inputs;
  c.seed = static_cast<uint64_t>(seed);

  // --- the layer -------------------------------------------------------------------------------
  auto client = make_client(args);
  // One short call first, as the other commands' first call: a server that cannot be reached
  // fails the command here with gRPC's own reason (a refused port at once, a TLS mismatch with
  // fail()'s hint), before any input is made.
  if (absl::StatusOr<bool> serving = client->health(); !serving.ok()) {
    return fail(serving.status());
  }
  std::vector<Rpc> plan;
  if (!echo) plan.push_back(unary ? Rpc::kUnary : Rpc::kStream);
  if (echo || compare_echo) plan.push_back(Rpc::kEcho);
  if (!layer.empty()) {
    auto info = client->describe_layer(layer);
    if (!info.ok()) return fail(info.status());
    c.layer = layer;
    c.n = info->n();
    c.k = info->k();
    c.layer_note =
        absl::StrCat("existing, ", scheme_cli_name(info->scheme()), ", ", batching_note(*info));
  } else {
    c.n = n;
    c.k = k;
    c.layer = absl::StrCat("bench-", layer_name_suffix());
  }
  // Every request must fit a message (protobuf's serializer aborts on one over 2 GiB): checked
  // before anything is made or uploaded.
  for (Rpc rpc : plan) {
    if (absl::Status s =
            check_message_size(absl::StrCat("an ", rpc_name(rpc), " request of M=", c.m_max,
                                            " (K=", c.k, ", ", dtype_cli_name(c.x_dtype), ")"),
                               largest_request_bytes(c, rpc), max_send_bytes(kMaxMessageMb),
                               "lower --m or --m-max (bench's messages are at most 1 GiB)");
        !s.ok()) {
      return fail(s);
    }
  }
  // The inputs before the layer: a failure to make them leaves nothing on the server.
  const Inputs activations = make_inputs(c);
  bool uploaded = false;
  // The random layer is unloaded however the command ends (unless --keep): below before the
  // exit status is decided, or on the way out of an exception (out of memory).
  absl::Cleanup unload = [&] {
    if (!uploaded || keep) return;
    if (absl::Status s = client->unload_layer(c.layer); !s.ok()) {
      std::fprintf(stderr, "qlinear-cli: unload %s: %s\n", c.layer.c_str(), s.ToString().c_str());
    }
  };
  // The first Ctrl-C stops the run and reports it; requests still in flight are waited for,
  // and a second Ctrl-C ends the program at once. (Caught from before the upload, so that the
  // layer is unloaded on the way out.)
  const CatchSigint sigint;
  if (layer.empty() && !echo) {
    auto info = upload_random_layer(*client, c, *scheme, max_batch_rows, max_queue_delay_us);
    if (!info.ok()) return fail(info.status());
    uploaded = true;
    c.layer_note = absl::StrCat("random, ", scheme_cli_name(*scheme), ", ", batching_note(*info));
  }
  if (echo || compare_echo) {
    // One small call first, so that a server without --enable-echo gets a clear message.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::EchoRequest req;
    v1::EchoResponse resp;
    if (grpc::Status s = client->stub().Echo(&ctx, req, &resp); !s.ok()) {
      return fail(from_grpc_status(s));
    }
  }

  // --- the passes ------------------------------------------------------------------------------
  std::vector<PassResult> passes;
  absl::Status pass_error;
  {
    for (size_t i = 0; i < plan.size() && !sigint_received(); ++i) {
      auto r = run_pass(c, activations, plan[i]);
      if (!r.ok()) {
        pass_error = r.status();
        break;
      }
      if (!passes.empty()) std::printf("\n");
      print_pass(c, *r);
      passes.push_back(*std::move(r));
    }
  }
  if (passes.size() == 2) {
    std::printf("\n");
    print_overhead(passes[0], passes[1]);
  }
  std::fflush(stdout);
  std::move(unload).Invoke();
  if (!pass_error.ok()) return fail(pass_error);
  if (passes.empty() && sigint_received()) {
    std::fprintf(stderr, "qlinear-cli: interrupted (Ctrl-C) before the first pass\n");
    return kExitFailure;
  }
  for (const PassResult& r : passes) {
    if (r.ok > 0) continue;
    if (r.errors.empty()) {
      return fail(absl::UnavailableError(
          absl::StrCat("no ", rpc_name(r.rpc), " request completed in the measured time")));
    }
    const auto& [code, e] = *r.errors.begin();
    return fail(absl::Status(
        code == kBadResponse ? absl::StatusCode::kInternal : static_cast<absl::StatusCode>(code),
        absl::StrCat("every ", rpc_name(r.rpc), " request failed; first: ", e.first_message)));
  }
  return kExitOk;
}

}  // namespace qlinear::cli
