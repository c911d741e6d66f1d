// Dynamic batching, back-pressure, deadlines and cancellation in the serving core, driven
// directly through Engine (no transport), plus the metrics those paths record.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/core/engine.h"
#include "tests/server/test_util.h"
#include "tests/thread_limit.h"

namespace qlinear {
namespace {

using testing::make_test_layer;
using testing::random_x;
using testing::reference_y;
using testing::TestLayer;

uint64_t test_seed() {
  if (const char* s = std::getenv("QLINEAR_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  static const uint64_t seed = std::random_device{}();
  return seed;
}

// A kernel that blocks until released, so tests can hold the queue in a known state.
class GateKernel final : public Kernel {
 public:
  struct Gate {
    absl::Mutex mu;
    bool open = true;
    int releases = 0;  // runs let through while closed (release_one)
    int running = 0;
    int want = 0;  // wait_running's target
    std::vector<int64_t> batch_rows;
    std::string device = "cpu";                 // where the prepared kernel says it runs
    std::vector<std::thread::id> destroyed_on;  // each prepared copy's, as it is destroyed
  };
  explicit GateKernel(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
  absl::string_view name() const override { return "cpu.amx"; }  // the first CPU slot in the order
  absl::Status is_supported(const HostInfo&) const override { return absl::OkStatus(); }
  absl::Status can_implement(const LayerConfig&, const ProblemShape&) const override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(const LayerWeights& w) const override {
    return std::unique_ptr<PreparedKernel>(new Prepared(w, gate_));
  }

 private:
  class Prepared final : public PreparedKernel {
   public:
    Prepared(const LayerWeights& w, std::shared_ptr<Gate> g) : w_(w), gate_(std::move(g)) {}
    ~Prepared() override {
      absl::MutexLock lock(&gate_->mu);
      gate_->destroyed_on.push_back(std::this_thread::get_id());
    }
    std::string device() const override { return gate_->device; }
    absl::Status run(const RunArgs& args, RunTimings* t) const override {
      {
        absl::MutexLock lock(&gate_->mu);
        gate_->running++;
        gate_->batch_rows.push_back(args.m);
        gate_->mu.Await(absl::Condition(
            +[](Gate* g) { return g->open || g->releases > 0; }, gate_.get()));
        if (!gate_->open) --gate_->releases;
        gate_->running--;
      }
      return reference::w8a8_linear(w_, args, t);
    }

   private:
    const LayerWeights& w_;
    std::shared_ptr<Gate> gate_;
  };
  std::shared_ptr<Gate> gate_;
};

// A request on layer "b"; `x` must outlive it.
InferInput input_for(const std::string& x, int64_t m, DType x_dtype, DType y_dtype) {
  InferInput in;
  in.layer = "b";
  in.x_dtype = x_dtype;
  in.y_dtype = y_dtype;
  in.m = m;
  in.x = x;
  return in;
}

class BatcherTest : public ::testing::Test {
 protected:
  void start(BatchOptions batching, bool gated = false, const std::string& device = "cpu") {
    gate_ = std::make_shared<GateKernel::Gate>();
    gate_->device = device;
    if (gated) {
      (void)registry_.add(std::make_unique<GateKernel>(gate_));
    }
    ASSERT_EQ(register_builtin_kernels(&registry_), absl::OkStatus());
    EngineOptions eo;
    eo.batching = batching;
    engine_ = std::make_unique<Engine>(registry_, host_info(), eo, &metrics_);
    layer_ = make_test_layer("b", 40, 96, Scheme::kDynamicAsymmetric, true, test_seed());
    LoadRequest r;
    r.name = "b";
    r.spec = layer_.spec;
    auto loaded = engine_->load(r, layer_.weights);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
  }
  void set_gate(bool open) {
    absl::MutexLock lock(&gate_->mu);
    gate_->open = open;
  }
  // With the gate closed: lets one run held there through.
  void release_one() {
    absl::MutexLock lock(&gate_->mu);
    ++gate_->releases;
  }
  // Waits until the kernel has been entered `n` times since the gate was made.
  void wait_entered(size_t n) {
    std::pair<GateKernel::Gate*, size_t> want(gate_.get(), n);
    absl::MutexLock lock(&gate_->mu);
    gate_->mu.Await(absl::Condition(
        +[](std::pair<GateKernel::Gate*, size_t>* a) {
          return a->first->batch_rows.size() >= a->second;
        },
        &want));
  }
  void wait_running(int n) {
    absl::MutexLock lock(&gate_->mu);
    gate_->want = n;
    gate_->mu.Await(absl::Condition(
        +[](GateKernel::Gate* g) { return g->running >= g->want; }, gate_.get()));
  }
  // With the gate closed: a thread whose request of two rows is held in the kernel once this
  // returns (it expects success once the gate opens).
  std::thread hold_one_batch() {
    std::thread held([this] {
      SplitMix64 rng(test_seed());
      const std::string x = random_x(rng, 2, 96, DType::kBF16);
      const InferInput in = input_for(x, 2, DType::kBF16, DType::kBF16);
      std::string y;
      InferOutput out;
      EXPECT_TRUE(engine_->infer(in, CallContext{}, &y, &out).ok());
    });
    wait_running(1);
    return held;
  }
  // Holds a request of one row of `layer` in the kernel, queues requests of ms[i] rows behind it
  // in that order, then opens the gate. Returns the rows of each call the kernel ran after the
  // held one; request i's output in (*outs)[i].
  std::vector<int64_t> run_queued(const std::string& layer, const std::vector<int64_t>& ms,
                                  std::vector<InferOutput>* outs) {
    SplitMix64 rng(test_seed() + ms.size());
    std::vector<int64_t> rows = {1};
    rows.insert(rows.end(), ms.begin(), ms.end());
    std::vector<std::string> xs;
    for (int64_t m : rows) xs.push_back(random_x(rng, m, 96, DType::kBF16));
    std::vector<InferInput> ins;
    for (size_t i = 0; i < rows.size(); ++i) {
      ins.push_back(input_for(xs[i], rows[i], DType::kBF16, DType::kBF16));
      ins.back().layer = layer;
      ins.back().forced_kernel = "cpu.amx";  // the gate, whatever the load ranked first
    }
    std::vector<std::string> ys(rows.size());
    std::vector<InferOutput> all(rows.size());
    std::vector<absl::Status> statuses(rows.size());
    {
      absl::MutexLock lock(&gate_->mu);
      gate_->batch_rows.clear();
    }
    set_gate(false);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < rows.size(); ++i) {
      threads.emplace_back(
          [&, i] { statuses[i] = engine_->infer(ins[i], CallContext{}, &ys[i], &all[i]); });
      if (i == 0) wait_running(1);
      while ((*engine_->store().get(layer))->queue->depth() < static_cast<int64_t>(i)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    set_gate(true);
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_TRUE(statuses[i].ok()) << i << ": " << statuses[i];
      EXPECT_EQ(ys[i], reference_y(layer_, xs[i], DType::kBF16, rows[i], DType::kBF16)) << i;
    }
    outs->assign(all.begin() + 1, all.end());
    absl::MutexLock lock(&gate_->mu);
    if (gate_->batch_rows.empty() || gate_->batch_rows.front() != 1) {
      ADD_FAILURE() << "the held request did not run first in the kernel";
      return std::vector<int64_t>();
    }
    return std::vector<int64_t>(gate_->batch_rows.begin() + 1, gate_->batch_rows.end());
  }
  int64_t queue_depth() { return (*engine_->store().get("b"))->queue->depth(); }
  // Waits up to 10 s for the layer's queue to hold `n` requests; false if it never did.
  bool queue_reaches(int64_t n) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (queue_depth() < n) {
      if (std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
  // With the gate closed: three threads infer `in`, one running (held at the gate) and two
  // queued, once this returns; each counts its success in *ok. `in` and *ok must outlive them.
  std::vector<std::thread> hold_one_and_queue_two(const InferInput& in, std::atomic<int>* ok) {
    std::vector<std::thread> held;
    for (int i = 0; i < 3; ++i) {
      held.emplace_back([this, &in, ok] {
        std::string y;
        InferOutput out;
        if (engine_->infer(in, CallContext{}, &y, &out).ok()) ++*ok;
      });
      if (i == 0) wait_running(1);
    }
    while (queue_depth() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return held;
  }

  Registry registry_;
  Metrics metrics_;
  std::unique_ptr<Engine> engine_;
  TestLayer layer_;
  std::shared_ptr<GateKernel::Gate> gate_;
};

#define SEED_TRACE() SCOPED_TRACE("QLINEAR_TEST_SEED=" + std::to_string(test_seed()))

// The engine tells the watched batch that has run longest (a watchdog's input), on the caller's
// thread and on the worker's, and none once it is done; a layer on the CPU is not watched.
TEST_F(BatcherTest, LongestRunningBatchIsTheOneHeldOnAGpuLayer) {
  for (const bool worker : {false, true}) {
    for (const std::string device : {"cuda:0", "cpu"}) {
      SCOPED_TRACE(std::string(worker ? "worker" : "caller") + " thread, " + device);
      BatchOptions b;
      b.max_queue_delay_us = worker ? 1000 : 0;  // a delay sends every request to the worker
      start(b, /*gated=*/true, device);
      EXPECT_FALSE(engine_->longest_running_batch().has_value());
      set_gate(false);
      std::thread held = hold_one_batch();
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      const std::optional<Engine::RunningBatch> running = engine_->longest_running_batch();
      if (device == "cpu") {
        EXPECT_FALSE(running.has_value());
      } else {
        ASSERT_TRUE(running.has_value());
        EXPECT_EQ(running->layer, "b");
        EXPECT_GE(running->running, std::chrono::milliseconds(30));
        EXPECT_LT(running->running, std::chrono::seconds(30));
      }
      set_gate(true);
      held.join();
      // (The worker clears its stamp just after it answers.)
      for (int i = 0; i < 1000 && engine_->longest_running_batch().has_value(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_FALSE(engine_->longest_running_batch().has_value());
      engine_.reset();
      registry_ = Registry();
    }
  }
}

// The last batch of a layer replaced or unloaded while it runs stays watched until it ends (a
// kernel stuck there holds the GPU, whatever the store holds now), named as retired.
TEST_F(BatcherTest, ARetiredLayersRunningBatchIsStillWatched) {
  SEED_TRACE();
  start(BatchOptions{}, /*gated=*/true, "cuda:0");
  set_gate(false);
  std::thread held = hold_one_batch();
  std::optional<Engine::RunningBatch> running = engine_->longest_running_batch();
  ASSERT_TRUE(running.has_value());
  EXPECT_EQ(running->layer, "b");
  EXPECT_FALSE(running->retired);

  LoadRequest r;
  r.name = "b";
  r.spec = layer_.spec;
  r.replace = true;
  {
    auto replaced = engine_->load(r, layer_.weights);  // (its result holds the new layer)
    ASSERT_TRUE(replaced.ok()) << replaced.status();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  running = engine_->longest_running_batch();
  ASSERT_TRUE(running.has_value());
  EXPECT_EQ(running->layer, "b");
  EXPECT_TRUE(running->retired);
  EXPECT_GE(running->running, std::chrono::milliseconds(20));
  ASSERT_TRUE(engine_->unload("b").ok());
  running = engine_->longest_running_batch();
  ASSERT_TRUE(running.has_value());
  EXPECT_TRUE(running->retired);

  set_gate(true);
  held.join();
  for (int i = 0; i < 1000 && engine_->longest_running_batch().has_value(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(engine_->longest_running_batch().has_value());
  // The watched list lets go of destroyed layers, also where nothing reads it: 50 replaces leave
  // the layer loaded and at most the one replaced last.
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(engine_->load(r, layer_.weights).ok());
  EXPECT_LE(engine_->watched_layers(), 2u);
}

TEST_F(BatcherTest, BatchedResultsAreBitIdenticalToUnbatched) {
  SEED_TRACE();
  BatchOptions b;
  b.max_batch_rows = 64;
  b.max_queue_delay_us = 2000;
  start(b);
  const DType dtypes[] = {DType::kF32, DType::kBF16};
  std::atomic<int> mismatches{0}, sa_mismatches{0}, azp_mismatches{0}, failures{0}, batched{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      SplitMix64 rng(test_seed() + t);
      for (int i = 0; i < 15; ++i) {
        const int64_t m = rng.range(1, 12);
        const DType xd = dtypes[rng.range(0, 1)];
        const DType yd = dtypes[rng.range(0, 1)];
        const std::string x = random_x(rng, m, 96, xd);
        const InferInput in = input_for(x, m, xd, yd);
        std::string y;
        InferOutput out;
        absl::Status s = engine_->infer(in, CallContext{}, &y, &out);
        if (!s.ok()) {
          ++failures;
          continue;
        }
        if (y != reference_y(layer_, x, xd, m, yd)) ++mismatches;
        if (out.batch_requests > 1) ++batched;
        // Each request's own rows of the batch's sa and azp (the layer is dynamic asymmetric),
        // bit for bit.
        std::vector<int8_t> xq(static_cast<size_t>(m * 96));
        std::vector<float> sa(static_cast<size_t>(m));
        std::vector<int32_t> azp(static_cast<size_t>(m));
        if (!reference::quantize_activations(layer_config_of(layer_.spec), x.data(), xd, m,
                                             xq.data(), sa.data(), azp.data())
                 .ok()) {
          ++failures;
          continue;
        }
        if (out.sa.size() != sa.size() ||
            std::memcmp(out.sa.data(), sa.data(), sa.size() * sizeof(float)) != 0) {
          ++sa_mismatches;
        }
        if (out.azp != azp) ++azp_mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(sa_mismatches.load(), 0);
  EXPECT_EQ(azp_mismatches.load(), 0);
  EXPECT_GT(batched.load(), 0) << "no request was ever coalesced";
}

// Requests queued behind a running batch are coalesced into batches of at most max_batch_rows
// rows: the head and every later request that still fits, in queue order. Each request's
// batch_requests and batch_rows are those of the batch it ran in, whose rows the kernel ran as one
// call. A layer loaded with max_batch_rows = 1 (its own setting, under the server's 8) never
// coalesces.
TEST_F(BatcherTest, BatchesStayWithinMaxBatchRows) {
  SEED_TRACE();
  BatchOptions b;
  b.max_batch_rows = 8;
  start(b, /*gated=*/true);
  LoadRequest one;
  one.name = "one";
  one.spec = layer_.spec;
  one.max_batch_rows = 1;
  ASSERT_TRUE(engine_->load(one, layer_.weights).ok());
  // 3 + 4 + 1 (the 2 would make 9), 2 + 5 (the 3 would make 10), 3 + 2, then the 6 alone.
  const std::vector<int64_t> ms = {3, 4, 2, 1, 5, 3, 2, 6};
  const std::vector<int> batch_of = {0, 0, 1, 0, 1, 2, 2, 3};
  std::vector<int64_t> batch_rows(4, 0), batch_requests(4, 0);
  for (size_t i = 0; i < ms.size(); ++i) {
    batch_rows[batch_of[i]] += ms[i];
    batch_requests[batch_of[i]] += 1;
  }
  std::vector<InferOutput> outs;
  const std::vector<int64_t> ran = run_queued("b", ms, &outs);
  EXPECT_EQ(ran, batch_rows);
  for (int64_t r : ran) EXPECT_LE(r, 8);
  bool coalesced = false;
  for (size_t i = 0; i < ms.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " of ", ms[i], " rows"));
    EXPECT_EQ(outs[i].batch_requests, batch_requests[batch_of[i]]);
    EXPECT_EQ(outs[i].batch_rows, batch_rows[batch_of[i]]);
    EXPECT_LE(outs[i].batch_rows, 8);
    coalesced = coalesced || outs[i].batch_requests > 1;
  }
  EXPECT_TRUE(coalesced);

  const std::vector<int64_t> alone = {2, 1, 3};
  EXPECT_EQ(run_queued("one", alone, &outs), alone);
  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_EQ(outs[i].batch_requests, 1) << i;
    EXPECT_EQ(outs[i].batch_rows, alone[i]) << i;
  }
}

// Batches also stay within max_batch_bytes of x and y together (a layer's rows of 96 bf16 values
// in and 40 out: 272 bytes; five fit here), taking what fits in queue order; a request over the
// budget runs alone.
TEST_F(BatcherTest, BatchesStayWithinMaxBatchBytes) {
  SEED_TRACE();
  BatchOptions b;
  b.max_batch_rows = 64;
  b.max_batch_bytes = 5 * (96 + 40) * 2 + 100;
  start(b, /*gated=*/true);
  // 3 + 2 (the 4 would make 9 rows, the 1 then 6), 4 + 1, then the 6 alone.
  std::vector<InferOutput> outs;
  EXPECT_EQ(run_queued("b", {3, 2, 4, 1, 6}, &outs), (std::vector<int64_t>{5, 5, 6}));
  const std::vector<int64_t> batch_rows = {5, 5, 5, 5, 6};
  ASSERT_EQ(outs.size(), batch_rows.size());
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_EQ(outs[i].batch_rows, batch_rows[i]) << i;
}

TEST_F(BatcherTest, QueueFullIsResourceExhausted) {
  BatchOptions b;
  b.max_batch_rows = 1;
  b.max_queue_requests = 2;
  start(b, /*gated=*/true);
  set_gate(false);
  SplitMix64 rng(1);
  const std::string x = random_x(rng, 1, 96, DType::kF32);
  const InferInput in = input_for(x, 1, DType::kF32, DType::kF32);
  // One running (held at the gate) and two queued fill the layer.
  std::atomic<int> ok{0};
  std::vector<std::thread> held = hold_one_and_queue_two(in, &ok);
  std::string y;
  InferOutput out;
  absl::Status s = engine_->infer(in, CallContext{}, &y, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("queue of layer 'b' is full"), absl::string_view::npos) << s;
  set_gate(true);
  for (auto& th : held) th.join();
  EXPECT_EQ(ok.load(), 3);
  EXPECT_NE(metrics_.serialize().find("qlinear_request_failures_total"), std::string::npos);
}

// Expired and cancelled requests are answered before compute; one both past its deadline and
// cancelled (as the transport reports a call whose deadline passed) is DEADLINE_EXCEEDED.
TEST_F(BatcherTest, ExpiredAndCancelledRequestsNeverReachTheKernel) {
  BatchOptions b;
  b.max_batch_rows = 1;
  start(b, /*gated=*/true);
  set_gate(false);
  SplitMix64 rng(2);
  const std::string x = random_x(rng, 1, 96, DType::kF32);
  const InferInput in = input_for(x, 1, DType::kF32, DType::kF32);
  std::thread blocker([&] {
    std::string y;
    InferOutput out;
    EXPECT_TRUE(engine_->infer(in, CallContext{}, &y, &out).ok());
  });
  wait_running(1);
  CallContext expiring;
  expiring.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  CallContext cancelled;
  std::atomic<bool> cancel{false};
  cancelled.is_cancelled = [&] { return cancel.load(); };
  CallContext both;
  both.deadline = expiring.deadline;
  both.is_cancelled = [&] { return std::chrono::steady_clock::now() >= both.deadline; };
  absl::Status s1, s2, s3;
  std::thread t1([&] {
    std::string y;
    InferOutput out;
    s1 = engine_->infer(in, expiring, &y, &out);
  });
  std::thread t2([&] {
    std::string y;
    InferOutput out;
    s2 = engine_->infer(in, cancelled, &y, &out);
  });
  std::thread t3([&] {
    std::string y;
    InferOutput out;
    s3 = engine_->infer(in, both, &y, &out);
  });
  while (queue_depth() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  cancel = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(40));  // past the deadline
  set_gate(true);
  blocker.join();
  t1.join();
  t2.join();
  t3.join();
  EXPECT_EQ(s1.code(), absl::StatusCode::kDeadlineExceeded) << s1;
  EXPECT_NE(s1.message().find("before compute"), absl::string_view::npos);
  EXPECT_EQ(s2.code(), absl::StatusCode::kCancelled) << s2;
  EXPECT_EQ(s3.code(), absl::StatusCode::kDeadlineExceeded) << s3;
  absl::MutexLock lock(&gate_->mu);
  EXPECT_EQ(gate_->batch_rows.size(), 1u) << "a dropped request reached the kernel";
}

// A queued request leaves the queue at its deadline, or when its call is cancelled, while the batch
// ahead of it still runs: neither its thread nor a server's drain waits for that batch.
TEST_F(BatcherTest, AQueuedRequestLeavesAtItsDeadlineOrCancellation) {
  BatchOptions b;
  b.max_batch_rows = 1;
  start(b, /*gated=*/true);
  set_gate(false);
  std::thread held = hold_one_batch();
  SplitMix64 rng(9);
  const std::string x = random_x(rng, 1, 96, DType::kF32);
  const InferInput in = input_for(x, 1, DType::kF32, DType::kF32);
  // The cancellable request first, so that both are queued together however late the threads
  // start: the expiring one's deadline is 1 s after its own start.
  CallContext cancelled;
  std::atomic<bool> cancel{false};
  cancelled.is_cancelled = [&] { return cancel.load(); };
  CallContext expiring;
  absl::Status s1, s2;
  std::atomic<bool> done1{false}, done2{false};
  std::chrono::steady_clock::time_point returned1;
  std::thread t2([&] {
    std::string y;
    InferOutput out;
    s2 = engine_->infer(in, cancelled, &y, &out);
    done2 = true;
  });
  ASSERT_TRUE(queue_reaches(1)) << "the cancellable request was never queued";
  std::thread t1([&] {
    std::string y;
    InferOutput out;
    expiring.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    s1 = engine_->infer(in, expiring, &y, &out);
    returned1 = std::chrono::steady_clock::now();
    done1 = true;
  });
  const bool both_queued = queue_reaches(2);
  cancel = true;
  auto answered_within = [](const std::atomic<bool>& done, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!done && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return done.load();
  };
  const bool cancelled_left = answered_within(done2, 5.0);
  const bool expired_left = answered_within(done1, 5.0);
  const int64_t depth = queue_depth();
  set_gate(true);  // the batch ahead ends only now
  held.join();
  t1.join();
  t2.join();
  EXPECT_TRUE(both_queued);
  EXPECT_TRUE(cancelled_left) << "the cancelled request waited for the batch ahead of it";
  EXPECT_TRUE(expired_left) << "the expired request waited for the batch ahead of it";
  EXPECT_EQ(depth, 0);
  EXPECT_EQ(s1.code(), absl::StatusCode::kDeadlineExceeded) << s1;
  EXPECT_NE(s1.message().find("in the queue, before compute"), absl::string_view::npos) << s1;
  EXPECT_GE(returned1, expiring.deadline) << "left before its deadline";
  EXPECT_EQ(s2.code(), absl::StatusCode::kCancelled) << s2;
  EXPECT_EQ(s2.message(), "request cancelled while queued");
  absl::MutexLock lock(&gate_->mu);
  EXPECT_EQ(gate_->batch_rows.size(), 1u) << "a request that left reached the kernel";
}

// The request the worker waits for company with may leave the queue meanwhile; the worker then
// waits with the next one, which is answered.
TEST_F(BatcherTest, TheHeadLeavingWhileTheWorkerWaitsForCompany) {
  BatchOptions b;
  b.max_batch_rows = 64;
  b.max_queue_delay_us = 2'000'000;
  start(b);
  SEED_TRACE();
  SplitMix64 rng(test_seed());
  const std::string x = random_x(rng, 1, 96, DType::kF32);
  const InferInput in = input_for(x, 1, DType::kF32, DType::kF32);
  CallContext cancelled;
  std::atomic<bool> cancel{false};
  cancelled.is_cancelled = [&] { return cancel.load(); };
  absl::Status head_status;
  std::thread head([&] {
    std::string y;
    InferOutput out;
    head_status = engine_->infer(in, cancelled, &y, &out);
  });
  const bool head_queued = queue_reaches(1);
  std::string y;
  InferOutput out;
  absl::Status second_status;
  std::thread second([&] { second_status = engine_->infer(in, CallContext{}, &y, &out); });
  const bool both_queued = queue_reaches(2);
  cancel = true;
  head.join();
  second.join();
  ASSERT_TRUE(head_queued && both_queued) << "the requests were not queued within 10 s";
  EXPECT_EQ(head_status.code(), absl::StatusCode::kCancelled) << head_status;
  ASSERT_TRUE(second_status.ok()) << second_status;
  EXPECT_EQ(out.batch_requests, 1);
  EXPECT_EQ(y, reference_y(layer_, x, DType::kF32, 1, DType::kF32))
      << "the second request's answer";
}

// Waiting for company stops ahead of a queued request's deadline (by the layer's last batch time
// and 20 ms), so that the request runs and is answered in time, not when the queue delay (here
// 5 s) ends, nor failed at its deadline.
TEST_F(BatcherTest, WaitingForCompanyEndsAtAQueuedRequestsDeadline) {
  BatchOptions b;
  b.max_batch_rows = 64;
  b.max_queue_delay_us = 5'000'000;
  start(b);
  SplitMix64 rng(8);
  const std::string x = random_x(rng, 1, 96, DType::kF32);
  const InferInput in = input_for(x, 1, DType::kF32, DType::kF32);
  CallContext call;
  call.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  std::string y;
  InferOutput out;
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status s = engine_->infer(in, call, &y, &out);
  const double waited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(y, reference_y(layer_, x, DType::kF32, 1, DType::kF32));
  EXPECT_LT(waited_s, 0.3) << "answered after its deadline";
  EXPECT_GT(waited_s, 0.15) << "did not wait for company";

  // One that arrives while the head waits, with a deadline before the head's delay ends, too.
  absl::Status head_status;
  std::thread head([&] {
    std::string hy;
    InferOutput hout;
    head_status = engine_->infer(in, CallContext{}, &hy, &hout);
  });
  while (queue_depth() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CallContext late;
  late.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  const auto t1 = std::chrono::steady_clock::now();
  const absl::Status s2 = engine_->infer(in, late, &y, &out);
  const double waited2_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  head.join();
  EXPECT_TRUE(s2.ok()) << s2;
  EXPECT_LT(waited2_s, 0.3) << "answered after its deadline";
  EXPECT_EQ(out.batch_requests, 2) << "not run with the head";
  EXPECT_TRUE(head_status.ok()) << head_status;
}

TEST_F(BatcherTest, BadRowInABatchFailsOnlyItsRequest) {
  BatchOptions b;
  b.max_batch_rows = 64;
  start(b, /*gated=*/true);
  set_gate(false);
  SplitMix64 rng(3);
  const std::string good = random_x(rng, 2, 96, DType::kF32);
  std::string bad = random_x(rng, 3, 96, DType::kF32);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(bad.data() + 4 * (96 * 2 + 7), &inf, 4);  // row 2 of the bad request
  auto make = [](const std::string& x, int64_t m) {
    return input_for(x, m, DType::kF32, DType::kBF16);
  };
  // Hold the worker so both requests queue up and run as one batch.
  InferInput first = make(good, 2);
  std::thread blocker([&] {
    std::string y;
    InferOutput out;
    EXPECT_TRUE(engine_->infer(first, CallContext{}, &y, &out).ok());
  });
  wait_running(1);
  absl::Status sg, sb;
  std::string yg;
  InferOutput og;
  InferInput ig = make(good, 2), ib = make(bad, 3);
  std::thread tg([&] { sg = engine_->infer(ig, CallContext{}, &yg, &og); });
  std::thread tb([&] {
    std::string y;
    InferOutput o;
    sb = engine_->infer(ib, CallContext{}, &y, &o);
  });
  while (queue_depth() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  set_gate(true);
  blocker.join();
  tg.join();
  tb.join();
  EXPECT_TRUE(sg.ok()) << sg;
  EXPECT_EQ(yg, reference_y(layer_, good, DType::kF32, 2, DType::kBF16));
  EXPECT_EQ(sb.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sb.message().find("x row 2 holds a non-finite value"), absl::string_view::npos) << sb;
}

// A batch failed by one request's non-finite row costs the others one more run together, not one
// run each: the bad request runs alone (its answer names its row) and the rest run as one batch.
TEST_F(BatcherTest, ABatchFailedByABadRowRunsTheOthersTogether) {
  BatchOptions b;
  b.max_batch_rows = 64;
  start(b, /*gated=*/true);
  SplitMix64 rng(test_seed());
  SEED_TRACE();
  const std::string g1 = random_x(rng, 2, 96, DType::kF32), g2 = random_x(rng, 1, 96, DType::kF32);
  std::string bad = random_x(rng, 3, 96, DType::kF32);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + 4 * (96 * 1 + 50), &nan, 4);  // row 1 of the bad request
  std::vector<int64_t> ms = {2, 3, 1};
  std::vector<InferInput> ins = {input_for(g1, 2, DType::kF32, DType::kBF16),
                                 input_for(bad, 3, DType::kF32, DType::kBF16),
                                 input_for(g2, 1, DType::kF32, DType::kBF16)};
  std::vector<absl::Status> st(3);
  std::vector<std::string> ys(3);
  std::vector<InferOutput> outs(3);
  set_gate(false);
  std::thread blocker = hold_one_batch();
  std::vector<std::thread> th;
  for (int i = 0; i < 3; ++i) {
    th.emplace_back([&, i] { st[i] = engine_->infer(ins[i], CallContext{}, &ys[i], &outs[i]); });
    ASSERT_TRUE(queue_reaches(i + 1));
  }
  set_gate(true);
  blocker.join();
  for (auto& t : th) t.join();
  EXPECT_EQ(st[1].code(), absl::StatusCode::kInvalidArgument) << st[1];
  EXPECT_NE(st[1].message().find("x row 1 holds a non-finite value"), absl::string_view::npos)
      << st[1];
  for (int i : {0, 2}) {
    ASSERT_TRUE(st[i].ok()) << i << ": " << st[i];
    EXPECT_EQ(ys[i], reference_y(layer_, i == 0 ? g1 : g2, DType::kF32, ms[i], DType::kBF16));
    EXPECT_EQ(outs[i].batch_requests, 2) << i << ": not run together again";
    EXPECT_EQ(outs[i].batch_rows, 3) << i;
  }
  absl::MutexLock lock(&gate_->mu);
  EXPECT_EQ(gate_->batch_rows, (std::vector<int64_t>{2, 6, 3, 3}))
      << "the kernel's calls: the held one, the failed batch, the bad request, the good ones";
}

// After a failed batch, a request whose deadline passed meanwhile is answered DEADLINE_EXCEEDED
// and never reaches the kernel again.
TEST_F(BatcherTest, ARequestThatExpiredInAFailedBatchIsNotRunAgain) {
  BatchOptions b;
  b.max_batch_rows = 64;
  start(b, /*gated=*/true);
  SplitMix64 rng(test_seed());
  SEED_TRACE();
  const std::string good = random_x(rng, 1, 96, DType::kF32);
  std::string bad = random_x(rng, 1, 96, DType::kF32);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(bad.data() + 4 * 5, &inf, 4);
  const InferInput ib = input_for(bad, 1, DType::kF32, DType::kF32);
  const InferInput ig = input_for(good, 1, DType::kF32, DType::kF32);
  set_gate(false);
  std::thread blocker = hold_one_batch();
  absl::Status sb, sg;
  CallContext soon;
  // (Far enough that the request is still live when the batch starts on a loaded host.)
  soon.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  std::thread tb([&] {
    std::string y;
    InferOutput o;
    sb = engine_->infer(ib, CallContext{}, &y, &o);
  });
  ASSERT_TRUE(queue_reaches(1));
  std::thread tg([&] {
    std::string y;
    InferOutput o;
    sg = engine_->infer(ig, soon, &y, &o);
  });
  ASSERT_TRUE(queue_reaches(2));
  release_one();  // the held request; the batch of both then enters the kernel and is held
  wait_entered(2);
  std::this_thread::sleep_until(soon.deadline + std::chrono::milliseconds(50));
  set_gate(true);
  blocker.join();
  tb.join();
  tg.join();
  EXPECT_EQ(sb.code(), absl::StatusCode::kInvalidArgument) << sb;
  EXPECT_EQ(sg.code(), absl::StatusCode::kDeadlineExceeded) << sg;
  absl::MutexLock lock(&gate_->mu);
  EXPECT_EQ(gate_->batch_rows, (std::vector<int64_t>{2, 2, 1}))
      << "the kernel's calls: the held one, the failed batch, the bad request alone";
}

TEST_F(BatcherTest, QueuedWorkFinishesAfterUnload) {
  BatchOptions b;
  b.max_batch_rows = 1;
  start(b, /*gated=*/true);
  set_gate(false);
  SplitMix64 rng(4);
  const std::string x = random_x(rng, 1, 96, DType::kF32);
  const InferInput in = input_for(x, 1, DType::kF32, DType::kF32);
  std::vector<std::thread> th;
  std::atomic<int> ok{0};
  for (int i = 0; i < 3; ++i) {
    th.emplace_back([&] {
      std::string y;
      InferOutput out;
      if (engine_->infer(in, CallContext{}, &y, &out).ok() &&
          y == reference_y(layer_, x, DType::kF32, 1, DType::kF32)) {
        ++ok;
      }
    });
  }
  wait_running(1);
  while (queue_depth() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(engine_->unload("b").ok());
  std::string y;
  InferOutput out;
  EXPECT_EQ(engine_->infer(in, CallContext{}, &y, &out).code(), absl::StatusCode::kNotFound);
  set_gate(true);
  for (auto& t : th) t.join();
  EXPECT_EQ(ok.load(), 3);
}

// Whoever drops the last reference to a replaced or unloaded layer, it is destroyed on the
// engine's release thread (its queue joined, its weights freed), never on a request's; where the
// engine's own reference is the last, the replace or unload frees it before returning.
TEST_F(BatcherTest, ALayersLastReferenceIsDroppedOnTheReleaseThread) {
  start(BatchOptions{}, /*gated=*/true);
  auto destroyed = [this] {
    absl::MutexLock lock(&gate_->mu);
    return gate_->destroyed_on;
  };
  const std::thread::id here = std::this_thread::get_id();
  ASSERT_TRUE(destroyed().empty());
  LoadRequest r;
  r.name = "b";
  r.spec = layer_.spec;
  r.replace = true;
  auto loaded = engine_->load(r, layer_.weights);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // The first layer, held by nothing else, was freed by the replace.
  std::vector<std::thread::id> first = destroyed();
  ASSERT_FALSE(first.empty());
  for (const std::thread::id& t : first) EXPECT_EQ(t, here);
  // The second, unloaded while a holder keeps it, is freed when that one lets go, elsewhere.
  std::shared_ptr<const ServedLayer> holder = std::move(loaded->served);
  ASSERT_TRUE(engine_->unload("b").ok());
  EXPECT_EQ(destroyed().size(), first.size());
  std::thread::id dropper;
  std::thread([&] {
    dropper = std::this_thread::get_id();
    holder.reset();
  }).join();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (destroyed().size() == first.size() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<std::thread::id> all = destroyed();
  ASSERT_GT(all.size(), first.size()) << "the unloaded layer was never destroyed";
  for (size_t i = first.size(); i < all.size(); ++i) {
    EXPECT_NE(all[i], dropper) << "destroyed on the thread that dropped the last reference";
    EXPECT_NE(all[i], here);
  }
  // A layer unloaded with no other holder is freed before the unload returns.
  auto again = engine_->load(r, layer_.weights);
  ASSERT_TRUE(again.ok()) << again.status();
  again->served.reset();
  const size_t before = destroyed().size();
  ASSERT_TRUE(engine_->unload("b").ok());
  all = destroyed();
  ASSERT_GT(all.size(), before);
  for (size_t i = before; i < all.size(); ++i) EXPECT_EQ(all[i], here);
}

// A host at its limit of threads: a load whose batching thread cannot start fails with
// RESOURCE_EXHAUSTED and a clear message, and the layer it would have replaced stays served. Run
// in a child process that may start no further thread.
TEST_F(BatcherTest, ALoadWhoseBatchingThreadCannotStartLeavesTheServedLayer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  start(BatchOptions{});
  SEED_TRACE();
  // (A lambda: the statement holds commas, which EXPECT_EXIT would take as its arguments.)
  const auto give_up_threads_and_replace = [this] {
    if (const std::string why = testing::forbid_new_threads(); !why.empty()) {
      std::fprintf(stderr, "%s\n", why.c_str());
      _exit(2);
    }
    LoadRequest r;
    r.name = "b";
    r.spec = layer_.spec;
    r.replace = true;
    const absl::StatusOr<LoadResult> replaced = engine_->load(r, layer_.weights);
    const std::string message(replaced.status().message());
    if (replaced.status().code() != absl::StatusCode::kResourceExhausted ||
        message.find("layer 'b': its batching thread could not be started") != 0 ||
        message.find("nothing was loaded or replaced") == std::string::npos) {
      std::fprintf(stderr, "load answered %s\n", replaced.status().ToString().c_str());
      _exit(1);
    }
    // A new name fails alike, and takes none of the metrics' layer labels.
    LoadRequest fresh = r;
    fresh.name = "fresh";
    fresh.replace = false;
    const absl::StatusOr<LoadResult> added = engine_->load(fresh, layer_.weights);
    if (added.status().code() != absl::StatusCode::kResourceExhausted ||
        metrics_.serialize().find("layer=\"fresh\"") != std::string::npos) {
      std::fprintf(stderr, "a new layer answered %s, its metrics: %s\n",
                   added.status().ToString().c_str(), metrics_.serialize().c_str());
      _exit(1);
    }
    // The layer loaded before still answers, on the thread it already had.
    SplitMix64 rng(test_seed());
    const std::string x = random_x(rng, 3, 96, DType::kBF16);
    std::string y;
    InferOutput out;
    const absl::Status served =
        engine_->infer(input_for(x, 3, DType::kBF16, DType::kBF16), CallContext{}, &y, &out);
    if (!served.ok() || y != reference_y(layer_, x, DType::kBF16, 3, DType::kBF16)) {
      std::fprintf(stderr, "the served layer answered %s\n", served.ToString().c_str());
      _exit(1);
    }
    std::fprintf(stderr, "load failed as expected: %s\n", message.c_str());
    _exit(0);
  };
  EXPECT_EXIT(give_up_threads_and_replace(), ::testing::ExitedWithCode(0),
              "load failed as expected: layer 'b': its batching thread");
}

// The queue-depth gauge goes with the layer the engine serves: a queue's depth shows through the
// engine, and a replace hands the gauge to the new layer (its queue empty) while the old one's
// queue still holds requests and drains.
TEST_F(BatcherTest, QueueDepthGaugeFollowsTheLoadedLayer) {
  BatchOptions b;
  b.max_batch_rows = 1;
  start(b, /*gated=*/true);
  set_gate(false);
  SplitMix64 rng(6);
  const std::string x = random_x(rng, 1, 96, DType::kF32);
  const InferInput in = input_for(x, 1, DType::kF32, DType::kF32);
  std::atomic<int> ok{0};
  std::vector<std::thread> held = hold_one_and_queue_two(in, &ok);
  std::string text = metrics_.serialize();
  EXPECT_NE(text.find("qlinear_queue_depth{layer=\"b\"} 2\n"), std::string::npos) << text;

  LoadRequest r;
  r.name = "b";
  r.spec = layer_.spec;
  r.replace = true;
  auto replaced = engine_->load(r, layer_.weights);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  text = metrics_.serialize();
  EXPECT_NE(text.find("qlinear_queue_depth{layer=\"b\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("qlinear_layers_loaded 1\n"), std::string::npos) << text;

  set_gate(true);  // the old queue runs its requests and empties
  for (auto& th : held) th.join();
  EXPECT_EQ(ok.load(), 3);
  text = metrics_.serialize();
  EXPECT_NE(text.find("qlinear_queue_depth{layer=\"b\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("qlinear_layers_loaded 1\n"), std::string::npos) << text;
  ASSERT_TRUE(engine_->unload("b").ok());
  text = metrics_.serialize();
  EXPECT_EQ(text.find("qlinear_queue_depth{"), std::string::npos) << text;
  EXPECT_NE(text.find("qlinear_layers_loaded 0\n"), std::string::npos) << text;
}

TEST_F(BatcherTest, MetricsRecordBatchesAndLayers) {
  BatchOptions b;
  start(b);
  SplitMix64 rng(5);
  const std::string x = random_x(rng, 3, 96, DType::kBF16);
  const InferInput in = input_for(x, 3, DType::kBF16, DType::kBF16);
  std::string y;
  InferOutput out;
  ASSERT_TRUE(engine_->infer(in, CallContext{}, &y, &out).ok());
  const std::string text = metrics_.serialize();
  EXPECT_NE(text.find("qlinear_batch_rows_count{layer=\"b\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("qlinear_layers_loaded 1"), std::string::npos) << text;
  EXPECT_NE(text.find("qlinear_layer_bytes{device=\"cpu\",layer=\"b\"}"), std::string::npos)
      << text;
  // The layer's series, found once per layer, count every request; a failed one counts apart.
  ASSERT_TRUE(engine_->infer(in, CallContext{}, &y, &out).ok());
  const std::string kernel = out.kernel;
  const InferInput bad = input_for(x.substr(1), 3, DType::kBF16, DType::kBF16);
  EXPECT_FALSE(engine_->infer(bad, CallContext{}, &y, &out).ok());
  const std::string ok_series =
      "qlinear_requests_total{code=\"OK\",kernel=\"" + kernel + "\",layer=\"b\"} ";
  const std::string twice = metrics_.serialize();
  EXPECT_NE(twice.find(ok_series + "2"), std::string::npos) << twice;
  EXPECT_NE(twice.find("qlinear_rows_total{layer=\"b\"} 6"), std::string::npos) << twice;
  EXPECT_NE(twice.find("qlinear_request_duration_seconds_count{layer=\"b\"} 2"), std::string::npos)
      << twice;
  EXPECT_NE(twice.find("qlinear_queue_duration_seconds_count{layer=\"b\"} 2"), std::string::npos)
      << twice;
  for (const char* phase : {"quantize", "gemm", "copy"}) {
    EXPECT_NE(twice.find("qlinear_compute_duration_seconds_count{kernel=\"" + kernel +
                         "\",layer=\"b\",phase=\"" + phase + "\"} 2"),
              std::string::npos)
        << phase << "\n"
        << twice;
  }
  // A CPU kernel stages no copies: its copy phase holds only zeros.
  EXPECT_NE(twice.find("qlinear_compute_duration_seconds_sum{kernel=\"" + kernel +
                       "\",layer=\"b\",phase=\"copy\"} 0\n"),
            std::string::npos)
      << twice;
  EXPECT_NE(twice.find("qlinear_request_failures_total{layer=\"b\",reason=\"INVALID_ARGUMENT\"} 1"),
            std::string::npos)
      << twice;
  ASSERT_TRUE(engine_->unload("b").ok());
  const std::string after = metrics_.serialize();
  EXPECT_NE(after.find("qlinear_layers_loaded 0"), std::string::npos) << after;
  EXPECT_EQ(after.find("qlinear_layer_bytes{"), std::string::npos) << after;
  // A layer loaded again under the same name goes on counting in the same series.
  LoadRequest r;
  r.name = "b";
  r.spec = layer_.spec;
  ASSERT_TRUE(engine_->load(r, layer_.weights).ok());
  ASSERT_TRUE(engine_->infer(in, CallContext{}, &y, &out).ok());
  const std::string again = metrics_.serialize();
  EXPECT_NE(again.find(ok_series + "3"), std::string::npos) << again;
  EXPECT_NE(again.find("qlinear_rows_total{layer=\"b\"} 9"), std::string::npos) << again;
}

}  // namespace
}  // namespace qlinear
