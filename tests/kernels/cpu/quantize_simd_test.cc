// The SIMD activation quantizers against the reference: quantize_rows_avx512 (int8 and xq + 128
// as uint8) and quantize_rows_avx2 (the same two forms, and int16), xq, sa and azp bit for bit,
// for every scheme and input dtype, K with and without tails, and rows that reach the corners of
// SPEC section 2. Each quantizer's tests skip on hosts that cannot run it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/quantize_avx2.h"
#include "kernels/cpu/quantize_avx512.h"
#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/cpu/cpu_test_util.h"

namespace qlinear::cpu {
namespace {

using testing::kAllDTypes;
using testing::kAllSchemes;
using testing::RowKind;

// One quantizer under test.
struct Impl {
  const char* name;
  absl::Status (*supported)(const HostInfo&);
  bool int16;  // writes int16 xq (quantize_rows_avx2 with xq16)
  bool avx512;
};

// The quantizers this build holds (a compiler without the ISA's flags builds none of its code).
const Impl kImpls[] = {
#if QLINEAR_HAVE_AVX512_VNNI
    {"avx512", avx512_vnni_isa_status, false, true},
#endif
#if QLINEAR_HAVE_AVX2
    {"avx2", avx2_isa_status, false, false},
    {"avx2_int16", avx2_isa_status, true, false},
#endif
};

// Runs rows [r0, r1) of `a`; xq16 receives int16 rows for the int16 form.
int64_t quantize(const Impl& impl, const QuantizeArgs& a, int16_t* xq16, int64_t r0, int64_t r1) {
#if QLINEAR_HAVE_AVX512_VNNI
  if (impl.avx512) return quantize_rows_avx512(a, r0, r1);
#endif
#if QLINEAR_HAVE_AVX2
  if (!impl.avx512) return quantize_rows_avx2(a, impl.int16 ? xq16 : nullptr, r0, r1);
#endif
  (void)impl, (void)a, (void)xq16, (void)r0, (void)r1;
  return -2;
}

// Test names and ctest show the quantizer's name, not its bytes.
void PrintTo(const Impl& impl, std::ostream* os) { *os << impl.name; }

class QuantizeSimd : public ::testing::TestWithParam<Impl> {
 protected:
  void SetUp() override {
    const absl::Status s = GetParam().supported(host_info());
    if (!s.ok()) GTEST_SKIP() << GetParam().name << " cannot run here: " << s.message();
  }
};

struct Quantized {
  std::vector<int8_t> xq;  // the int16 form's values narrowed (checked to fit first)
  std::vector<float> sa;
  std::vector<int32_t> azp;
  int64_t bad_row = -1;
};

// The layer's scheme and x's rows; the output fields are the caller's.
QuantizeArgs args_for(const LayerConfig& c, const std::vector<uint8_t>& x, DType dtype) {
  QuantizeArgs a;
  a.scheme = c.scheme;
  a.input_scale = c.input_scale;
  a.input_zero_point = c.input_zero_point;
  a.x = x.data();
  a.x_dtype = dtype;
  a.k = c.k;
  return a;
}

Quantized run_quantizer(const Impl& impl, const LayerConfig& c, const std::vector<uint8_t>& x,
                        DType dtype, int64_t m, int64_t stride, bool shift) {
  Quantized q;
  q.xq.assign(static_cast<size_t>(m * stride), 0x55);
  std::vector<int16_t> xq16(static_cast<size_t>(m * stride), 0x5555);
  q.sa.assign(m, -1.f);
  q.azp.assign(m, -7);
  QuantizeArgs a = args_for(c, x, dtype);
  a.xq = q.xq.data();
  a.xq_stride = stride;
  a.shift_to_u8 = shift;
  a.sa = q.sa.data();
  a.azp = q.azp.data();
  q.bad_row = quantize(impl, a, xq16.data(), 0, m);
  if (impl.int16) {
    // Rows from the first non-finite one on are not written.
    const size_t written = static_cast<size_t>((q.bad_row < 0 ? m : q.bad_row) * stride);
    for (size_t i = 0; i < written; ++i) {
      EXPECT_TRUE(xq16[i] >= -128 && xq16[i] <= 127) << "int16 xq " << xq16[i] << " at " << i;
      q.xq[i] = static_cast<int8_t>(xq16[i]);
    }
  }
  return q;
}

// Compares every row with reference::quantize_row on the same (widened) values.
void expect_matches_reference(const Impl& impl, const LayerConfig& c, const std::vector<uint8_t>& x,
                              DType dtype, int64_t m) {
  const int64_t k = c.k;
  const int64_t stride = k + (k % 7);  // also checks the padding of each row
  for (bool shift : {false, true}) {
    if (shift && impl.int16) continue;  // the int16 form is never shifted
    const Quantized got = run_quantizer(impl, c, x, dtype, m, stride, shift);
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

TEST_P(QuantizeSimd, MatchesReferenceForEverySchemeDtypeAndRowKind) {
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
        expect_matches_reference(GetParam(), c, x, dtype, m);
      }
    }
  }
}

TEST_P(QuantizeSimd, ExtremeStaticScalesAndZeroPoints) {
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
      expect_matches_reference(GetParam(), c, x, dtype, m);
      c.scheme = Scheme::kStaticAsymmetric;
      for (int32_t zp : zps) {
        c.input_zero_point = zp;
        expect_matches_reference(GetParam(), c, x, dtype, m);
      }
    }
  }
}

TEST_P(QuantizeSimd, ZeroRowsKeepPositiveScaleWhateverTheSignsOfTheirZeros) {
  QL_SEEDED_RNG(rng);
  for (Scheme scheme : kAllSchemes) {
    const LayerConfig c = config_for(rng, scheme, 40);
    std::vector<uint8_t> x(40 * 4);
    std::vector<float> row(40);
    for (int pattern = 0; pattern < 4; ++pattern) {
      for (int i = 0; i < 40; ++i) row[i] = ((i + pattern) % (pattern + 1)) ? -0.f : 0.f;
      std::memcpy(x.data(), row.data(), 160);
      expect_matches_reference(GetParam(), c, x, DType::kF32, 1);
    }
  }
}

TEST_P(QuantizeSimd, ReportsTheFirstNonFiniteRow) {
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
      const Quantized q = run_quantizer(GetParam(), c, x, dtype, m, k, false);
      EXPECT_EQ(q.bad_row, row);
      // Rows after the first bad one are not looked at; a range starting there finds it too.
      QuantizeArgs a = args_for(c, x, dtype);
      std::vector<int8_t> xq(m * k);
      std::vector<int16_t> xq16(m * k);
      std::vector<float> sa(m);
      std::vector<int32_t> azp(m);
      a.xq = xq.data();
      a.xq_stride = k;
      a.sa = sa.data();
      a.azp = azp.data();
      EXPECT_EQ(quantize(GetParam(), a, xq16.data(), 0, row), -1);
      EXPECT_EQ(quantize(GetParam(), a, xq16.data(), row, m), row);
    }
  }
}

// The AMX GEMM's layout (QuantizeArgs::xq_tiles): every row's bytes, padding included, where the
// plain layout has them, dealt into tiles of 16 rows x 64 bytes; bytes of rows past M untouched.
#if QLINEAR_HAVE_AVX512_VNNI
TEST(QuantizeAvx512, TilesHoldWhatThePlainLayoutHolds) {
  const Impl& impl = kImpls[0];
  const absl::Status supported = impl.supported(host_info());
  if (!supported.ok()) GTEST_SKIP() << "AVX-512 cannot run here: " << supported.message();
  QL_SEEDED_RNG(rng);
  for (Scheme scheme : kAllSchemes) {
    for (int64_t k : {1, 63, 64, 65, 200, 4099}) {
      const int64_t m = rng.range(1, 40);
      const int64_t stride = (k + 63) / 64 * 64 + 64 * rng.range(0, 1);
      const DType dtype = kAllDTypes[rng.range(0, std::size(kAllDTypes) - 1)];
      const LayerConfig c = config_for(rng, scheme, k);
      const std::vector<uint8_t> x = testing::random_x(rng, m, k, dtype);
      const Quantized plain = run_quantizer(impl, c, x, dtype, m, stride, true);
      ASSERT_EQ(plain.bad_row, -1);
      const int64_t m16 = (m + 15) / 16 * 16;
      std::vector<int8_t> tiles(static_cast<size_t>(m16 * stride), 0x55);
      std::vector<float> sa(m, -1.f);
      std::vector<int32_t> azp(m, -7);
      QuantizeArgs a = args_for(c, x, dtype);
      a.xq = tiles.data();
      a.xq_stride = stride;
      a.xq_tiles = true;
      a.shift_to_u8 = true;
      a.sa = sa.data();
      a.azp = azp.data();
      // Two calls, as two threads would quantize two ranges.
      const int64_t split = rng.range(0, m);
      ASSERT_EQ(quantize(impl, a, nullptr, 0, split), -1);
      ASSERT_EQ(quantize(impl, a, nullptr, split, m), -1);
      SCOPED_TRACE(::testing::Message() << "M=" << m << " K=" << k << " stride " << stride
                                        << " scheme " << scheme_name(scheme) << " x "
                                        << dtype_name(dtype) << ", rows split at " << split);
      for (int64_t r = 0; r < m16; ++r) {
        for (int64_t i = 0; i < stride; ++i) {
          const int8_t got = tiles[r / 16 * 16 * stride + i / 64 * 1024 + r % 16 * 64 + i % 64];
          const int8_t want = r < m ? plain.xq[r * stride + i] : int8_t{0x55};
          ASSERT_EQ(got, want) << "row " << r << ", byte " << i;
        }
      }
      for (int64_t r = 0; r < m; ++r) {
        ASSERT_EQ(f32_bits(sa[r]), f32_bits(plain.sa[r])) << "sa of row " << r;
        if (is_asymmetric(scheme)) {
          ASSERT_EQ(azp[r], plain.azp[r]) << "azp of row " << r;
        }
      }
    }
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(Isa, QuantizeSimd, ::testing::ValuesIn(kImpls),
                         [](const ::testing::TestParamInfo<Impl>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace qlinear::cpu
