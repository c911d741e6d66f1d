// Shared pieces of the CUDA kernel tests: the per-run seed, the GPU gate, random layers and
// activations with awkward rows, and the reference's answer for every intermediate.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "kernels/core/dtype.h"
#include "kernels/core/host_info.h"
#include "kernels/core/layer.h"
#include "kernels/core/weights.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_host_call.h"
#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/test_seed.h"

namespace qlinear::gpu::testing {

// The run's seed: QLINEAR_TEST_SEED when set (to replay a failure), otherwise fresh.
inline uint64_t run_seed() { return qlinear::testing::test_seed(); }

inline std::string seed_note() {
  return absl::StrCat("random data from QLINEAR_TEST_SEED=", run_seed(), " (set it to replay)");
}

// One generator per test, derived from the run seed and the test's name, so that a test replays
// alone with the same data.
inline SplitMix64 test_rng() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  uint64_t h = run_seed();
  for (const char* p : {info->test_suite_name(), info->name()}) {
    for (; *p != '\0'; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 0x100000001b3ull;
  }
  return SplitMix64(h);
}

// Skips the calling test, with the reason, when no GPU this binary can run on is present.
#define QLINEAR_REQUIRE_GPU()                                                               \
  do {                                                                                      \
    const ::absl::Status _gpu = ::qlinear::gpu::cuda_device_usable(::qlinear::host_info()); \
    if (!_gpu.ok()) GTEST_SKIP() << "no usable GPU: " << _gpu.message();                    \
  } while (0)

inline const Scheme kSchemes[] = {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric,
                                  Scheme::kDynamicAsymmetric, Scheme::kStaticAsymmetric};
inline const DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// A random layer: int8 weights over the full range, weight scales over several decades (large
// ones push fp16 outputs past 65504), optional bias, and static parameters where the scheme
// needs them.
inline std::shared_ptr<const LayerWeights> make_layer(SplitMix64& rng, Scheme scheme, int64_t n,
                                                      int64_t k, bool bias) {
  LayerSpec spec;
  spec.n = n;
  spec.k = k;
  spec.scheme = scheme;
  const float sb_decade = static_cast<float>(rng.range(-5, 0));
  spec.weight_scale.resize(static_cast<size_t>(n));
  for (float& s : spec.weight_scale) s = std::pow(10.f, sb_decade + rng.uniform(0.f, 1.f));
  spec.weight_scale_shape = {n};
  if (bias) spec.bias = random_floats(rng, static_cast<size_t>(n), -4.f, 4.f);
  if (is_static(scheme)) {
    spec.has_input_scale = true;
    spec.input_scale = std::pow(10.f, rng.uniform(-3.f, 0.f));
  }
  if (scheme == Scheme::kStaticAsymmetric) {
    spec.has_input_zero_point = true;
    spec.input_zero_point = static_cast<int32_t>(rng.range(-128, 127));
  }
  auto lw = build_layer_weights(spec, random_int8(rng, static_cast<size_t>(n * k)));
  EXPECT_TRUE(lw.ok()) << lw.status();
  return lw.ok() ? *lw : nullptr;
}

// Activations [m, k] in dtype t. Most rows are random at a random magnitude; some are all zero,
// constant, one-hot, tiny (subnormal-range scales) or huge (near the type's maximum), the rows
// where quantization has its special cases.
inline std::vector<uint8_t> make_x(SplitMix64& rng, int64_t m, int64_t k, DType t,
                                   bool awkward_rows = true) {
  std::vector<uint8_t> x(static_cast<size_t>(m * k) * dtype_size(t));
  const float type_max = t == DType::kF16 ? 60000.f : 3.0e38f;
  const float type_tiny = t == DType::kF16 ? 1e-7f : 1e-40f;
  for (int64_t r = 0; r < m; ++r) {
    const int64_t kind = awkward_rows ? rng.range(0, 19) : 0;
    const float scale = std::pow(10.f, rng.uniform(-3.f, 3.f));
    const float offset = rng.range(0, 3) == 0 ? rng.uniform(-2.f, 2.f) * scale : 0.f;
    const float constant = rng.uniform(-8.f, 8.f);
    const int64_t hot = rng.range(0, k - 1);
    for (int64_t i = 0; i < k; ++i) {
      float v;
      switch (kind) {
        case 15:
          v = 0.f;
          break;
        case 16:
          v = constant;
          break;
        case 17:
          v = i == hot ? constant : 0.f;
          break;
        case 18:
          v = rng.uniform(-1.f, 1.f) * type_tiny;
          break;
        case 19:
          v = rng.uniform(-1.f, 1.f) * type_max;
          break;
        default:
          v = offset + rng.uniform(-1.f, 1.f) * scale;
          break;
      }
      store_from_f32(x.data(), t, static_cast<size_t>(r * k + i), v);
    }
  }
  return x;
}

// Everything the reference computes for one call.
struct Expected {
  absl::Status status;
  std::vector<int8_t> xq;
  std::vector<float> sa;
  std::vector<int32_t> azp;
  std::vector<int32_t> acc;
  std::vector<uint8_t> y;
};

inline Expected reference_run(const LayerWeights& w, const void* x, DType xt, int64_t m, DType yt) {
  const LayerConfig& c = w.config;
  Expected e;
  e.xq.resize(static_cast<size_t>(m * c.k));
  e.sa.resize(static_cast<size_t>(m));
  e.azp.assign(static_cast<size_t>(m), 0);
  e.status = reference::quantize_activations(c, x, xt, m, e.xq.data(), e.sa.data(), e.azp.data());
  if (!e.status.ok()) return e;
  e.acc.resize(static_cast<size_t>(m * c.n));
  reference::gemm_s8s8_s32(e.xq.data(), w.w.data(), m, c.n, c.k, e.acc.data());
  e.y.resize(static_cast<size_t>(m * c.n) * dtype_size(yt));
  reference::epilogue(w, e.acc.data(), e.sa.data(), e.azp.data(), m, e.y.data(), yt);
  return e;
}

inline bool is_nan_bits(const uint8_t* p, DType t) {
  if (t == DType::kF32) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return (u & 0x7fffffffu) > 0x7f800000u;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::kBF16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}

// Index of the first element of y whose bits differ, or -1. A NaN matches any NaN: the payload
// of a NaN born in arithmetic (an Inf scale times zero, only with scales that overflow) is the
// hardware's choice, not the SPEC's.
inline int64_t first_y_mismatch(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                                DType t) {
  const size_t es = dtype_size(t);
  if (want.size() != got.size()) return 0;
  for (size_t i = 0; i < want.size() / es; ++i) {
    const uint8_t* a = want.data() + i * es;
    const uint8_t* b = got.data() + i * es;
    if (std::memcmp(a, b, es) == 0) continue;
    if (is_nan_bits(a, t) && is_nan_bits(b, t)) continue;
    return static_cast<int64_t>(i);
  }
  return -1;
}

// "" when row r of y [rows, n] (type t, its bytes) matches want's bit for bit (a NaN any NaN, as
// first_y_mismatch), else where it first differs and how.
inline std::string y_row_mismatch(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                                  int64_t r, int64_t n, DType t) {
  const size_t row_bytes = static_cast<size_t>(n) * dtype_size(t);
  const std::vector<uint8_t> wr(want.begin() + r * row_bytes, want.begin() + (r + 1) * row_bytes);
  const std::vector<uint8_t> gr(got.begin() + r * row_bytes, got.begin() + (r + 1) * row_bytes);
  const int64_t i = first_y_mismatch(wr, gr, t);
  if (i < 0) return "";
  return absl::StrCat("row ", r, " col ", i, " want ", load_as_f32(wr.data(), t, i), " got ",
                      load_as_f32(gr.data(), t, i));
}

template <typename T>
int64_t first_mismatch(const std::vector<T>& want, const std::vector<T>& got) {
  if (want.size() != got.size()) return 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

// A CUDA kernel prepared for a layer, with the layer kept alive beside it.
struct Prepared {
  std::shared_ptr<const LayerWeights> weights;
  std::unique_ptr<PreparedKernel> owner;
  const CudaPreparedKernel* kernel = nullptr;
};

// (With `tuning`, what the kernel times at load is shared through it; `on_demand`: prepared as a
// request prepares a kernel the load did not. See PrepareContext.)
inline Prepared prepare(const Kernel& k, std::shared_ptr<const LayerWeights> w,
                        TuningCache* tuning = nullptr, bool on_demand = false) {
  Prepared p;
  p.weights = std::move(w);
  auto st = k.prepare_with_tuning(*p.weights, PrepareContext{tuning, on_demand});
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return p;
  p.owner = std::move(st).value();
  p.kernel = dynamic_cast<const CudaPreparedKernel*>(p.owner.get());
  EXPECT_NE(p.kernel, nullptr);
  return p;
}

inline std::string describe(const LayerConfig& c, int64_t m, DType xt, DType yt) {
  return absl::StrCat(scheme_name(c.scheme), " M=", m, " N=", c.n, " K=", c.k,
                      " x=", dtype_name(xt), " y=", dtype_name(yt),
                      c.has_bias ? " bias" : " no-bias");
}

// The arguments of a call of m rows of x (dtype xt) into y (dtype yt), without sa or azp.
inline RunArgs make_run_args(const std::vector<uint8_t>& x, DType xt, int64_t m,
                             std::vector<uint8_t>* y, DType yt) {
  RunArgs args;
  args.x = x.data();
  args.x_dtype = xt;
  args.m = m;
  args.y = y->data();
  args.y_dtype = yt;
  return args;
}

// Runs one call through run_debug and compares every intermediate with the reference. Returns
// false after the first mismatch (reported as a test failure).
inline bool check_call(const Prepared& p, const std::vector<uint8_t>& x, DType xt, int64_t m,
                       DType yt) {
  const LayerWeights& w = *p.weights;
  const LayerConfig& c = w.config;
  const std::string what = describe(c, m, xt, yt);
  const Expected want = reference_run(w, x.data(), xt, m, yt);

  std::vector<uint8_t> y(static_cast<size_t>(m * c.n) * dtype_size(yt), 0xA5);  // poisoned
  const RunArgs args = make_run_args(x, xt, m, &y, yt);
  DebugOutputs got;
  const absl::Status st = p.kernel->run_debug(args, &got);
  if (!want.status.ok()) {
    EXPECT_EQ(st.code(), want.status.code()) << what << ": " << st;
    EXPECT_EQ(st.message(), want.status.message()) << what;
    return st.code() == want.status.code() && st.message() == want.status.message();
  }
  if (!st.ok()) {
    ADD_FAILURE() << what << ": " << st;
    return false;
  }
  if (int64_t i = first_mismatch(want.xq, got.xq); i >= 0) {
    ADD_FAILURE() << what << ": xq differs at row " << i / c.k << " col " << i % c.k << ": want "
                  << int{want.xq[i]} << " got " << int{got.xq[i]} << " (sa want "
                  << want.sa[i / c.k] << ")";
    return false;
  }
  if (int64_t i = first_mismatch(want.sa, got.sa); i >= 0) {
    ADD_FAILURE() << what << ": sa differs at row " << i << ": want " << want.sa[i] << " got "
                  << got.sa[i];
    return false;
  }
  if (int64_t i = first_mismatch(want.azp, got.azp); i >= 0) {
    ADD_FAILURE() << what << ": azp differs at row " << i << ": want " << want.azp[i] << " got "
                  << got.azp[i];
    return false;
  }
  if (int64_t i = first_mismatch(want.acc, got.acc); i >= 0) {
    ADD_FAILURE() << what << ": acc differs at row " << i / c.n << " col " << i % c.n << ": want "
                  << want.acc[i] << " got " << got.acc[i];
    return false;
  }
  if (int64_t i = first_y_mismatch(want.y, y, yt); i >= 0) {
    const size_t es = dtype_size(yt);
    ADD_FAILURE() << what << ": y differs at row " << i / c.n << " col " << i % c.n << ": want "
                  << load_as_f32(want.y.data(), yt, i) << " got " << load_as_f32(y.data(), yt, i)
                  << " (acc " << want.acc[i] << ", sa " << want.sa[i / c.n] << ", sb "
                  << w.sb[i % c.n] << ", " << es << "-byte elements)";
    return false;
  }
  return true;
}

// One `run` call (the serving path, no debug outputs) checked against the reference: y, sa and
// azp bit for bit, the timings filled, or the reference's error with y untouched.
inline bool check_run(const Prepared& p, const std::vector<uint8_t>& x, DType xt, int64_t m,
                      DType yt) {
  const LayerConfig& c = p.weights->config;
  const std::string what = describe(c, m, xt, yt);
  const Expected want = reference_run(*p.weights, x.data(), xt, m, yt);
  std::vector<uint8_t> y(static_cast<size_t>(m * c.n) * dtype_size(yt), 0xA5);
  const std::vector<uint8_t> poisoned = y;
  std::vector<float> sa(static_cast<size_t>(m), -1.f);
  std::vector<int32_t> azp(static_cast<size_t>(m), -7);
  RunArgs args = make_run_args(x, xt, m, &y, yt);
  args.sa = sa.data();
  args.azp = azp.data();
  RunTimings t;
  const absl::Status st = p.kernel->run(args, &t);
  if (!want.status.ok()) {
    EXPECT_EQ(st.code(), want.status.code()) << what << ": " << st;
    EXPECT_EQ(st.message(), want.status.message()) << what;
    EXPECT_TRUE(y == poisoned) << what << ": y was written on error";
    return st.code() == want.status.code() && st.message() == want.status.message() &&
           y == poisoned;
  }
  if (!st.ok()) {
    ADD_FAILURE() << what << ": " << st;
    return false;
  }
  if (int64_t i = first_y_mismatch(want.y, y, yt); i >= 0) {
    ADD_FAILURE() << what << ": y differs at row " << i / c.n << " col " << i % c.n;
    return false;
  }
  if (int64_t i = first_mismatch(want.sa, sa); i >= 0) {
    ADD_FAILURE() << what << ": sa differs at row " << i;
    return false;
  }
  if (is_asymmetric(c.scheme)) {
    if (int64_t i = first_mismatch(want.azp, azp); i >= 0) {
      ADD_FAILURE() << what << ": azp differs at row " << i;
      return false;
    }
  } else if (azp != std::vector<int32_t>(static_cast<size_t>(m), -7)) {
    ADD_FAILURE() << what << ": azp written for a symmetric scheme";
    return false;
  }
  if (t.gemm_ns <= 0 || t.quantize_ns < 0 || t.copy_ns <= 0) {
    ADD_FAILURE() << what << ": timings not filled (quantize " << t.quantize_ns << " ns, gemm "
                  << t.gemm_ns << " ns, host copies " << t.copy_ns << " ns)";
    return false;
  }
  return true;
}

// The serving path's CUDA graphs (CallGraphs) on every scheme: `run` calls of three small sizes
// (each with its own x and y dtypes), fresh x every time, enough of them that every stream
// context captures and then replays a graph of each size; between them a call large enough to
// grow a context's buffers (its graphs are captured again), and non-finite rows in replayed
// calls. Every call bit-exact with the reference; graphs are made, and all of them are released
// with the prepared kernel. `takes`: whether the kernel takes a call (layer, M, x and y dtypes).
// The serving path's two ways of bringing a small call's outputs back, on one layer per scheme:
// y, sa and azp written by the kernel straight into mapped pinned memory where it can
// (HostCallPreparedKernel::outputs_direct; every y up to 1 MB) and copied back (none), each M
// called enough times to be replayed from its graph, every answer exact. The limit is restored.
inline void check_outputs_both_ways(
    const Kernel& kernel, SplitMix64& rng,
    const std::function<bool(const LayerConfig&, int64_t, DType, DType)>& takes) {
  const size_t restore = direct_output_bytes();
  struct Way {
    size_t limit;
    int64_t ms[3];  // distinct per way: a captured graph keeps the way it was captured with
  };
  const Way ways[] = {{size_t{1} << 20, {2, 5, 12}}, {0, {3, 6, 11}}};
  for (Scheme scheme : kSchemes) {
    const Prepared p = prepare(kernel, make_layer(rng, scheme, 1040, 272, true));
    if (p.kernel == nullptr) break;
    const LayerConfig& c = p.weights->config;
    for (const Way& w : ways) {
      set_direct_output_bytes(w.limit);
      for (int r = 0; r < 3 * StreamPool::kContexts; ++r) {
        const int64_t m = w.ms[r % 3];
        const DType xt = kDTypes[r % 3], yt = kDTypes[(r / 3) % 3];
        if (!takes(c, m, xt, yt)) continue;
        if (!check_run(p, make_x(rng, m, c.k, xt), xt, m, yt)) {
          ADD_FAILURE() << scheme_name(scheme) << ", y up to " << w.limit
                        << " bytes direct, M=" << m;
          set_direct_output_bytes(restore);
          return;
        }
      }
    }
  }
  set_direct_output_bytes(restore);
}

inline void check_replayed_calls(
    const Kernel& kernel, SplitMix64& rng,
    const std::function<bool(const LayerConfig&, int64_t, DType, DType)>& takes) {
  const int64_t n = 16 * rng.range(2, 24), k = 16 * rng.range(2, 48);
  const int64_t kMs[] = {1, 13, kMaxGraphRows};
  for (Scheme scheme : kSchemes) {
    const int live_before = CallGraphs::live();
    {
      const Prepared p = prepare(kernel, make_layer(rng, scheme, n, k, rng.range(0, 1) == 1));
      if (p.kernel == nullptr) return;
      const LayerConfig& c = p.weights->config;
      constexpr int kRounds = 4 * StreamPool::kContexts * 3;
      for (int r = 0; r < kRounds; ++r) {
        const int i = r % 3;
        const int64_t m = kMs[i];
        const DType xt = kDTypes[i], yt = kDTypes[(i + 1) % 3];
        if (!takes(c, m, xt, yt)) continue;
        std::vector<uint8_t> x = make_x(rng, m, k, xt);
        if (r % 7 == 6) {  // a non-finite value somewhere
          const float bad = r % 2 == 0 ? std::nanf("") : -INFINITY;
          store_from_f32(x.data(), xt, static_cast<size_t>(rng.range(0, m * k - 1)), bad);
        }
        if (!check_run(p, x, xt, m, yt)) {
          ADD_FAILURE() << "round " << r;
          return;
        }
        if (r == kRounds / 2) {
          for (int64_t big : {int64_t{600}, int64_t{17}}) {
            if (!takes(c, big, DType::kBF16, DType::kBF16)) continue;
            for (int j = 0; j < StreamPool::kContexts; ++j) {
              if (!check_run(p, make_x(rng, big, k, DType::kBF16), DType::kBF16, big,
                             DType::kBF16)) {
                return;
              }
            }
            break;
          }
        }
      }
      EXPECT_GT(CallGraphs::live(), live_before) << scheme_name(scheme) << ": no call replayed";
    }
    EXPECT_EQ(CallGraphs::live(), live_before)
        << scheme_name(scheme) << ": graphs outlived their kernel";
  }
}

// Calls `f` on every stream context of `pool`, all of them held by this thread at once (so that
// acquire hands out each of them), then releases them.
inline void for_every_context(StreamPool& pool, const std::function<void(StreamContext&)>& f) {
  std::vector<StreamContext*> held;
  for (int i = 0; i < StreamPool::kContexts; ++i) held.push_back(pool.acquire());
  for (StreamContext* ctx : held) f(*ctx);
  for (StreamContext* ctx : held) pool.release(ctx);
}

}  // namespace qlinear::gpu::testing
