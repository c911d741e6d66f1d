// The CUDA kernels' rounding without the conversion unit (kernels/cuda/quantize_rne.h), checked on
// the host: rne_bits against the reference's rne on every kind of fp32 value it is used on, and the
// dynamic symmetric fast path of quantize8 (kernels/cuda/quantize_s8_device.cuh: the low byte of
// rne_bits(v * 127/absmax), no saturation) against the reference's quantize_row for every bf16
// and fp16 value v of rows whose absmax runs over the finite 16-bit magnitudes. The device code is
// the same header compiled for the GPU; the CUDA tests check the kernels themselves.
#include "kernels/cuda/quantize_rne.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/layer.h"
#include "kernels/reference/reference_w8a8.h"
#include "tests/kernels/test_seed.h"

namespace qlinear {
namespace {

using gpu::low_bytes4;
using gpu::rne_bits;

int32_t low_bits_value(uint32_t bits) {
  return static_cast<int32_t>(bits - f32_bits(gpu::kRneOffset));
}

TEST(QuantizeRne, RoundsHalfToEvenBelow2To22) {
  for (float x :
       {0.f, -0.f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, 127.5f, -127.5f, 0.49999997f,
        -0.49999997f, 1e-30f, -1e-30f, 4194303.5f, -4194303.5f, 4194302.5f}) {
    EXPECT_EQ(low_bits_value(rne_bits(x)), static_cast<int32_t>(reference::rne(x))) << "x = " << x;
  }
  SCOPED_TRACE(testing::seed_trace());
  std::mt19937_64 rng(testing::test_seed());
  std::uniform_real_distribution<float> u(-4194303.f, 4194303.f);
  std::uniform_real_distribution<float> small(-200.f, 200.f);
  for (int i = 0; i < 1000000; ++i) {
    const float x = i % 2 ? u(rng) : small(rng);
    ASSERT_EQ(low_bits_value(rne_bits(x)), static_cast<int32_t>(reference::rne(x))) << "x = " << x;
  }
}

TEST(QuantizeRne, PacksLowBytesFirstInTheLowestByte) {
  EXPECT_EQ(low_bytes4(0x4b4000ffu, 0x12345601u, 0xffffff80u, 0x0000007fu), 0x7f8001ffu);
  EXPECT_EQ(low_bytes4(rne_bits(-1.f), rne_bits(127.f), rne_bits(-127.f), rne_bits(0.f)),
            0x00817fffu);
}

// Every finite 16-bit magnitude as the absmax a (every third one, and the smallest whose
// 127 / a is finite), each with every value v of the type with |v| <= a, both signs: the
// reference quantizes the row {a, v...}; the fast path gives the same int8 wherever 127 / a is
// finite, and the kernels take the conversion instruction elsewhere.
void check_every_value(DType t) {
  const uint32_t top = t == DType::kBF16 ? 0x7f7fu : 0x7bffu;  // the largest finite magnitude
  std::vector<float> mags(top + 1);
  for (uint32_t h = 0; h <= top; ++h) {
    mags[h] = t == DType::kBF16 ? bf16_to_f32(static_cast<uint16_t>(h))
                                : f16_to_f32(static_cast<uint16_t>(h));
  }
  LayerConfig c;
  c.n = 1;
  c.scheme = Scheme::kDynamicSymmetric;
  std::vector<float> row;
  std::vector<int8_t> xq;
  int64_t rows = 0, values = 0, slow_rows = 0;
  bool smallest_finite_seen = false;
  for (uint32_t ha = 1; ha <= top; ++ha) {
    const float a = mags[ha];
    const float mul = 127.f / a;  // the device's __fdiv_rn(127.f, absmax)
    const bool fast = mul <= FLT_MAX;
    if (!fast) {
      ++slow_rows;
      continue;
    }
    const bool first_finite = !smallest_finite_seen;
    smallest_finite_seen = true;
    if (ha % 3 != 0 && !first_finite && ha != top) continue;
    row.assign(1, a);
    for (uint32_t hv = 0; hv <= ha; ++hv) {
      row.push_back(mags[hv]);
      row.push_back(-mags[hv]);
    }
    c.k = static_cast<int64_t>(row.size());
    xq.assign(row.size(), 0);
    float sa = 0.f;
    int32_t azp = 0;
    ASSERT_TRUE(reference::quantize_row(c, row.data(), c.k, xq.data(), &sa, &azp));
    for (size_t i = 0; i < row.size(); ++i) {
      const uint32_t b = rne_bits(row[i] * mul);
      const int8_t got = static_cast<int8_t>(low_bytes4(b, 0, 0, 0) & 0xffu);
      ASSERT_EQ(got, xq[i]) << "absmax " << a << " (bits 0x" << std::hex << ha << std::dec
                            << "), v = " << row[i];
    }
    ++rows;
    values += c.k;
  }
  EXPECT_GT(rows, 10000);
  EXPECT_GT(values, int64_t{100000000});
  // bf16 reaches down to absmax < 127 / FLT_MAX, where the kernels keep the conversion
  // instruction; fp16's smallest subnormal does not.
  if (t == DType::kBF16) {
    EXPECT_GT(slow_rows, 0);
  } else {
    EXPECT_EQ(slow_rows, 0);
  }
}

TEST(QuantizeRne, DynamicSymmetricFastPathMatchesTheReferenceForEveryBf16Value) {
  check_every_value(DType::kBF16);
}

TEST(QuantizeRne, DynamicSymmetricFastPathMatchesTheReferenceForEveryFp16Value) {
  check_every_value(DType::kF16);
}

}  // namespace
}  // namespace qlinear
