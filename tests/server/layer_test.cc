// Layer: the kernel choice per M bucket and per request, with autotune (SPEC section 6): each
// bucket's measurable candidates ranked by the time measured at load, unmeasurable ones in the
// priority order, failed measurements skipped with the reason, and request-time choices (with or
// without an explanation) that agree with the ranking. Fake kernels named like the real ones
// return chosen measurements, so these tests run on any host. Also which kernels a layer
// prepares at load (only those it may choose without forcing) and on demand (once, thread-safe).
#include "server/core/layer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/sha256.h"
#include "kernels/core/status.h"
#include "kernels/core/weights.h"
#include "server/core/engine.h"

namespace qlinear {
namespace {

using Measure = std::function<absl::StatusOr<double>(const ProblemShape&)>;
using CanImplement = std::function<absl::Status(const ProblemShape&)>;
// What a fake's prepare returns, given how many times it was called before (0 the first time).
using PrepareResult = std::function<absl::Status(int)>;

// What the fakes saw: measurements (kernel, M, dtypes) and runs (kernel, M).
struct Log {
  absl::Mutex mu;
  std::vector<std::string> measured;  // "kernel M=16 bf16->bf16"
  std::map<std::string, int> runs;
  std::map<std::string, int> prepares;  // calls of Kernel::prepare, failed ones included
  std::map<std::string, int> prepares_with_tuning;  // of those, the ones given a TuningCache
  std::map<std::string, int> prepares_on_demand;    // of those, the ones a request made
  int measure_count(absl::string_view kernel) {
    absl::MutexLock lock(&mu);
    int n = 0;
    for (const std::string& s : measured) n += absl::StartsWith(s, absl::StrCat(kernel, " "));
    return n;
  }
  int run_count(const std::string& kernel) {
    absl::MutexLock lock(&mu);
    return runs[kernel];
  }
  int prepare_count(const std::string& kernel) {
    absl::MutexLock lock(&mu);
    return prepares[kernel];
  }
  int prepare_with_tuning_count(const std::string& kernel) {
    absl::MutexLock lock(&mu);
    return prepares_with_tuning[kernel];
  }
  int prepare_on_demand_count(const std::string& kernel) {
    absl::MutexLock lock(&mu);
    return prepares_on_demand[kernel];
  }
};

Measure fixed_us(double us) {
  return [us](const ProblemShape&) { return absl::StatusOr<double>(us); };
}
Measure unmeasurable() {
  return [](const ProblemShape&) -> absl::StatusOr<double> {
    return absl::UnimplementedError("not measurable; the priority order decides");
  };
}

class FakePrepared final : public PreparedKernel {
 public:
  FakePrepared(std::string name, Measure measure, int64_t extra_bytes, std::string variant,
               int64_t max_measured_m, double margin, std::shared_ptr<Log> log)
      : name_(std::move(name)),
        measure_(std::move(measure)),
        extra_bytes_(extra_bytes),
        variant_(std::move(variant)),
        max_measured_m_(max_measured_m),
        margin_(margin),
        log_(std::move(log)) {}
  int64_t max_measured_m() const override { return max_measured_m_; }
  double measure_margin() const override { return margin_; }
  // "<variant> for M=<m>", or empty when the fake has none.
  std::string variant(int64_t m) const override {
    return variant_.empty() ? "" : absl::StrCat(variant_, " for M=", m);
  }
  int64_t extra_bytes() const override { return extra_bytes_; }
  std::string device() const override {
    return absl::StartsWith(name_, "cuda.") ? "cuda:0" : "cpu";
  }
  absl::Status run(const RunArgs&, RunTimings*) const override {
    absl::MutexLock lock(&log_->mu);
    log_->runs[name_]++;
    return absl::OkStatus();
  }
  absl::StatusOr<double> measure_us(const ProblemShape& s) const override {
    absl::StatusOr<double> us = measure_(s);
    if (!absl::IsUnimplemented(us.status())) {
      absl::MutexLock lock(&log_->mu);
      log_->measured.push_back(
          absl::StrCat(name_, " M=", s.m, " ", dtype_name(s.x_dtype), "->", dtype_name(s.y_dtype)));
    }
    return us;
  }

 private:
  std::string name_;
  Measure measure_;
  int64_t extra_bytes_;
  std::string variant_;
  int64_t max_measured_m_;
  double margin_;
  std::shared_ptr<Log> log_;
};

class FakeKernel final : public Kernel {
 public:
  FakeKernel(std::string name, Measure measure, CanImplement can, MRange m, int64_t extra_bytes,
             PrepareResult prepare_result, absl::Duration prepare_time, std::string variant,
             int64_t max_measured_m, double margin, absl::Status supported,
             std::shared_ptr<Log> log)
      : name_(std::move(name)),
        measure_(std::move(measure)),
        can_(std::move(can)),
        m_(m),
        extra_bytes_(extra_bytes),
        prepare_result_(std::move(prepare_result)),
        prepare_time_(prepare_time),
        variant_(std::move(variant)),
        max_measured_m_(max_measured_m),
        margin_(margin),
        supported_(std::move(supported)),
        log_(std::move(log)) {}
  absl::string_view name() const override { return name_; }
  absl::Status is_supported(const HostInfo&) const override { return supported_; }
  absl::Status can_implement(const LayerConfig&, const ProblemShape& s) const override {
    return can_ ? can_(s) : absl::OkStatus();
  }
  MRange preferred_m() const override { return m_; }
  // As the real kernels: a CPU kernel's extra bytes are host memory, a GPU kernel's device memory.
  int64_t host_bytes_to_prepare(const LayerConfig&) const override {
    return kernel_family(name_) == "cpu" ? extra_bytes_ : 0;
  }
  // As the real kernels: measurable exactly when its measurement is not UNIMPLEMENTED.
  bool measurable() const override {
    return !absl::IsUnimplemented(
        measure_(ProblemShape{1, 1, 1, DType::kBF16, DType::kBF16}).status());
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(const LayerWeights&) const override {
    int before;
    {
      absl::MutexLock lock(&log_->mu);
      before = log_->prepares[name_]++;
    }
    absl::SleepFor(prepare_time_);  // widens the window in which concurrent requests overlap
    if (prepare_result_) RETURN_IF_ERROR(prepare_result_(before));
    return std::unique_ptr<PreparedKernel>(
        new FakePrepared(name_, measure_, extra_bytes_, variant_, max_measured_m_, margin_, log_));
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare_with_tuning(
      const LayerWeights& w, const PrepareContext& context) const override {
    {
      absl::MutexLock lock(&log_->mu);
      if (context.tuning != nullptr) log_->prepares_with_tuning[name_]++;
      if (context.on_demand) log_->prepares_on_demand[name_]++;
    }
    return prepare(w);
  }

 private:
  std::string name_;
  Measure measure_;
  CanImplement can_;
  MRange m_;
  int64_t extra_bytes_;
  PrepareResult prepare_result_;
  absl::Duration prepare_time_;
  std::string variant_;
  int64_t max_measured_m_;
  double margin_;
  absl::Status supported_;
  std::shared_ptr<Log> log_;
};

struct Fake {
  std::string name;
  Measure measure = unmeasurable();
  CanImplement can = nullptr;
  MRange m = MRange{};
  int64_t extra_bytes = 0;
  PrepareResult prepare_result = nullptr;
  absl::Duration prepare_time = absl::ZeroDuration();
  std::string variant{};  // PreparedKernel::variant's text, before " for M=<m>"
  int64_t max_measured_m = std::numeric_limits<int64_t>::max();
  double margin = 0;                          // PreparedKernel::measure_margin
  absl::Status supported = absl::OkStatus();  // Kernel::is_supported's answer on every host
};

CanImplement declines_x(DType x, std::string reason) {
  return [x, reason](const ProblemShape& s) {
    return s.x_dtype == x ? absl::FailedPreconditionError(reason) : absl::OkStatus();
  };
}

const CandidateVerdict* verdict(const std::vector<CandidateVerdict>& ex, absl::string_view k) {
  for (const CandidateVerdict& v : ex) {
    if (v.kernel == k) return &v;
  }
  return nullptr;
}

std::string selected_of(const std::vector<CandidateVerdict>& ex) {
  std::string out;
  for (const CandidateVerdict& v : ex) {
    if (v.selected) out += (out.empty() ? "" : ",") + v.kernel;
  }
  return out;
}

class LayerTest : public ::testing::Test {
 protected:
  void add(Fake f) {
    ASSERT_TRUE(registry_
                    .add(std::make_unique<FakeKernel>(std::move(f.name), std::move(f.measure),
                                                      std::move(f.can), f.m, f.extra_bytes,
                                                      std::move(f.prepare_result), f.prepare_time,
                                                      std::move(f.variant), f.max_measured_m,
                                                      f.margin, std::move(f.supported), log_))
                    .ok());
  }
  // Three GPU kernels whose times depend on M, as on the H200, and two CPU kernels.
  void add_typical() {
    add({"cuda.gemv_s8", fixed_us(19.1), nullptr, MRange{1, 1}});
    add({"cuda.cutlass_sm90",
         [](const ProblemShape& s) -> absl::StatusOr<double> { return s.m == 1 ? 14.7 : 10.0; }});
    add({"cuda.cublaslt", [](const ProblemShape& s) -> absl::StatusOr<double> {
           return s.m == 1 ? 16.5 : s.m >= 1024 ? 5.0 : 20.0;
         }});
    add({"cpu.avx512_vnni"});
    add({"cpu.reference"});
  }
  std::shared_ptr<const LayerWeights> weights(int64_t n = kN,
                                              Scheme scheme = Scheme::kDynamicSymmetric) {
    LayerSpec spec;
    spec.n = n;
    spec.k = kK;
    spec.scheme = scheme;
    spec.weight_scale = {0.002f};
    spec.weight_scale_shape = {1};
    if (scheme == Scheme::kStaticSymmetric) {
      spec.has_input_scale = true;
      spec.input_scale = 0.01f;
    }
    auto w = build_layer_weights(spec, std::vector<int8_t>(n * kK, 1));
    EXPECT_TRUE(w.ok()) << w.status();
    return *w;
  }
  // An engine's load of a kN x kK layer named "l", per-tensor scale.
  static LoadRequest load_request() {
    LoadRequest req;
    req.name = "l";
    req.spec.n = kN;
    req.spec.k = kK;
    req.spec.weight_scale = {0.002f};
    req.spec.weight_scale_shape = {1};
    return req;
  }
  absl::StatusOr<std::shared_ptr<const Layer>> create(bool autotune = true,
                                                      std::string forced = "") {
    Layer::Options o;
    o.name = "l";
    o.autotune = autotune;
    o.forced_kernel = std::move(forced);
    return Layer::create(std::move(o), weights(), registry_, host_);
  }
  // A layer of n x kK that shares what loads time through `tuning`.
  absl::StatusOr<std::shared_ptr<const Layer>> create_sharing(
      std::shared_ptr<TuningCache> tuning, int64_t n = kN,
      Scheme scheme = Scheme::kDynamicSymmetric) {
    Layer::Options o;
    o.name = "l";
    o.tuning = std::move(tuning);
    return Layer::create(std::move(o), weights(n, scheme), registry_, host_);
  }
  ProblemShape shape(int64_t m, DType x = DType::kBF16, DType y = DType::kBF16) {
    return ProblemShape{m, kN, kK, x, y};
  }
  // The kernel of the hot path and of the explained path, which must agree.
  std::string chosen(const Layer& l, const ProblemShape& s) {
    auto fast = l.choose(s, "", false);
    auto explained = l.choose(s, "", true);
    EXPECT_TRUE(fast.ok()) << fast.status();
    EXPECT_TRUE(explained.ok()) << explained.status();
    if (!fast.ok() || !explained.ok()) return "error";
    EXPECT_EQ(fast->kernel, explained->kernel) << "M=" << s.m;
    EXPECT_EQ(selected_of(explained->explanation), explained->kernel->name()) << "M=" << s.m;
    return std::string(fast->kernel->name());
  }

  static constexpr int64_t kN = 32;
  static constexpr int64_t kK = 64;
  std::shared_ptr<Log> log_ = std::make_shared<Log>();
  Registry registry_;
  HostInfo host_;
};

// The bytes a layer holds without any kernel's extra bytes.
int64_t weight_bytes(const Layer& l) {
  const LayerWeights& w = l.weights();
  return static_cast<int64_t>(w.w.size() + 4 * w.sb.size() + 4 * w.bias.size() +
                              4 * w.azp_adj.size());
}

constexpr DType kDTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

TEST_F(LayerTest, AutotunePutsTheFastestFirstInEachBucket) {
  add_typical();
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  const auto& b = (*layer)->buckets();
  ASSERT_EQ(b.size(), 6u);
  // Priority would pick gemv for M = 1 and cutlass elsewhere; the measurements decide instead.
  const char* want[] = {"cuda.cutlass_sm90", "cuda.cutlass_sm90", "cuda.cutlass_sm90",
                        "cuda.cutlass_sm90", "cuda.cublaslt",     "cuda.cublaslt"};
  const int64_t measured_m[] = {1, 16, 64, 256, 1024, 2048};
  for (size_t i = 0; i < b.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("bucket ", i));
    EXPECT_EQ(b[i].kernel, want[i]);
    EXPECT_EQ(selected_of(b[i].explanation), want[i]);
    EXPECT_EQ(b[i].measured_m, measured_m[i]);
    EXPECT_EQ(chosen(**layer, shape(b[i].bucket.lo)), want[i]);
    EXPECT_EQ(chosen(**layer, shape(measured_m[i])), want[i]);
  }
  // M = 1: three measured, explained with every time.
  EXPECT_EQ(verdict(b[0].explanation, "cuda.cutlass_sm90")->reason,
            "fastest measured at load, 14.7 us at M=1; cuda.gemv_s8 19.1 us; cuda.cublaslt "
            "16.5 us");
  EXPECT_EQ(verdict(b[0].explanation, "cuda.gemv_s8")->reason,
            "measured slower at load: 19.1 us at M=1 (cuda.cutlass_sm90 14.7 us)");
  EXPECT_EQ(verdict(b[0].explanation, "cuda.cublaslt")->reason,
            "measured slower at load: 16.5 us at M=1 (cuda.cutlass_sm90 14.7 us)");
  EXPECT_EQ(verdict(b[0].explanation, "cpu.avx512_vnni")->reason,
            "a higher-priority kernel was selected");
  ASSERT_EQ(b[0].measured.size(), 3u);  // priority order
  EXPECT_EQ(b[0].measured[0].kernel, "cuda.gemv_s8");
  EXPECT_DOUBLE_EQ(b[0].measured[0].us, 19.1);
  // The prefill bucket: cublaslt wins at M = 2048, gemv does not prefer it and is not measured.
  EXPECT_EQ(verdict(b[5].explanation, "cuda.cublaslt")->reason,
            "fastest measured at load, 5.0 us at M=2048; cuda.cutlass_sm90 10.0 us");
  EXPECT_EQ(verdict(b[5].explanation, "cuda.gemv_s8")->reason,
            "prefers M 1..1, bucket is M >= 1025");
  // Measured once per eligible kernel and bucket, in bf16, at the bucket's M.
  EXPECT_EQ(log_->measure_count("cuda.gemv_s8"), 1);
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 6);
  EXPECT_EQ(log_->measure_count("cuda.cublaslt"), 6);
  EXPECT_EQ(log_->measured[0], "cuda.gemv_s8 M=1 bf16->bf16");
  EXPECT_EQ(log_->measured.back(), "cuda.cublaslt M=2048 bf16->bf16");
}

TEST_F(LayerTest, LaterLayersOfAShapeTakeWhatTheFirstOnesLoadMeasured) {
  add_typical();
  const auto tuning = std::make_shared<TuningCache>();
  auto first = create_sharing(tuning);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 6);
  // Every kernel prepared at load is given the cache, for what it times of its own.
  EXPECT_EQ(log_->prepare_with_tuning_count("cuda.cutlass_sm90"), 1);
  EXPECT_EQ(log_->prepare_with_tuning_count("cuda.cublaslt"), 1);
  const auto& fb = (*first)->buckets();
  EXPECT_EQ(verdict(fb[0].explanation, "cuda.cutlass_sm90")->reason,
            "fastest measured at load, 14.7 us at M=1; cuda.gemv_s8 19.1 us; cuda.cublaslt "
            "16.5 us");

  // The same shape again: nothing measured, the same ranking, said to be the earlier layer's.
  auto second = create_sharing(tuning);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(log_->measure_count("cuda.gemv_s8"), 1);
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 6);
  EXPECT_EQ(log_->measure_count("cuda.cublaslt"), 6);
  EXPECT_EQ(log_->prepare_with_tuning_count("cuda.cutlass_sm90"), 2);
  const auto& sb = (*second)->buckets();
  ASSERT_EQ(sb.size(), fb.size());
  for (size_t i = 0; i < sb.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("bucket ", i));
    EXPECT_EQ(sb[i].kernel, fb[i].kernel);
    EXPECT_EQ(sb[i].measured_m, fb[i].measured_m);
    EXPECT_FALSE(fb[i].measured_shared);
    EXPECT_TRUE(sb[i].measured_shared);
    ASSERT_EQ(sb[i].measured.size(), fb[i].measured.size());
    for (size_t j = 0; j < sb[i].measured.size(); ++j) {
      EXPECT_EQ(sb[i].measured[j].kernel, fb[i].measured[j].kernel);
      EXPECT_DOUBLE_EQ(sb[i].measured[j].us, fb[i].measured[j].us);
    }
    EXPECT_EQ(chosen(**second, shape(sb[i].bucket.lo)), fb[i].kernel);
  }
  EXPECT_EQ(verdict(sb[0].explanation, "cuda.cutlass_sm90")->reason,
            "fastest measured at load, by an earlier layer of the same N, K, scheme and bias, "
            "14.7 us at M=1; cuda.gemv_s8 19.1 us; cuda.cublaslt 16.5 us");
  EXPECT_EQ(verdict(sb[0].explanation, "cuda.gemv_s8")->reason,
            "measured slower at load: 19.1 us at M=1 (cuda.cutlass_sm90 14.7 us)");

  // Another N, another scheme, or no cache: measured anew.
  ASSERT_TRUE(create_sharing(tuning, kN + 16).ok());
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 12);
  ASSERT_TRUE(create_sharing(tuning, kN, Scheme::kStaticSymmetric).ok());
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 18);
  ASSERT_TRUE(create_sharing(tuning, kN + 16).ok());
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 18);
  ASSERT_TRUE(create().ok());
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 24);
  EXPECT_EQ(log_->prepare_with_tuning_count("cuda.cutlass_sm90"), 5);  // all but the last

  // A kernel a request prepares on demand (here forced) is given the cache, to take what an
  // earlier layer's load stored, and told it is on demand (it stores nothing; PrepareContext).
  // Nothing at load is prepared so.
  EXPECT_EQ(log_->prepare_on_demand_count("cuda.cutlass_sm90"), 0);
  EXPECT_EQ(log_->prepare_on_demand_count("cuda.cublaslt"), 0);
  const int prepares = log_->prepare_count("cpu.reference");
  auto forced = (*second)->choose(shape(1), "cpu.reference", false);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_TRUE(forced->prepared_now);
  EXPECT_EQ(log_->prepare_count("cpu.reference"), prepares + 1);
  EXPECT_EQ(log_->prepare_with_tuning_count("cpu.reference"), 1);
  EXPECT_EQ(log_->prepare_on_demand_count("cpu.reference"), 1);
  // Once prepared, it is not prepared again.
  ASSERT_TRUE((*second)->choose(shape(16), "cpu.reference", false).ok());
  EXPECT_EQ(log_->prepare_count("cpu.reference"), prepares + 1);
}

// A bucket takes an earlier layer's times only where each candidate runs as it did there (its
// variant: the tiles or ring it timed for itself); otherwise it measures them again.
TEST_F(LayerTest, TimesAreSharedOnlyForKernelsThatRunAsTheyDidThere) {
  add({"cuda.cutlass_sm90", fixed_us(20.0), nullptr, MRange{}, 0, nullptr, absl::ZeroDuration(),
       "tile A"});
  add({"cuda.cublaslt", fixed_us(10.0)});
  add({"cpu.reference"});
  const auto tuning = std::make_shared<TuningCache>();
  ASSERT_TRUE(create_sharing(tuning).ok());
  ASSERT_TRUE(create_sharing(tuning).ok());
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 6);
  // The same kernels, but cutlass now runs another tile: measured again.
  registry_ = Registry();
  add({"cuda.cutlass_sm90", fixed_us(20.0), nullptr, MRange{}, 0, nullptr, absl::ZeroDuration(),
       "tile B"});
  add({"cuda.cublaslt", fixed_us(10.0)});
  add({"cpu.reference"});
  auto other = create_sharing(tuning);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 12);
  EXPECT_EQ(log_->measure_count("cuda.cublaslt"), 12);
  EXPECT_FALSE((*other)->buckets()[0].measured_shared);
}

TEST_F(LayerTest, AFailedMeasurementIsNotSharedWithLaterLayers) {
  bool fail = true;
  add({"cuda.cutlass_sm90", [&fail](const ProblemShape&) -> absl::StatusOr<double> {
         if (fail) return absl::ResourceExhaustedError("out of GPU memory (fake)");
         return 20.0;
       }});
  add({"cuda.cublaslt", fixed_us(10.0)});
  add({"cpu.reference"});
  const auto tuning = std::make_shared<TuningCache>();
  auto first = create_sharing(tuning);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE((*first)->buckets()[0].measured[0].error.empty());
  fail = false;
  auto second = create_sharing(tuning);
  ASSERT_TRUE(second.ok()) << second.status();
  // The first layer's buckets were not stored: the second measures every candidate again.
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 12);
  EXPECT_EQ(log_->measure_count("cuda.cublaslt"), 12);
  const BucketInfo& b = (*second)->buckets()[0];
  EXPECT_FALSE(b.measured_shared);
  ASSERT_EQ(b.measured.size(), 2u);
  EXPECT_TRUE(b.measured[0].error.empty());
  EXPECT_DOUBLE_EQ(b.measured[0].us, 20.0);
  EXPECT_EQ(b.kernel, "cuda.cublaslt");
  // Now complete, they are stored for a third.
  ASSERT_TRUE(create_sharing(tuning).ok());
  EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90"), 12);
}

TEST_F(LayerTest, UnmeasurableKernelsKeepThePriorityOrder) {
  // gemv cannot be measured: it stays ahead of the measured block; the CPU kernel stays behind.
  add({"cuda.gemv_s8", unmeasurable(), [](const ProblemShape& s) {
         return s.x_dtype == DType::kBF16 ? absl::OkStatus()
                                          : absl::FailedPreconditionError("fake gemv: bf16 only");
       }});
  add({"cuda.cutlass_sm90", fixed_us(20.0)});
  add({"cuda.cublaslt", fixed_us(10.0), declines_x(DType::kF32, "fake cublaslt: no fp32 input")});
  add({"cpu.avx512_vnni"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  const BucketInfo& b = (*layer)->buckets()[1];
  EXPECT_EQ(b.kernel, "cuda.gemv_s8");
  EXPECT_EQ(verdict(b.explanation, "cuda.gemv_s8")->reason, "");
  EXPECT_EQ(verdict(b.explanation, "cuda.cublaslt")->reason,
            "a higher-priority kernel was selected");
  ASSERT_EQ(b.measured.size(), 2u);
  EXPECT_EQ(chosen(**layer, shape(16)), "cuda.gemv_s8");
  // gemv declines: the measured block, fastest first, is next (cublaslt, not cutlass).
  EXPECT_EQ(chosen(**layer, shape(16, DType::kF16)), "cuda.cublaslt");
  // cublaslt declines too: cutlass, never the CPU kernel.
  EXPECT_EQ(chosen(**layer, shape(16, DType::kF32)), "cuda.cutlass_sm90");
  EXPECT_EQ(log_->measure_count("cuda.gemv_s8"), 0);
}

TEST_F(LayerTest, MeasuredKernelsMoveAsOneBlockAheadOfUnmeasurableOnes) {
  // An unmeasurable kernel between two measurable ones goes behind them, so that a measured
  // ranking is never broken up by a kernel whose speed is unknown.
  add({"cuda.cutlass_sm90", fixed_us(20.0)});
  add({"cuda.cublaslt", unmeasurable()});
  add({"cuda.stream_s8", fixed_us(5.0)});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  const BucketInfo& b = (*layer)->buckets()[2];
  EXPECT_EQ(b.kernel, "cuda.stream_s8");
  EXPECT_EQ(verdict(b.explanation, "cuda.cutlass_sm90")->reason,
            "measured slower at load: 20.0 us at M=64 (cuda.stream_s8 5.0 us)");
  EXPECT_EQ(verdict(b.explanation, "cuda.cublaslt")->reason,
            "a higher-priority kernel was selected");
  EXPECT_EQ(chosen(**layer, shape(64)), "cuda.stream_s8");
}

// A measurement ranks a kernel among its own family (the name up to its '.': the device) only:
// CPU kernels behind a GPU kernel that runs every shape are neither prepared nor measured, however
// fast they would measure, and where the GPU kernel declines a shape the first CPU kernel in the
// priority order serves it.
TEST_F(LayerTest, AMeasurementRanksAKernelOnlyAmongItsOwnFamily) {
  add({"cuda.cutlass_sm90", fixed_us(20.0), nullptr, MRange{}, 1000});
  add({"cuda.cublaslt", fixed_us(30.0), nullptr, MRange{}, 2000});
  add({"cpu.avx512_vnni", fixed_us(5.0), nullptr, MRange{}, 1 << 20});
  add({"cpu.onednn", fixed_us(1.0), nullptr, MRange{}, 1 << 21});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 0);
  EXPECT_EQ(log_->prepare_count("cpu.onednn"), 0);
  EXPECT_EQ(log_->measure_count("cpu.avx512_vnni"), 0);
  EXPECT_EQ(log_->measure_count("cpu.onednn"), 0);
  for (const BucketInfo& b : (*layer)->buckets()) {
    EXPECT_EQ(b.kernel, "cuda.cutlass_sm90");
    ASSERT_EQ(b.measured.size(), 2u);  // the two GPU kernels
    EXPECT_EQ(verdict(b.explanation, "cpu.onednn")->reason,
              "a higher-priority kernel was selected");
  }

  // The GPU kernels decline fp32 input: the CPU kernels that serve it are ranked by the priority
  // order, since a GPU kernel leads the measured shape (bf16).
  log_ = std::make_shared<Log>();
  registry_ = Registry();
  add({"cuda.cutlass_sm90", fixed_us(20.0), declines_x(DType::kF32, "fake cutlass: no fp32")});
  add({"cpu.avx512_vnni", fixed_us(5.0)});
  add({"cpu.onednn", fixed_us(1.0)});
  add({"cpu.reference"});
  auto mixed = create();
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.onednn"), 0);
  EXPECT_TRUE(log_->measured.empty());  // one GPU kernel: nothing to rank
  EXPECT_EQ(chosen(**mixed, shape(16)), "cuda.cutlass_sm90");
  EXPECT_EQ(chosen(**mixed, shape(16, DType::kF32)), "cpu.avx512_vnni");
}

// On a host without a GPU the CPU kernels are measured like the GPU kernels, each bucket at its M
// up to the kernels' max_measured_m; larger buckets take the times measured there, once.
TEST_F(LayerTest, CpuKernelsAreRankedByTheirMeasuredTimes) {
  const auto by_m = [](double m1, double more) -> Measure {
    return [m1, more](const ProblemShape& s) -> absl::StatusOr<double> {
      return s.m == 1 ? m1 : more * static_cast<double>(s.m);
    };
  };
  const auto cpu = [](std::string name, Measure measure, int64_t bytes) {
    Fake f{std::move(name), std::move(measure), nullptr, MRange{}, bytes};
    f.max_measured_m = 256;
    return f;
  };
  const auto add_cpu = [&] {
    add(cpu("cpu.avx512_vnni", by_m(10.0, 5.0), 1 << 20));
    add(cpu("cpu.onednn", by_m(20.0, 2.0), 1 << 21));
    add(cpu("cpu.avx2", by_m(30.0, 8.0), 1 << 22));
    add({"cpu.reference"});
  };
  add_cpu();
  const auto tuning = std::make_shared<TuningCache>();
  auto layer = create_sharing(tuning);
  ASSERT_TRUE(layer.ok()) << layer.status();
  const auto& b = (*layer)->buckets();
  ASSERT_EQ(b.size(), 6u);
  const int64_t measured_m[] = {1, 16, 64, 256, 256, 256};
  for (size_t i = 0; i < b.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("bucket ", i));
    const char* want = i == 0 ? "cpu.avx512_vnni" : "cpu.onednn";
    EXPECT_EQ(b[i].kernel, want);
    EXPECT_EQ(b[i].measured_m, measured_m[i]);
    EXPECT_FALSE(b[i].measured_shared);
    EXPECT_EQ(chosen(**layer, shape(b[i].bucket.lo)), want);
    ASSERT_EQ(b[i].measured.size(), 3u);  // not the reference
  }
  EXPECT_EQ(verdict(b[5].explanation, "cpu.onednn")->reason,
            "fastest measured at load, 512.0 us at M=256; cpu.avx512_vnni 1280.0 us; cpu.avx2 "
            "2048.0 us");
  EXPECT_EQ(verdict(b[5].explanation, "cpu.reference")->reason,
            "a higher-priority kernel was selected");
  EXPECT_EQ(chosen(**layer, shape(3000)), "cpu.onednn");
  // Each kernel measured once per M: 1, 16, 64 and 256 (three buckets).
  EXPECT_EQ(log_->measure_count("cpu.avx512_vnni"), 4);
  EXPECT_EQ(log_->measure_count("cpu.onednn"), 4);
  EXPECT_EQ(log_->measure_count("cpu.avx2"), 4);
  EXPECT_EQ(log_->measured.back(), "cpu.avx2 M=256 bf16->bf16");
  // avx2 wins no bucket: prepared to be measured, then released; the reference was never needed.
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.reference"), 0);
  EXPECT_EQ((*layer)->total_bytes(), weight_bytes(**layer) + (1 << 20) + (1 << 21));
  // Forcing it prepares it again, on demand.
  auto forced = (*layer)->choose(shape(8), "cpu.avx2", false);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_TRUE(forced->prepared_now);
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 2);
  EXPECT_EQ((*layer)->total_bytes(), weight_bytes(**layer) + (1 << 20) + (1 << 21) + (1 << 22));

  // A later layer of the shape takes the first one's times, and does not prepare the kernel the
  // first one released.
  auto later = create_sharing(tuning);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(log_->measure_count("cpu.onednn"), 4);
  EXPECT_EQ(log_->measure_count("cpu.avx2"), 4);
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 2);  // the first layer's two, none more
  for (const BucketInfo& lb : (*later)->buckets()) {
    EXPECT_TRUE(lb.measured_shared);
    EXPECT_EQ(lb.measured.size(), 3u);
  }
  EXPECT_EQ((*later)->buckets()[0].kernel, "cpu.avx512_vnni");
  EXPECT_EQ((*later)->buckets()[5].kernel, "cpu.onednn");
  EXPECT_EQ(verdict((*later)->buckets()[5].explanation, "cpu.avx2")->reason,
            "measured slower at load: 2048.0 us at M=256 (cpu.onednn 512.0 us)");
  EXPECT_EQ((*later)->total_bytes(), weight_bytes(**later) + (1 << 20) + (1 << 21));
  for (const BucketInfo& lb : (*later)->buckets()) {
    EXPECT_EQ(chosen(**later, shape(lb.bucket.lo)), lb.kernel);
  }
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 2);
  // Forced, it is prepared on demand.
  auto forced_later = (*later)->choose(shape(8), "cpu.avx2", false);
  ASSERT_TRUE(forced_later.ok()) << forced_later.status();
  EXPECT_TRUE(forced_later->prepared_now);
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 3);

  // Where the earlier layer's times do not fit (here onednn runs another variant of itself), a
  // kernel it released is prepared and measured after all, and released again.
  registry_ = Registry();
  add(cpu("cpu.avx512_vnni", by_m(10.0, 5.0), 1 << 20));
  Fake other = cpu("cpu.onednn", by_m(20.0, 2.0), 1 << 21);
  other.variant = "another reorder";
  add(std::move(other));
  add(cpu("cpu.avx2", by_m(30.0, 8.0), 1 << 22));
  add({"cpu.reference"});
  auto remeasured = create_sharing(tuning);
  ASSERT_TRUE(remeasured.ok()) << remeasured.status();
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 4);
  EXPECT_EQ(log_->measure_count("cpu.avx2"), 8);
  EXPECT_FALSE((*remeasured)->buckets()[1].measured_shared);
  EXPECT_EQ((*remeasured)->buckets()[1].kernel, "cpu.onednn");
  EXPECT_EQ((*remeasured)->total_bytes(), weight_bytes(**remeasured) + (1 << 20) + (1 << 21));

  // Without autotune, the priority order: avx512_vnni everywhere, the others not prepared.
  log_ = std::make_shared<Log>();
  registry_ = Registry();
  add_cpu();
  auto plain = create(/*autotune=*/false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (const BucketInfo& pb : (*plain)->buckets()) EXPECT_EQ(pb.kernel, "cpu.avx512_vnni");
  EXPECT_EQ(log_->prepare_count("cpu.onednn"), 0);
  EXPECT_TRUE(log_->measured.empty());
}

// Where the kernel the priority order puts first measured slower everywhere, the first layer of a
// shape releases it and later layers do not prepare it at all, although the priority order alone
// would choose it.
TEST_F(LayerTest, LaterLayersDoNotPrepareTheFirstKernelTheFirstLayerReleased) {
  const auto cpu = [](std::string name, double us) {
    Fake f{std::move(name), fixed_us(us), nullptr, MRange{}, 1000};
    f.max_measured_m = 256;
    f.margin = 0.05;
    return f;
  };
  add(cpu("cpu.avx512_vnni", 10.0));
  add(cpu("cpu.onednn", 5.0));
  add(cpu("cpu.avx2", 20.0));
  add({"cpu.reference"});
  const auto tuning = std::make_shared<TuningCache>();
  auto first = create_sharing(tuning);
  ASSERT_TRUE(first.ok()) << first.status();
  auto later = create_sharing(tuning);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.onednn"), 2);
  EXPECT_EQ((*later)->total_bytes(), weight_bytes(**later) + 1000);
  for (const BucketInfo& b : (*later)->buckets()) {
    EXPECT_EQ(b.kernel, "cpu.onednn");
    EXPECT_TRUE(b.measured_shared);
    for (DType x : kDTypes) EXPECT_EQ(chosen(**later, shape(b.bucket.lo, x)), "cpu.onednn");
  }
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 1);
}

// The kernel the priority order ranks first among the measured keeps the lead where another
// measured faster by no more than its measure_margin, and the explanations say so.
TEST_F(LayerTest, ThePriorityOrdersFirstKeepsTheLeadWithinItsMargin) {
  Fake vnni{"cpu.avx512_vnni", fixed_us(10.0)};
  vnni.margin = 0.05;
  add(std::move(vnni));
  Fake onednn{"cpu.onednn", [](const ProblemShape& s) -> absl::StatusOr<double> {
                return s.m == 1 ? 9.7 : 9.0;  // 3% faster at M = 1, 10% elsewhere
              }};
  onednn.margin = 0.05;
  add(std::move(onednn));
  Fake avx2{"cpu.avx2", fixed_us(9.6)};  // 4% faster at M = 1, behind onednn by priority
  avx2.margin = 0.05;
  add(std::move(avx2));
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  const auto& b = (*layer)->buckets();
  EXPECT_EQ(b[0].kernel, "cpu.avx512_vnni");
  EXPECT_EQ(b[0].kept_by_margin, "cpu.avx512_vnni");
  EXPECT_EQ(verdict(b[0].explanation, "cpu.avx512_vnni")->reason,
            "first in the priority order and within 5% of the fastest measured at load, 10.0 us "
            "at M=1; cpu.onednn 9.7 us; cpu.avx2 9.6 us");
  EXPECT_EQ(verdict(b[0].explanation, "cpu.avx2")->reason,
            "measured faster at load by less than 5%: 9.6 us at M=1 (cpu.avx512_vnni 10.0 us, "
            "first in the priority order)");
  EXPECT_EQ(chosen(**layer, shape(1)), "cpu.avx512_vnni");
  EXPECT_EQ(b[1].kernel, "cpu.onednn");  // 10% faster at M = 16
  EXPECT_TRUE(b[1].kept_by_margin.empty());
  EXPECT_EQ(verdict(b[1].explanation, "cpu.onednn")->reason,
            "fastest measured at load, 9.0 us at M=16; cpu.avx512_vnni 10.0 us; cpu.avx2 9.6 us");
  EXPECT_EQ(verdict(b[1].explanation, "cpu.avx512_vnni")->reason,
            "measured slower at load: 10.0 us at M=16 (cpu.onednn 9.0 us)");
  EXPECT_EQ(chosen(**layer, shape(16)), "cpu.onednn");

  // Without a margin (the GPU kernels) the faster time wins.
  log_ = std::make_shared<Log>();
  registry_ = Registry();
  add({"cuda.cutlass_sm90", fixed_us(10.0)});
  add({"cuda.cublaslt", fixed_us(9.9)});
  add({"cpu.reference"});
  auto gpu = create();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu.value()->buckets()[0].kernel, "cuda.cublaslt");
}

// A CPU kernel prepared at load to be measured, and slower everywhere, is released after the load
// (its bytes no longer count); one that still serves some dtype stays prepared. GPU kernels stay
// prepared: they share the layer's device copy of the weights, whose bytes one of them counts.
TEST_F(LayerTest, CpuKernelsMeasuredSlowerEverywhereAreReleasedAfterTheLoad) {
  add({"cpu.avx512_vnni", fixed_us(10.0), nullptr, MRange{}, 1000});
  add({"cpu.onednn", fixed_us(20.0), nullptr, MRange{}, 2000});
  add({"cpu.avx2", fixed_us(30.0), nullptr, MRange{}, 4000});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(log_->prepare_count("cpu.onednn"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 1);
  EXPECT_EQ((*layer)->total_bytes(), weight_bytes(**layer) + 1000);
  for (DType x : kDTypes) EXPECT_EQ(chosen(**layer, shape(16, x)), "cpu.avx512_vnni");
  EXPECT_EQ(log_->prepare_count("cpu.onednn"), 1);  // unforced requests never need it

  // The winner declines fp16 input, which the next in the ranking, onednn, serves.
  log_ = std::make_shared<Log>();
  registry_ = Registry();
  add({"cpu.avx512_vnni", fixed_us(10.0), declines_x(DType::kF16, "fake avx512: no fp16"), MRange{},
       1000});
  add({"cpu.onednn", fixed_us(20.0), nullptr, MRange{}, 2000});
  add({"cpu.avx2", fixed_us(30.0), nullptr, MRange{}, 4000});
  add({"cpu.reference"});
  auto fp16 = create();
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  EXPECT_EQ((*fp16)->total_bytes(), weight_bytes(**fp16) + 1000 + 2000);
  EXPECT_EQ(chosen(**fp16, shape(16, DType::kF16)), "cpu.onednn");
  EXPECT_EQ(log_->prepare_count("cpu.onednn"), 1);

  // GPU kernels measured slower everywhere stay prepared.
  log_ = std::make_shared<Log>();
  registry_ = Registry();
  add({"cuda.cutlass_sm90", fixed_us(10.0), nullptr, MRange{}, 1000});
  add({"cuda.stream_s8", fixed_us(20.0), nullptr, MRange{}, 0});
  add({"cpu.reference"});
  auto gpu = create();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->total_bytes(), weight_bytes(**gpu) + 1000);
  EXPECT_EQ(log_->prepare_count("cuda.stream_s8"), 1);
  auto forced = (*gpu)->choose(shape(16), "cuda.stream_s8", false);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_FALSE(forced->prepared_now);
}

TEST_F(LayerTest, FailedMeasurementIsSkippedWithItsReason) {
  add({"cuda.gemv_s8",
       [](const ProblemShape&) -> absl::StatusOr<double> {
         return absl::ResourceExhaustedError(
             "out of GPU memory on cuda:0 allocating 134217728 bytes for an L2 flush buffer");
       },
       nullptr, MRange{1, 1}});
  add({"cuda.cutlass_sm90", fixed_us(20.0)});
  add({"cuda.cublaslt", fixed_us(10.0)});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();  // a failed measurement never fails the load
  const BucketInfo& b = (*layer)->buckets()[0];
  EXPECT_EQ(b.kernel, "cuda.cublaslt");
  EXPECT_EQ(verdict(b.explanation, "cuda.cublaslt")->reason,
            "fastest measured at load, 10.0 us at M=1; cuda.gemv_s8 not measured; "
            "cuda.cutlass_sm90 20.0 us");
  EXPECT_EQ(verdict(b.explanation, "cuda.gemv_s8")->reason,
            "its measurement at load failed (out of GPU memory on cuda:0 allocating 134217728 "
            "bytes for an L2 flush buffer); ranked after the measured kernels");
  ASSERT_EQ(b.measured.size(), 3u);
  EXPECT_FALSE(b.measured[0].error.empty());
  EXPECT_EQ(chosen(**layer, shape(1)), "cuda.cublaslt");
}

TEST_F(LayerTest, WhenEveryMeasurementFailsThePriorityOrderStands) {
  const Measure fails = [](const ProblemShape&) -> absl::StatusOr<double> {
    return absl::InternalError("CUDA error in cudaEventRecord: boom");
  };
  add({"cuda.cutlass_sm90", fails});
  add({"cuda.cublaslt", fails});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  const BucketInfo& b = (*layer)->buckets()[3];
  EXPECT_EQ(b.kernel, "cuda.cutlass_sm90");
  EXPECT_EQ(verdict(b.explanation, "cuda.cutlass_sm90")->reason,
            "not ranked: its measurement at load failed (CUDA error in cudaEventRecord: boom)");
  EXPECT_EQ(verdict(b.explanation, "cuda.cublaslt")->reason,
            "its measurement at load failed (CUDA error in cudaEventRecord: boom); a "
            "higher-priority kernel was selected");
  EXPECT_EQ(chosen(**layer, shape(256)), "cuda.cutlass_sm90");
}

TEST_F(LayerTest, AutotuneOffKeepsThePriorityOrder) {
  add_typical();
  auto layer = create(/*autotune=*/false);
  ASSERT_TRUE(layer.ok()) << layer.status();
  for (const BucketInfo& b : (*layer)->buckets()) {
    const std::string want = b.bucket.lo == 1 ? "cuda.gemv_s8" : "cuda.cutlass_sm90";
    EXPECT_EQ(b.kernel, want);
    EXPECT_TRUE(b.measured.empty());
    EXPECT_EQ(verdict(b.explanation, want)->reason, "");
    EXPECT_EQ(chosen(**layer, shape(b.bucket.lo)), want);
  }
  EXPECT_TRUE(log_->measured.empty());
}

TEST_F(LayerTest, OneMeasurableCandidateIsNotRanked) {
  add({"cuda.cutlass_sm90", fixed_us(20.0)});
  add({"cpu.avx512_vnni"});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  for (const BucketInfo& b : (*layer)->buckets()) {
    EXPECT_EQ(b.kernel, "cuda.cutlass_sm90");
    EXPECT_TRUE(b.measured.empty());
    EXPECT_EQ(verdict(b.explanation, "cuda.cutlass_sm90")->reason, "");
  }
}

TEST_F(LayerTest, ForcedKernelIgnoresAutotune) {
  add_typical();
  auto layer = create(/*autotune=*/true, "cuda.gemv_s8");
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_TRUE(log_->measured.empty());  // nothing to rank: the forced kernel runs everywhere
  for (const BucketInfo& b : (*layer)->buckets()) {
    EXPECT_EQ(b.kernel, "cuda.gemv_s8");
    EXPECT_TRUE(b.measured.empty());
    EXPECT_EQ(verdict(b.explanation, "cuda.cutlass_sm90")->reason, "not forced");
  }
  auto c = (*layer)->choose(shape(16), "", true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernel->name(), "cuda.gemv_s8");

  // A request forcing a kernel on an autotuned layer gets exactly that kernel.
  auto tuned = create();
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  auto forced = (*tuned)->choose(shape(1), "cuda.cublaslt", true);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->kernel->name(), "cuda.cublaslt");
  EXPECT_EQ(selected_of(forced->explanation), "cuda.cublaslt");
  EXPECT_EQ(verdict(forced->explanation, "cuda.cutlass_sm90")->reason, "not forced");
}

// A request's explanation adds the selected kernel's own choice for the request's M (its
// PreparedKernel::variant) after why it was selected, also when the request forces the kernel;
// the other verdicts, the load-time explanation and the hot path carry no such text.
TEST_F(LayerTest, ExplanationNamesTheSelectedKernelsOwnChoiceForTheRequestsM) {
  add({"cuda.gemv_s8", fixed_us(10.0), nullptr, MRange{1, 1}});
  Fake cutlass{"cuda.cutlass_sm90", fixed_us(20.0)};
  cutlass.variant = "tile A";
  add(std::move(cutlass));
  add({"cuda.cublaslt", fixed_us(25.0)});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto c = (*layer)->choose(shape(13), "", true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernel->name(), "cuda.cutlass_sm90");
  EXPECT_EQ(verdict(c->explanation, "cuda.cutlass_sm90")->reason,
            "fastest measured at load, 20.0 us at M=16; cuda.cublaslt 25.0 us; runs tile A for "
            "M=13");
  EXPECT_EQ(verdict(c->explanation, "cuda.cublaslt")->reason,
            "measured slower at load: 25.0 us at M=16 (cuda.cutlass_sm90 20.0 us)");
  EXPECT_EQ(verdict((*layer)->buckets()[1].explanation, "cuda.cutlass_sm90")->reason,
            "fastest measured at load, 20.0 us at M=16; cuda.cublaslt 25.0 us");
  auto fast = (*layer)->choose(shape(13), "", false);
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_TRUE(fast->explanation.empty());
  // Forced: the registry's verdict (empty reason) gets the kernel's choice alone.
  auto forced = (*layer)->choose(shape(2), "cuda.cutlass_sm90", true);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(verdict(forced->explanation, "cuda.cutlass_sm90")->reason, "runs tile A for M=2");
  // A kernel without a choice of its own: the reason is unchanged.
  auto gemv = (*layer)->choose(shape(1), "", true);
  ASSERT_TRUE(gemv.ok()) << gemv.status();
  EXPECT_EQ(gemv->kernel->name(), "cuda.gemv_s8");
  EXPECT_EQ(verdict(gemv->explanation, "cuda.gemv_s8")->reason,
            "fastest measured at load, 10.0 us at M=1; cuda.cutlass_sm90 20.0 us; cuda.cublaslt "
            "25.0 us");
}

TEST_F(LayerTest, FastestThatCannotRunTheRequestFallsBackToTheNextRanked) {
  add({"cuda.gemv_s8", fixed_us(30.0), nullptr, MRange{1, 1}});
  add({"cuda.cutlass_sm90", fixed_us(20.0)});
  add({"cuda.cublaslt", fixed_us(10.0), declines_x(DType::kF32, "fake cublaslt: no fp32 input")});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ((*layer)->buckets()[1].kernel, "cuda.cublaslt");
  EXPECT_EQ(chosen(**layer, shape(16)), "cuda.cublaslt");
  // fp32 input: cublaslt (fastest) declines; cutlass (second) runs, not gemv or the reference.
  EXPECT_EQ(chosen(**layer, shape(16, DType::kF32)), "cuda.cutlass_sm90");
  EXPECT_EQ(chosen(**layer, shape(1, DType::kF32)), "cuda.cutlass_sm90");
  auto c = (*layer)->choose(shape(16, DType::kF32), "", true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(verdict(c->explanation, "cuda.cutlass_sm90")->reason,
            "fastest measured at load that can run this shape, 20.0 us at M=16; cuda.cublaslt "
            "10.0 us");
  EXPECT_EQ(verdict(c->explanation, "cuda.cublaslt")->reason, "fake cublaslt: no fp32 input");
  EXPECT_FALSE(verdict(c->explanation, "cpu.reference")->selected);
}

TEST_F(LayerTest, ExplainOnARequestNamesTheAutotunedKernelThatRuns) {
  add_typical();
  Engine engine(registry_, host_);  // autotune on by default
  const LoadRequest req = load_request();
  auto loaded = engine.load(req, std::vector<int8_t>(kN * kK, 1));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (const auto& [m, want] : std::vector<std::pair<int64_t, std::string>>{
           {1, "cuda.cutlass_sm90"}, {2000, "cuda.cublaslt"}}) {
    SCOPED_TRACE(absl::StrCat("M=", m));
    std::string x(static_cast<size_t>(m * kK) * 2, '\0'), y;
    InferInput in;
    in.layer = "l";
    in.m = m;
    in.x = x;
    in.explain = true;
    InferOutput out;
    const int runs_before = log_->run_count(want);
    ASSERT_TRUE(engine.infer(in, CallContext{}, &y, &out).ok());
    EXPECT_EQ(out.kernel, want);
    EXPECT_EQ(selected_of(out.explanation), want);
    EXPECT_TRUE(
        absl::StartsWith(verdict(out.explanation, want)->reason, "fastest measured at load, "))
        << verdict(out.explanation, want)->reason;
    EXPECT_EQ(log_->run_count(want), runs_before + 1);  // the explained kernel is the one that ran
  }
  // Off in the engine's options: the priority order.
  EngineOptions off;
  off.autotune = false;
  Engine plain(registry_, host_, off);
  auto again = plain.load(req, std::vector<int8_t>(kN * kK, 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->layer().buckets()[0].kernel, "cuda.gemv_s8");
}

// An upload whose client went away while its layer was built is dropped just before publishing:
// the layer it would have replaced keeps serving, and a new name stays free. A forced kernel that
// cannot serve is refused at the header, before any weight is received.
TEST_F(LayerTest, AnUploadCancelledBeforePublishingLeavesTheStoreAsItWas) {
  add({"cpu.reference"});
  Engine engine(registry_, host_);
  const LoadRequest req = load_request();
  const std::vector<int8_t> first(kN * kK, 1), second(kN * kK, 2);
  ASSERT_TRUE(engine.load(req, first).ok());
  const std::string first_sha = sha256_hex(first.data(), first.size());
  // An upload of `second` under `name`, every byte received, ready to commit.
  auto upload = [&](const std::string& name, bool replace,
                    const std::string& forced) -> absl::StatusOr<std::unique_ptr<LayerUpload>> {
    LoadRequest up = req;
    up.name = name;
    up.replace = replace;
    up.forced_kernel = forced;
    up.weight_sha256 = sha256_hex(second.data(), second.size());
    ASSIGN_OR_RETURN(std::unique_ptr<LayerUpload> u, engine.begin_upload(up));
    RETURN_IF_ERROR(
        u->append(absl::string_view(reinterpret_cast<const char*>(second.data()), second.size())));
    return u;
  };

  for (const bool replace : {true, false}) {
    SCOPED_TRACE(replace ? "replacing l" : "a new name");
    auto u = upload(replace ? "l" : "fresh", replace, "");
    ASSERT_TRUE(u.ok()) << u.status();
    int asked = 0;
    auto r = (*u)->commit([&asked] {
      ++asked;
      return true;
    });
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
    EXPECT_NE(r.status().message().find("nothing was loaded or replaced"), std::string::npos)
        << r.status();
    EXPECT_EQ(asked, 1);
  }
  auto kept = engine.store().get("l");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)->layer->options().weight_sha256, first_sha);
  EXPECT_EQ(engine.store().get("fresh").status().code(), absl::StatusCode::kNotFound);

  // Not cancelled: published as before.
  auto u = upload("fresh", false, "");
  ASSERT_TRUE(u.ok()) << u.status();
  auto r = (*u)->commit([] { return false; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(engine.store().get("fresh").ok());

  auto refused = upload("forced", false, "cpu.magic");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "unknown forced_kernel 'cpu.magic'");
}

// The host's memory running out while a layer is built (here a kernel's prepare that throws
// std::bad_alloc on the second load) fails that load with RESOURCE_EXHAUSTED and the reason (it
// reached the client as UNKNOWN); the layer it would replace stays served, and a later load works.
TEST_F(LayerTest, ALoadOutOfMemoryWhileBuiltLeavesTheServedLayer) {
  Fake f{"cpu.reference"};
  f.prepare_result = [](int before) -> absl::Status {
    if (before == 1) throw std::bad_alloc();
    return absl::OkStatus();
  };
  add(std::move(f));
  Engine engine(registry_, host_);
  LoadRequest req = load_request();
  const std::vector<int8_t> first(kN * kK, 1), second(kN * kK, 2);
  ASSERT_TRUE(engine.load(req, first).ok());
  req.replace = true;
  const auto failed = engine.load(req, second);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
  EXPECT_EQ(failed.status().message(),
            "layer 'l': out of host memory while it was being built; nothing was loaded or "
            "replaced");
  auto kept = engine.store().get("l");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)->layer->options().weight_sha256, sha256_hex(first.data(), first.size()));
  const auto replaced = engine.load(req, second);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_TRUE(replaced->replaced);
}

// A forced kernel that is registered but cannot run the layer (not supported on this host, or
// declining every shape of it) is FAILED_PRECONDITION with the kernel's reason: at Layer::create,
// at an upload's header and at Engine::load; and a request forcing it on a layer loaded without
// it is refused the same way, before it is queued.
TEST_F(LayerTest, AForcedKernelThatCannotRunTheLayerIsAFailedPreconditionWithTheReason) {
  Fake unsupported{"cuda.cublaslt"};
  unsupported.supported = absl::FailedPreconditionError("fake cublaslt: no usable GPU");
  add(std::move(unsupported));
  add({"cpu.avx512_vnni", unmeasurable(), [](const ProblemShape&) {
         return absl::FailedPreconditionError("fake vnni: K must be a multiple of 128");
       }});
  add({"cpu.reference"});
  Engine engine(registry_, host_);
  const std::vector<int8_t> w(kN * kK, 1);
  LoadRequest plain = load_request();
  plain.weight_sha256 = sha256_hex(w.data(), w.size());
  ASSERT_TRUE(engine.load(plain, w).ok());

  for (const auto& [forced, reason] : std::vector<std::pair<std::string, std::string>>{
           {"cuda.cublaslt", "fake cublaslt: no usable GPU"},
           {"cpu.avx512_vnni", "fake vnni: K must be a multiple of 128"}}) {
    SCOPED_TRACE(forced);
    const std::string want =
        absl::StrCat("forced kernel ", forced, " cannot run this layer: ", reason);
    auto layer = create(/*autotune=*/true, forced);
    ASSERT_FALSE(layer.ok());
    EXPECT_EQ(layer.status().code(), absl::StatusCode::kFailedPrecondition) << layer.status();
    EXPECT_EQ(layer.status().message(), want);

    LoadRequest req = plain;
    req.name = "forced";
    req.forced_kernel = forced;
    auto upload = engine.begin_upload(req);
    ASSERT_FALSE(upload.ok());
    EXPECT_EQ(upload.status().code(), absl::StatusCode::kFailedPrecondition) << upload.status();
    EXPECT_EQ(upload.status().message(), want);
    auto loaded = engine.load(req, w);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition) << loaded.status();
    EXPECT_EQ(loaded.status().message(), want);
    EXPECT_EQ(engine.store().get("forced").status().code(), absl::StatusCode::kNotFound);

    const std::string x(static_cast<size_t>(kK) * 2, '\0');
    InferInput in;
    in.layer = "l";
    in.m = 1;
    in.x = x;
    in.forced_kernel = forced;
    std::string y;
    InferOutput out;
    const absl::Status s = engine.infer(in, CallContext{}, &y, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(s.message(),
              absl::StrCat("forced kernel ", forced, " cannot run this request: ", reason));
  }
}

// Loads that time take turns. An upload whose client gives up while it waits for another load's
// turn is not built (neither prepared nor timed) and is told it was cancelled; the load it waited
// for is published.
TEST_F(LayerTest, AnUploadCancelledWhileWaitingForAnotherLoadIsNotBuilt) {
  auto timing = std::make_shared<absl::Notification>();
  auto release = std::make_shared<absl::Notification>();
  auto first = std::make_shared<std::atomic<bool>>(true);
  add({"cuda.cutlass_sm90",
       [timing, release, first](const ProblemShape& s) -> absl::StatusOr<double> {
         if (s.n == kN && first->exchange(false)) {  // (not FakeKernel::measurable's probe)
           timing->Notify();
           release->WaitForNotification();
         }
         return 20.0;
       }});
  add({"cuda.cublaslt", fixed_us(10.0)});  // (a load times where it has two candidates)
  add({"cpu.reference"});
  EngineOptions eo;
  eo.share_tuning = false;  // else the second load would take the first's times and time nothing
  Engine engine(registry_, host_, eo);
  const LoadRequest req = load_request();
  absl::Status loaded;
  std::thread loading([&] { loaded = engine.load(req, std::vector<int8_t>(kN * kK, 1)).status(); });
  // The first load now holds the turn.
  if (!timing->WaitForNotificationWithTimeout(absl::Seconds(30))) {
    release->Notify();
    loading.join();
    FAIL() << "the first load never timed cuda.cutlass_sm90: " << loaded;
  }
  const int prepared = log_->prepare_count("cuda.cutlass_sm90");

  LoadRequest up = req;
  up.name = "second";
  const std::vector<int8_t> w(kN * kK, 2);
  up.weight_sha256 = sha256_hex(w.data(), w.size());
  auto u = engine.begin_upload(up);
  ASSERT_TRUE(u.ok()) << u.status();
  ASSERT_TRUE(
      (*u)->append(absl::string_view(reinterpret_cast<const char*>(w.data()), w.size())).ok());
  std::atomic<bool> cancel{false};
  absl::StatusOr<LoadResult> r;
  std::thread committing([&] { r = (*u)->commit([&cancel] { return cancel.load(); }); });
  absl::SleepFor(absl::Milliseconds(50));  // (the commit waits for the first load's turn)
  cancel = true;
  release->Notify();
  loading.join();
  committing.join();

  EXPECT_TRUE(loaded.ok()) << loaded;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(r.status().message(),
            "upload cancelled before its layer was built; nothing was loaded or replaced");
  EXPECT_EQ(log_->prepare_count("cuda.cutlass_sm90"), prepared);
  EXPECT_EQ(engine.store().get("second").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine.store().get(req.name).ok());
}

// An engine creates one layer at a time, so that no load's timing runs beside another's: loads of
// one shape started at once measure once (the first; the others take its times), and with shared
// tuning off each measures, never two at the same time.
TEST_F(LayerTest, EngineLoadsStartedAtOnceNeverTimeTogether) {
  auto in_flight = std::make_shared<std::atomic<int>>(0);
  auto most = std::make_shared<std::atomic<int>>(0);
  auto timed = [in_flight, most](double us) -> Measure {
    return [in_flight, most, us](const ProblemShape& s) -> absl::StatusOr<double> {
      if (s.n != kN) return us;  // FakeKernel::measurable's probe, not a measurement
      const int now = in_flight->fetch_add(1) + 1;
      int seen = most->load();
      while (now > seen && !most->compare_exchange_weak(seen, now)) {
      }
      absl::SleepFor(absl::Milliseconds(1));
      in_flight->fetch_sub(1);
      return us;
    };
  };
  add({"cuda.cutlass_sm90", timed(20.0)});
  add({"cuda.cublaslt", timed(10.0)});
  add({"cpu.reference"});
  for (const bool share : {true, false}) {
    SCOPED_TRACE(share ? "shared tuning" : "each layer times its own");
    EngineOptions eo;
    eo.share_tuning = share;
    Engine engine(registry_, host_, eo);
    const int before = log_->measure_count("cuda.cutlass_sm90");
    constexpr int kLoads = 6;
    std::vector<std::thread> loads;
    std::vector<absl::Status> results(kLoads);
    for (int i = 0; i < kLoads; ++i) {
      loads.emplace_back([&, i] {
        LoadRequest req;
        req.name = absl::StrCat("l", i);
        req.spec.n = kN;
        req.spec.k = kK;
        req.spec.weight_scale = {0.002f};
        req.spec.weight_scale_shape = {1};
        results[i] = engine.load(req, std::vector<int8_t>(kN * kK, 1)).status();
      });
    }
    for (std::thread& t : loads) t.join();
    for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(most->load(), 1);
    EXPECT_EQ(log_->measure_count("cuda.cutlass_sm90") - before, share ? 6 : 6 * kLoads);
    for (int i = 0; i < kLoads; ++i) {
      const auto served = engine.store().get(absl::StrCat("l", i));
      ASSERT_TRUE(served.ok()) << served.status();
      EXPECT_EQ((*served)->layer->buckets()[0].kernel, "cuda.cublaslt");
    }
  }
}

// A kernel that takes host memory (a CPU kernel's copy of the weights) is prepared only where the
// host has what it says it needs: a load that lacks it fails RESOURCE_EXHAUSTED rather than the
// process being killed for memory, and so does a request that would prepare one on demand, while
// the layer serves on with what it has. A GPU kernel's bytes are not the host's.
TEST_F(LayerTest, AKernelNeedingMoreHostMemoryThanIsLeftIsNotPrepared) {
  add({"cuda.cutlass_sm90", unmeasurable(), declines_x(DType::kF32, "no f32 here"), MRange{},
       int64_t{1} << 30});
  add({"cpu.avx512_vnni", fixed_us(10.0), nullptr, MRange{}, 1 << 20});
  add({"cpu.avx2", fixed_us(20.0), nullptr, MRange{}, 1 << 20});
  add({"cpu.reference"});
  auto avail = std::make_shared<std::atomic<int64_t>>(1 << 19);
  auto make = [&](bool autotune) {
    Layer::Options o;
    o.name = "l";
    o.autotune = autotune;
    o.host_memory = std::make_shared<HostMemoryLedger>([avail] { return avail->load(); });
    return Layer::create(std::move(o), weights(), registry_, host_);
  };
  auto refused = make(true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(),
            "cpu.avx512_vnni needs about 1048576 bytes of host memory for layer 'l' (its copy of "
            "the weights); only 524288 are available (the host's MemAvailable, or a container's "
            "memory limit less its use)");
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 0);

  // Each kernel is checked against the memory left as it is prepared.
  *avail = 3 << 19;
  auto layer = make(false);  // the priority order: cpu.avx2, covered, is left for on demand
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(log_->prepare_count("cuda.cutlass_sm90"), 2);  // one for each load
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 0);
  *avail = 1 << 19;
  auto forced = (*layer)->choose(shape(8), "cpu.avx2", false);
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(forced.status().code(), absl::StatusCode::kResourceExhausted) << forced.status();
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 0);
  EXPECT_EQ(chosen(**layer, shape(8)), "cuda.cutlass_sm90");
  EXPECT_EQ(chosen(**layer, shape(8, DType::kF32)), "cpu.avx512_vnni");
  // Unknown (no MemAvailable, no limit): prepared.
  *avail = -1;
  forced = (*layer)->choose(shape(8), "cpu.avx2", false);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_TRUE(forced->prepared_now);
}

// Kernels' copies of the weights prepared at once on two layers each reserve their host memory
// until their pages are taken (the memory available, read alone, would let both through and the
// process be killed): with room for one copy, one of two loads started together fails
// RESOURCE_EXHAUSTED saying so, and an upload's header is refused while a copy is under way.
// A load after them, with the room back, is prepared.
TEST_F(LayerTest, KernelsPreparedAtOnceShareTheHostMemoryLeft) {
  Fake packing{"cpu.avx2", unmeasurable(), nullptr, MRange{}, 1 << 20};
  packing.prepare_time = absl::Seconds(1);  // the copy's pages not taken yet meanwhile
  add(std::move(packing));
  add({"cpu.reference"});
  EngineOptions eo;
  eo.available_memory = [] { return int64_t{3} << 19; };  // room for one copy of 1 MiB
  Engine engine(registry_, host_, eo);
  std::vector<absl::Status> results(2);
  std::vector<std::thread> loads;
  for (int i = 0; i < 2; ++i) {
    loads.emplace_back([&, i] {
      LoadRequest req = load_request();
      req.name = absl::StrCat("l", i);
      results[i] = engine.load(req, std::vector<int8_t>(kN * kK, 1)).status();
    });
  }
  // Once one load is preparing its copy (its reservation held until the prepare returns, 1 s on):
  while (log_->prepare_count("cpu.avx2") == 0) absl::SleepFor(absl::Milliseconds(1));
  LoadRequest up = load_request();
  up.name = "up";
  up.spec.n = 1024;
  up.spec.k = 1024;  // 1 MiB of weights: fits the memory left, not beside a copy under way
  up.weight_sha256 = std::string(64, '0');
  auto upload = engine.begin_upload(up);
  for (std::thread& t : loads) t.join();
  const int ok = static_cast<int>(results[0].ok()) + static_cast<int>(results[1].ok());
  EXPECT_EQ(ok, 1) << results[0] << " / " << results[1];
  for (const absl::Status& s : results) {
    if (s.ok()) continue;
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("cpu.avx2 needs about 1048576 bytes of host memory"),
              absl::string_view::npos)
        << s;
    EXPECT_NE(s.message().find("beside other allocations under way"), absl::string_view::npos) << s;
  }
  ASSERT_FALSE(upload.ok());
  EXPECT_EQ(upload.status().code(), absl::StatusCode::kResourceExhausted) << upload.status();
  EXPECT_NE(upload.status().message().find("beside other allocations under way"),
            absl::string_view::npos)
      << upload.status();
  LoadRequest later = load_request();
  later.name = "later";
  EXPECT_TRUE(engine.load(later, std::vector<int8_t>(kN * kK, 1)).ok());
}

// A kernel whose prepare on demand (a forced request) runs out of host memory (bad_alloc) answers
// that request RESOURCE_EXHAUSTED, naming the kernel, and the layer serves on.
TEST_F(LayerTest, AForcedPrepareOutOfMemoryIsResourceExhausted) {
  add({"cpu.avx512_vnni"});
  add({"cpu.avx2", unmeasurable(), nullptr, MRange{}, 0,
       [](int) -> absl::Status { throw std::bad_alloc(); }});
  add({"cpu.reference"});
  Engine engine(registry_, host_);
  ASSERT_TRUE(engine.load(load_request(), std::vector<int8_t>(kN * kK, 1)).ok());
  EXPECT_EQ(log_->prepare_count("cpu.avx2"), 0) << "covered: prepared on demand only";
  const std::string x(static_cast<size_t>(kK) * 2, '\0');
  InferInput in;
  in.layer = "l";
  in.m = 1;
  in.x = x;
  in.forced_kernel = "cpu.avx2";
  std::string y;
  InferOutput out;
  absl::Status s = absl::OkStatus();
  EXPECT_NO_THROW(s = engine.infer(in, CallContext{}, &y, &out));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(), "out of host memory preparing cpu.avx2 for layer 'l'");
  in.forced_kernel = {};
  EXPECT_TRUE(engine.infer(in, CallContext{}, &y, &out).ok());
  EXPECT_EQ(out.kernel, "cpu.avx512_vnni");
}

TEST_F(LayerTest, CoveredLowerPriorityKernelsAreNotPreparedAtLoad) {
  // cutlass runs every shape, so the CPU kernels behind it can never be chosen unforced.
  for (bool autotune : {true, false}) {
    SCOPED_TRACE(autotune ? "autotune" : "priority order");
    log_ = std::make_shared<Log>();
    registry_ = Registry();
    add({"cuda.cutlass_sm90", fixed_us(20.0), nullptr, MRange{}, 1000});
    add({"cpu.avx512_vnni", unmeasurable(), nullptr, MRange{}, 1 << 20});
    add({"cpu.reference", unmeasurable(), nullptr, MRange{}, 7});
    auto layer = create(autotune);
    ASSERT_TRUE(layer.ok()) << layer.status();
    EXPECT_EQ(log_->prepare_count("cuda.cutlass_sm90"), 1);
    EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 0);
    EXPECT_EQ(log_->prepare_count("cpu.reference"), 0);
    EXPECT_EQ((*layer)->total_bytes(), weight_bytes(**layer) + 1000);
    for (const BucketInfo& b : (*layer)->buckets()) {
      EXPECT_EQ(b.kernel, "cuda.cutlass_sm90");
      for (DType x : kDTypes) {
        EXPECT_EQ(chosen(**layer, shape(b.bucket.lo, x, DType::kF32)), "cuda.cutlass_sm90");
      }
    }
    EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 0);  // unforced requests never need it
    EXPECT_EQ(log_->prepare_count("cpu.reference"), 0);
  }
}

TEST_F(LayerTest, MeasurableKernelsArePreparedForAutotuneEvenWhenCovered) {
  // cublaslt runs nothing cutlass cannot, but it may measure faster: autotune must see it.
  add({"cuda.cutlass_sm90", fixed_us(20.0)});
  add({"cuda.cublaslt", fixed_us(10.0)});
  add({"cpu.reference"});
  auto tuned = create();
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_EQ(log_->prepare_count("cuda.cublaslt"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.reference"), 0);
  EXPECT_EQ((*tuned)->buckets()[1].kernel, "cuda.cublaslt");
  EXPECT_EQ(chosen(**tuned, shape(16)), "cuda.cublaslt");
  // Without autotune the priority order decides, and cutlass covers it.
  auto plain = create(/*autotune=*/false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(log_->prepare_count("cuda.cublaslt"), 1);  // still only the tuned layer's
  EXPECT_EQ(chosen(**plain, shape(16)), "cuda.cutlass_sm90");
}

TEST_F(LayerTest, KernelsNeededForSomeDtypeOrBucketArePreparedAtLoad) {
  // cutlass declines fp32 input: avx512 serves it, and so is prepared; onednn and the reference
  // are covered by the two.
  add({"cuda.cutlass_sm90", unmeasurable(), declines_x(DType::kF32, "fake cutlass: no fp32"),
       MRange{}, 1000});
  add({"cpu.avx512_vnni", unmeasurable(), nullptr, MRange{}, 1 << 20});
  add({"cpu.onednn", unmeasurable(), nullptr, MRange{}, 1 << 21});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(log_->prepare_count("cuda.cutlass_sm90"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.onednn"), 0);
  EXPECT_EQ(log_->prepare_count("cpu.reference"), 0);
  EXPECT_EQ((*layer)->total_bytes(), weight_bytes(**layer) + 1000 + (1 << 20));
  EXPECT_EQ(chosen(**layer, shape(1, DType::kF32)), "cpu.avx512_vnni");
  EXPECT_EQ(chosen(**layer, shape(3000, DType::kF32)), "cpu.avx512_vnni");
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 1);  // prepared once, at load

  // gemv prefers M = 1 only: the reference behind it serves every other bucket.
  log_ = std::make_shared<Log>();
  registry_ = Registry();
  add({"cuda.gemv_s8", unmeasurable(), nullptr, MRange{1, 1}});
  add({"cpu.reference"});
  auto bucketed = create();
  ASSERT_TRUE(bucketed.ok()) << bucketed.status();
  EXPECT_EQ(log_->prepare_count("cuda.gemv_s8"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.reference"), 1);
  EXPECT_EQ(chosen(**bucketed, shape(1)), "cuda.gemv_s8");
  EXPECT_EQ(chosen(**bucketed, shape(2)), "cpu.reference");
}

TEST_F(LayerTest, ForcingAnUnpreparedKernelPreparesItOnceAndServes) {
  add({"cuda.cutlass_sm90", unmeasurable(), nullptr, MRange{}, 1000});
  add({"cpu.avx512_vnni", unmeasurable(), nullptr, MRange{}, 1 << 20, nullptr,
       absl::Milliseconds(50)});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  ASSERT_EQ(log_->prepare_count("cpu.avx512_vnni"), 0);
  const int64_t before = (*layer)->total_bytes();

  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<KernelChoice>> results(kThreads, absl::UnknownError("not run"));
  absl::Notification go;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      go.WaitForNotification();
      results[i] = (*layer)->choose(shape(16), "cpu.avx512_vnni", /*explain=*/i % 2 == 0);
    });
  }
  go.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 1);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->kernel->name(), "cpu.avx512_vnni");
    EXPECT_EQ(r->prepared, results[0]->prepared);  // one prepared kernel, shared
  }
  EXPECT_EQ((*layer)->total_bytes(), before + (1 << 20));
  ASSERT_TRUE(results[0]->prepared->run(RunArgs{}, nullptr).ok());
  EXPECT_EQ(log_->run_count("cpu.avx512_vnni"), 1);
  // Later requests, forced or not, reuse it; unforced ones still run cutlass.
  auto again = (*layer)->choose(shape(1), "cpu.avx512_vnni", false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->prepared, results[0]->prepared);
  EXPECT_EQ(chosen(**layer, shape(1)), "cuda.cutlass_sm90");
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 1);
  EXPECT_EQ((*layer)->total_bytes(), before + (1 << 20));
  EXPECT_EQ((*layer)->buckets()[1].kernel, "cuda.cutlass_sm90");  // the choices are unchanged
}

TEST_F(LayerTest, UnforcedRequestBetweenTheProbedShapesPreparesTheKernelThatRuns) {
  // cutlass declines M 5..10, which the load-time probes (the buckets' ends) never see.
  add({"cuda.cutlass_sm90", unmeasurable(), [](const ProblemShape& s) {
         return s.m >= 5 && s.m <= 10 ? absl::FailedPreconditionError("fake cutlass: not M 5..10")
                                      : absl::OkStatus();
       }});
  add({"cpu.avx512_vnni", unmeasurable(), nullptr, MRange{}, 1 << 20});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 0);
  EXPECT_EQ(chosen(**layer, shape(7)), "cpu.avx512_vnni");  // hot path and explained path
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 1);
  EXPECT_EQ(log_->prepare_count("cpu.reference"), 0);
  EXPECT_EQ((*layer)->total_bytes(), weight_bytes(**layer) + (1 << 20));
}

TEST_F(LayerTest, FailedLazyPrepareIsTheRequestsStatusAndIsRetried) {
  add({"cuda.cutlass_sm90"});
  add({"cpu.avx512_vnni", unmeasurable(), nullptr, MRange{}, 1 << 20, [](int before) {
         if (before == 0) return absl::ResourceExhaustedError("fake: out of host memory");
         if (before == 1) return absl::FailedPreconditionError("fake: not today");
         return absl::OkStatus();
       }});
  add({"cpu.reference"});
  auto layer = create();
  ASSERT_TRUE(layer.ok()) << layer.status();
  const int64_t before = (*layer)->total_bytes();
  auto first = (*layer)->choose(shape(16), "cpu.avx512_vnni", false);
  EXPECT_EQ(first.status().code(), absl::StatusCode::kResourceExhausted) << first.status();
  EXPECT_EQ(first.status().message(), "fake: out of host memory");
  auto second = (*layer)->choose(shape(16), "cpu.avx512_vnni", true);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_EQ((*layer)->total_bytes(), before);  // nothing was prepared
  auto third = (*layer)->choose(shape(16), "cpu.avx512_vnni", false);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->kernel->name(), "cpu.avx512_vnni");
  EXPECT_NE(third->prepared, nullptr);
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 3);
  EXPECT_EQ((*layer)->total_bytes(), before + (1 << 20));
  EXPECT_EQ(chosen(**layer, shape(16)), "cuda.cutlass_sm90");  // unforced requests never failed
}

TEST_F(LayerTest, TheLayersForcedKernelIsPreparedAtLoad) {
  add({"cuda.cutlass_sm90", unmeasurable(), nullptr, MRange{}, 1000});
  add({"cpu.avx512_vnni"});
  add({"cpu.reference", unmeasurable(), nullptr, MRange{}, 7});
  auto layer = create(/*autotune=*/true, "cpu.reference");
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ(log_->prepare_count("cpu.reference"), 1);
  // Every unforced request runs the forced kernel, so nothing else is prepared.
  EXPECT_EQ(log_->prepare_count("cuda.cutlass_sm90"), 0);
  EXPECT_EQ(log_->prepare_count("cpu.avx512_vnni"), 0);
  EXPECT_EQ((*layer)->total_bytes(), weight_bytes(**layer) + 7);
  EXPECT_EQ((*layer)->buckets()[0].kernel, "cpu.reference");
  auto c = (*layer)->choose(shape(16), "", false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernel->name(), "cpu.reference");
  EXPECT_EQ(log_->prepare_count("cpu.reference"), 1);

  // A forced kernel whose prepare fails fails the load with that status.
  log_ = std::make_shared<Log>();
  registry_ = Registry();
  add({"cuda.cutlass_sm90"});
  add({"cpu.reference", unmeasurable(), nullptr, MRange{}, 0,
       [](int) { return absl::ResourceExhaustedError("fake: out of host memory"); }});
  auto failed = create(/*autotune=*/true, "cpu.reference");
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
}

}  // namespace
}  // namespace qlinear
