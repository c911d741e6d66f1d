// Activation quantization with AVX-512 (kernels/cpu/quantize_avx512.h) against the reference:
// xq, sa and azp bit for bit, for every scheme and input dtype, K with and without tails, and rows
// that reach the corners of SPEC section 2.
#include "kernels/cpu/quantize_avx512.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/cpu/cpu_test_util.h"

namespace qlinear::cpu {
namespace {

using testing::kAllDTypes;
using testing::kAllSchemes;
using testing::RowKind;

struct Quantized {
  std::vector<int8_t> xq;
  std::vector<float> sa;
  std::vector<int32_t> azp;
  int64_t bad_row = -1;
};

Quantized quantize_avx512(const LayerConfig& c, const std::vector<uint8_t>& x, DType dtype,
                          int64_t m, int64_t stride, bool shift) {
  Quantized q;
  q.xq.assign(static_cast<size_t>(m * stride), 0x55);
  q.sa.assign(m, -1.f);
  q.azp.assign(m, -7);
  QuantizeArgs a;
  a.scheme = c.scheme;
  a.input_scale = c.input_scale;
  a.input_zero_point = c.input_zero_point;
  a.x = x.data();
  a.x_dtype = dtype;
  a.k = c.k;
  a.xq = q.xq.data();
  a.xq_stride = stride;
  a.shift_to_u8 = shift;
  a.sa = q.sa.data();
  a.azp = q.azp.data();
  q.bad_row = quantize_rows_avx512(a, 0, m);
  return q;
}

// Compares every row with reference::quantize_row on the same (widened) values.
void expect_matches_reference(const LayerConfig& c, const std::vector<uint8_t>& x, DType dtype,
                              int64_t m) {
  const int64_t k = c.k;
  const int64_t stride = k + (k % 7);  // also checks the padding of each row
  for (bool shift : {false, true}) {
    const Quantized got = quantize_avx512(c, x, dtype, m, stride, shift);
    ASSERT_EQ(got.bad_row, -1);
    std::vector<float> row(k);
    std::vector<int8_t> want(k);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t i = 0; i < k; ++i) row[i] = load_as_f32(x.data(), dtype, r * k + i);
      float sa = 0.f;
      int32_t azp = 0;
      ASSERT_TRUE(reference::quantize_row(c, row.data(), k, want.data(), &sa, &azp));
      SCOPED_TRACE(::testing::Message()
                   << "row " << r << " K=" << k << " scheme " << scheme_name(c.scheme) << " x "
                   << dtype_name(dtype) << (shift ? " (u8)" : " (s8)"));
      for (int64_t i = 0; i < k; ++i) {
        const int8_t g = static_cast<int8_t>(got.xq[r * stride + i] ^ (shift ? 0x80 : 0));
        ASSERT_EQ(g, want[i]) << "xq at column " << i << " (x = " << row[i] << ")";
      }
      for (int64_t i = k; i < stride; ++i) {
        ASSERT_EQ(static_cast<uint8_t>(got.xq[r * stride + i]), shift ? 0x80 : 0) << "padding";
      }
      ASSERT_EQ(f32_bits(got.sa[r]), f32_bits(sa)) << "sa " << got.sa[r] << " vs " << sa;
      if (is_asymmetric(c.scheme)) {
        ASSERT_EQ(got.azp[r], azp) << "azp";
      }
    }
  }
}

LayerConfig config_for(SplitMix64& rng, Scheme scheme, int64_t k) {
  LayerConfig c;
  c.k = k;
  c.n = 1;
  c.scheme = scheme;
  if (is_static(scheme)) c.input_scale = rng.uniform(0.005f, 0.05f);
  if (scheme == Scheme::kStaticAsymmetric)
    c.input_zero_point = static_cast<int32_t>(rng.range(-40, 40));
  return c;
}

TEST(QuantizeAvx512, MatchesReferenceForEverySchemeDtypeAndRowKind) {
  QL_REQUIRE_AVX512_VNNI();
  QL_SEEDED_RNG(rng);
  for (Scheme scheme : kAllSchemes) {
    for (DType dtype : kAllDTypes) {
      for (int64_t k : {1, 2, 15, 16, 17, 31, 33, 496, 1025, 4099}) {
        const LayerConfig c = config_for(rng, scheme, k);
        // One row of every kind, then random mixes.
        const int64_t kinds = static_cast<int64_t>(RowKind::kCount);
        const int64_t m = kinds + 6;
        std::vector<uint8_t> x = testing::random_x(rng, m, k, dtype);
        std::vector<float> row(k);
        for (int64_t r = 0; r < kinds; ++r) {
          testing::fill_row(rng, static_cast<RowKind>(r), dtype, row.data(), k);
          for (int64_t i = 0; i < k; ++i) store_from_f32(x.data(), dtype, r * k + i, row[i]);
        }
        expect_matches_reference(c, x, dtype, m);
      }
    }
  }
}

TEST(QuantizeAvx512, ExtremeStaticScalesAndZeroPoints) {
  QL_REQUIRE_AVX512_VNNI();
  QL_SEEDED_RNG(rng);
  // Tiny scales overflow x / s to +-Inf (sat32 saturates); zero points near the int32 limits make
  // sat32(x / s) + zp wrap, as the reference's int32 arithmetic does.
  const float scales[] = {1e-38f, 1e-30f, 1.f, 3e38f};
  const int32_t zps[] = {INT32_MIN, INT32_MIN + 100, -128, 0, 127, INT32_MAX - 100, INT32_MAX};
  for (DType dtype : kAllDTypes) {
    const int64_t k = 37, m = 12;
    const std::vector<uint8_t> x = testing::random_x(rng, m, k, dtype);
    for (float s : scales) {
      LayerConfig c;
      c.k = k;
      c.scheme = Scheme::kStaticSymmetric;
      c.input_scale = s;
      expect_matches_reference(c, x, dtype, m);
      c.scheme = Scheme::kStaticAsymmetric;
      for (int32_t zp : zps) {
        c.input_zero_point = zp;
        expect_matches_reference(c, x, dtype, m);
      }
    }
  }
}

TEST(QuantizeAvx512, ZeroRowsKeepPositiveScaleWhateverTheSignsOfTheirZeros) {
  QL_REQUIRE_AVX512_VNNI();
  QL_SEEDED_RNG(rng);
  for (Scheme scheme : kAllSchemes) {
    const LayerConfig c = config_for(rng, scheme, 40);
    std::vector<uint8_t> x(40 * 4);
    std::vector<float> row(40);
    for (int pattern = 0; pattern < 4; ++pattern) {
      for (int i = 0; i < 40; ++i) row[i] = ((i + pattern) % (pattern + 1)) ? -0.f : 0.f;
      std::memcpy(x.data(), row.data(), 160);
      expect_matches_reference(c, x, DType::kF32, 1);
    }
  }
}

TEST(QuantizeAvx512, ReportsTheFirstNonFiniteRow) {
  QL_REQUIRE_AVX512_VNNI();
  QL_SEEDED_RNG(rng);
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (Scheme scheme : kAllSchemes) {
    for (DType dtype : kAllDTypes) {
      const int64_t k = rng.range(1, 70), m = 9;
      const LayerConfig c = config_for(rng, scheme, k);
      std::vector<uint8_t> x = testing::random_x(rng, m, k, dtype);
      const int64_t row = rng.range(2, m - 1), col = rng.range(0, k - 1);
      store_from_f32(x.data(), dtype, row * k + col, bad[rng.range(0, 2)]);
      const Quantized q = quantize_avx512(c, x, dtype, m, k, false);
      EXPECT_EQ(q.bad_row, row);
      // Rows after the first bad one are not looked at; a range starting there finds it too.
      QuantizeArgs a;
      a.scheme = c.scheme;
      a.input_scale = c.input_scale;
      a.input_zero_point = c.input_zero_point;
      a.x = x.data();
      a.x_dtype = dtype;
      a.k = k;
      std::vector<int8_t> xq(m * k);
      std::vector<float> sa(m);
      std::vector<int32_t> azp(m);
      a.xq = xq.data();
      a.xq_stride = k;
      a.sa = sa.data();
      a.azp = azp.data();
      EXPECT_EQ(quantize_rows_avx512(a, 0, row), -1);
      EXPECT_EQ(quantize_rows_avx512(a, row, m), row);
    }
  }
}

}  // namespace
}  // namespace qlinear::cpu
