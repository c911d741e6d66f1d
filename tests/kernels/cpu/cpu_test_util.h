// Shared helpers of the CPU kernel tests: per-run seeds, random layers, and activation rows that
// reach the corners of SPEC section 2 (zero rows, constant rows, huge offsets, subnormals).
//
// Every run draws a fresh seed; a failing test prints it, and QLINEAR_TEST_SEED=<seed> replays it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/random.h"
#include "kernels/core/dtype.h"
#include "kernels/core/host_info.h"
#include "kernels/core/layer.h"
#include "kernels/core/weights.h"
#include "kernels/cpu/cpu_support.h"
#include "tests/kernels/test_seed.h"

namespace qlinear::cpu::testing {

// The run's base seed: QLINEAR_TEST_SEED if set, else fresh.
inline uint64_t base_seed() { return qlinear::testing::test_seed(); }

// A generator for one test, derived from the base seed and the test's name, with the replay
// instruction attached to every failure in scope.
#define QL_SEEDED_RNG(rng)                                                                        \
  SCOPED_TRACE(::testing::Message()                                                               \
               << "seed " << ::qlinear::cpu::testing::base_seed()                                 \
               << " (replay: QLINEAR_TEST_SEED=" << ::qlinear::cpu::testing::base_seed() << ")"); \
  ::qlinear::SplitMix64 rng(                                                                      \
      ::qlinear::cpu::testing::base_seed() ^                                                      \
      std::hash<std::string>()(::testing::UnitTest::GetInstance()->current_test_info()->name()))

// Skips the test when this host cannot run the AVX-512 code.
#define QL_REQUIRE_AVX512_VNNI()                                                   \
  do {                                                                             \
    const absl::Status _s = ::qlinear::cpu::avx512_vnni_isa_status(host_info());   \
    if (!_s.ok()) GTEST_SKIP() << "cpu.avx512_vnni unavailable: " << _s.message(); \
  } while (0)

#define QL_REQUIRE_AMX()                                                   \
  do {                                                                     \
    const absl::Status _s = ::qlinear::cpu::amx_isa_status(host_info());   \
    if (!_s.ok()) GTEST_SKIP() << "cpu.amx unavailable: " << _s.message(); \
  } while (0)

inline constexpr Scheme kAllSchemes[] = {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric,
                                         Scheme::kDynamicAsymmetric, Scheme::kStaticAsymmetric};
inline constexpr DType kAllDTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

enum class ScaleMode { kPerChannel, kPerTensor, kPerPartition };

struct LayerOptions {
  int64_t n = 16;
  int64_t k = 16;
  Scheme scheme = Scheme::kDynamicSymmetric;
  bool bias = false;
  ScaleMode scale = ScaleMode::kPerChannel;
};

// A valid random layer. Static schemes get an input scale that keeps typical activations in range
// and, for asymmetric ones, a zero point in [-40, 40].
inline std::shared_ptr<const LayerWeights> random_layer(SplitMix64& rng, const LayerOptions& o) {
  LayerSpec spec;
  spec.n = o.n;
  spec.k = o.k;
  spec.scheme = o.scheme;
  switch (o.scale) {
    case ScaleMode::kPerChannel:
      spec.weight_scale = random_floats(rng, o.n, 1e-4f, 2e-2f);
      break;
    case ScaleMode::kPerTensor:
      spec.weight_scale = {rng.uniform(1e-4f, 2e-2f)};
      break;
    case ScaleMode::kPerPartition: {
      // Up to three partitions (q/k/v-like) summing to N.
      int64_t left = o.n;
      while (left > 0) {
        const int64_t w = spec.logical_widths.size() == 2 ? left : rng.range(1, left);
        spec.logical_widths.push_back(w);
        spec.weight_scale.push_back(rng.uniform(1e-4f, 2e-2f));
        left -= w;
      }
      if (spec.logical_widths.size() == 1) spec.logical_widths.clear();  // per tensor then
      break;
    }
  }
  if (o.bias) spec.bias = random_floats(rng, o.n, -4.f, 4.f);
  if (is_static(o.scheme)) {
    spec.has_input_scale = true;
    spec.input_scale = rng.uniform(0.005f, 0.05f);
  }
  if (o.scheme == Scheme::kStaticAsymmetric) {
    spec.has_input_zero_point = true;
    spec.input_zero_point = static_cast<int32_t>(rng.range(-40, 40));
  }
  auto w = build_layer_weights(spec, random_int8(rng, static_cast<size_t>(o.n * o.k)));
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : nullptr;
}

// Kinds of activation rows; kRandom most of the time, the others reach the corners.
enum class RowKind {
  kRandom,
  kZero,
  kConstant,
  kOutlier,
  kOffset,
  kTiny,
  kIntegers,
  kHuge,
  kCount
};

// Fills one row of K values (as fp32, before rounding to the wire dtype `dtype`).
inline void fill_row(SplitMix64& rng, RowKind kind, DType dtype, float* row, int64_t k) {
  switch (kind) {
    case RowKind::kRandom:
    case RowKind::kCount: {
      const float scale = std::ldexp(1.f, static_cast<int>(rng.range(-6, 6)));
      for (int64_t i = 0; i < k; ++i) row[i] = rng.uniform(-scale, scale);
      break;
    }
    case RowKind::kZero:
      for (int64_t i = 0; i < k; ++i) row[i] = (rng.next() & 1) ? 0.f : -0.f;
      break;
    case RowKind::kConstant: {
      const float c = rng.uniform(-3.f, 3.f);
      for (int64_t i = 0; i < k; ++i) row[i] = c;
      break;
    }
    case RowKind::kOutlier:  // one large value dominates the scale
      for (int64_t i = 0; i < k; ++i) row[i] = rng.uniform(-0.1f, 0.1f);
      row[rng.range(0, k - 1)] = rng.uniform(-3000.f, 3000.f);
      break;
    case RowKind::kOffset: {
      // Far from zero. In fp32 (offset / range ~ 2^27) the asymmetric x / s and zero point
      // saturate int32 and their sum wraps; 16-bit dtypes cannot hold such a ratio.
      const float base = dtype == DType::kF32 ? 1.0e8f : dtype == DType::kBF16 ? 1.0e6f : 6.0e4f;
      for (int64_t i = 0; i < k; ++i) row[i] = base + rng.uniform(0.f, 64.f);
      break;
    }
    case RowKind::kTiny:  // subnormal range: 127 / absmax and 1 / s overflow to Inf
      for (int64_t i = 0; i < k; ++i) row[i] = rng.uniform(-1e-39f, 1e-39f);
      break;
    case RowKind::kIntegers:  // exact under a scale of 1
      for (int64_t i = 0; i < k; ++i) row[i] = static_cast<float>(rng.range(-128, 127));
      break;
    case RowKind::kHuge: {
      // Near the dtype's largest value, of both signs: in fp32 and bf16 the asymmetric range
      // max - min overflows to Inf (numerics.md, "Range past fp32").
      const float top = dtype == DType::kF16 ? 60000.f : 3.0e38f;
      for (int64_t i = 0; i < k; ++i) row[i] = top * rng.uniform(-1.f, 1.f);
      row[0] = top;
      row[k - 1] = k > 1 ? -top : top;
      break;
    }
  }
}

// Activations [M, K] in `dtype` (raw bytes) with a mix of row kinds.
inline std::vector<uint8_t> random_x(SplitMix64& rng, int64_t m, int64_t k, DType dtype,
                                     bool corners = true) {
  std::vector<uint8_t> x(static_cast<size_t>(m * k) * dtype_size(dtype));
  std::vector<float> row(k);
  for (int64_t r = 0; r < m; ++r) {
    RowKind kind = RowKind::kRandom;
    if (corners && rng.range(0, 3) == 0) {
      kind = static_cast<RowKind>(rng.range(1, static_cast<int64_t>(RowKind::kCount) - 1));
    }
    fill_row(rng, kind, dtype, row.data(), k);
    for (int64_t i = 0; i < k; ++i) store_from_f32(x.data(), dtype, r * k + i, row[i]);
  }
  return x;
}

// First index where two buffers differ, or -1.
inline int64_t first_difference(const void* a, const void* b, size_t count, size_t elem) {
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(pa + i * elem, pb + i * elem, elem) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

inline std::string describe(const LayerConfig& c, int64_t m, DType x, DType y) {
  return std::string("M=") + std::to_string(m) + " N=" + std::to_string(c.n) +
         " K=" + std::to_string(c.k) + " scheme=" + std::string(scheme_name(c.scheme)) +
         " bias=" + (c.has_bias ? "yes" : "no") + " x=" + std::string(dtype_name(x)) +
         " y=" + std::string(dtype_name(y));
}

}  // namespace qlinear::cpu::testing
