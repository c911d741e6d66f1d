// Element conversions (kernels/core/dtype.h): fp32 <-> bf16 and fp32 <-> fp16. These are the
// `out()` of the SPEC epilogue and the widening of every bf16/fp16 activation, so every kernel's
// output bits depend on them. Expected values are built from bit patterns and powers of two, not
// from the conversions under test.
#include "kernels/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace qlinear {
namespace {

float bits(uint32_t u) { return f32_from_bits(u); }

bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0; }

// Value of an fp16 bit pattern, decoded from its fields in double (independent of f16_to_f32).
double f16_decode(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double mag = e == 0    ? std::ldexp(double(m), -24)
                     : e == 31 ? (m == 0 ? INFINITY : NAN)
                               : std::ldexp(double(1024 + m), e - 25);
  return sign ? -mag : mag;
}

// Value of a bf16 bit pattern, decoded from its fields in double.
double bf16_decode(uint16_t h) {
  const int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  const double mag = e == 0     ? std::ldexp(double(m), -133)
                     : e == 255 ? (m == 0 ? INFINITY : NAN)
                                : std::ldexp(double(128 + m), e - 134);
  return sign ? -mag : mag;
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(Bf16, WideningIsTheUpperHalf) {
  EXPECT_EQ(f32_bits(bf16_to_f32(0x3f80)), 0x3f800000u);   // 1.0
  EXPECT_EQ(f32_bits(bf16_to_f32(0xc0a0)), 0xc0a00000u);   // -5.0
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);               // 0x40490000
  EXPECT_EQ(bf16_to_f32(0x7f7f), std::ldexp(255.f, 120));  // largest finite: 1.9921875 * 2^127
}

TEST(Bf16, RoundsHalfToEven) {
  // bf16 keeps the top 16 bits of an fp32; the dropped half 0x8000 is an exact tie.
  // 0x3f808000 = 1 + 2^-8, halfway between 0x3f80 (1.0, even) and 0x3f81: goes to 0x3f80.
  EXPECT_EQ(f32_to_bf16(bits(0x3f808000u)), 0x3f80);
  // 0x3f818000 = 1 + 3*2^-8, halfway between 0x3f81 (odd) and 0x3f82 (even): goes to 0x3f82.
  EXPECT_EQ(f32_to_bf16(bits(0x3f818000u)), 0x3f82);
  // One fp32 ulp either side of the tie decides by distance.
  EXPECT_EQ(f32_to_bf16(bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(bits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits(0x3f817fffu)), 0x3f81);
  // Negative ties mirror the positive ones.
  EXPECT_EQ(f32_to_bf16(bits(0xbf808000u)), 0xbf80);
  EXPECT_EQ(f32_to_bf16(bits(0xbf818000u)), 0xbf82);
  // A tie whose rounding carries into the exponent: 0x3fff8000 = 2 - 2^-8 is halfway between
  // 0x3fff (1.9921875, odd) and 0x4000 (2.0): goes to 2.0.
  EXPECT_EQ(f32_to_bf16(bits(0x3fff8000u)), 0x4000);
  // Not std::round-like (half away from zero): 1 + 2^-8 must not become 0x3f81.
  EXPECT_NE(f32_to_bf16(1.f + std::ldexp(1.f, -8)), 0x3f81);
}

TEST(Bf16, EveryMidpointBetweenNeighboursRoundsToEven) {
  // For each pair of adjacent positive bf16 values h, h+1 (including the largest finite value and
  // +Inf), the fp32 midpoint is (h << 16) | 0x8000. It must round to whichever of the two is
  // even; one fp32 ulp below goes down, one above goes up.
  for (uint32_t h = 0; h < 0x7f80u; ++h) {
    const uint32_t mid = (h << 16) | 0x8000u;
    const uint16_t even = static_cast<uint16_t>((h & 1u) ? h + 1 : h);
    ASSERT_EQ(f32_to_bf16(bits(mid)), even) << std::hex << "h=0x" << h;
    ASSERT_EQ(f32_to_bf16(bits(mid - 1)), h) << std::hex << "h=0x" << h;
    ASSERT_EQ(f32_to_bf16(bits(mid + 1)), h + 1) << std::hex << "h=0x" << h;
    ASSERT_EQ(f32_to_bf16(bits(mid | 0x80000000u)), even | 0x8000u) << std::hex << "h=0x" << h;
  }
}

TEST(Bf16, OverflowAndInfinity) {
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  // FLT_MAX = 0x7f7fffff is above the midpoint 0x7f7f8000 between 0x7f7f and Inf.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(f32_to_bf16(bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_TRUE(std::isinf(bf16_to_f32(0x7f80)));
  EXPECT_GT(bf16_to_f32(0x7f80), 0.f);
  EXPECT_LT(bf16_to_f32(0xff80), 0.f);
}

TEST(Bf16, NanStaysNan) {
  // Payloads that live only in the dropped low half must not truncate to Inf.
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0xffc00000u, 0xff800001u,
                     0x7fa00000u}) {
    const uint16_t h = f32_to_bf16(bits(u));
    EXPECT_TRUE(bf16_is_nan(h)) << std::hex << "u=0x" << u << " -> 0x" << h;
    EXPECT_EQ(h >> 15, u >> 31) << "sign of NaN kept";
    EXPECT_TRUE(std::isnan(bf16_to_f32(h)));
  }
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7fc1)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(0xff81)));
}

TEST(Bf16, NegativeZeroAndSubnormals) {
  EXPECT_EQ(f32_to_bf16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_bf16(0.f), 0x0000);
  EXPECT_TRUE(std::signbit(bf16_to_f32(0x8000)));
  EXPECT_EQ(bf16_to_f32(0x8000), 0.f);
  // bf16 shares fp32's exponent range: fp32 subnormals round to bf16 subnormals.
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.f, -133));    // smallest bf16 subnormal
  EXPECT_EQ(bf16_to_f32(0x007f), std::ldexp(127.f, -133));  // largest bf16 subnormal
  EXPECT_EQ(bf16_to_f32(0x8001), -std::ldexp(1.f, -133));
  EXPECT_EQ(f32_to_bf16(bits(0x00000001u)), 0x0000);  // 2^-149 -> +0
  EXPECT_EQ(f32_to_bf16(bits(0x80000001u)), 0x8000);  // -2^-149 -> -0
  EXPECT_EQ(f32_to_bf16(bits(0x00008000u)), 0x0000);  // tie between 0 (even) and 0x0001
  EXPECT_EQ(f32_to_bf16(bits(0x00018000u)), 0x0002);  // tie between 0x0001 and 0x0002 (even)
  EXPECT_EQ(f32_to_bf16(bits(0x00008001u)), 0x0001);
  // Largest subnormal + half an ulp: a tie between 0x007f (odd) and 0x0080 (the smallest
  // normal, even) -> 0x0080.
  EXPECT_EQ(f32_to_bf16(bits(0x007f8000u)), 0x0080);
}

TEST(Bf16, AllBitPatternsWidenExactlyAndRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = bf16_to_f32(h);
    if (bf16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << "0x" << i;
      const uint16_t back = f32_to_bf16(f);
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << "0x" << i;
      ASSERT_EQ(back >> 15, h >> 15) << std::hex << "0x" << i;
      continue;
    }
    ASSERT_EQ(double(f), bf16_decode(h)) << std::hex << "0x" << i;
    ASSERT_EQ(f32_to_bf16(f), h) << std::hex << "0x" << i;
  }
}

// ---------------------------------------------------------------------------------------------
// fp16

TEST(F16, RoundsHalfToEven) {
  // fp16 has 10 fraction bits: the ulp at 1 is 2^-10, so 1 + 2^-11 is a tie.
  // 1 + 2^-11: between 0x3c00 (1.0, even) and 0x3c01 -> 0x3c00.
  EXPECT_EQ(f32_to_f16(1.f + std::ldexp(1.f, -11)), 0x3c00);
  // 1 + 3*2^-11: between 0x3c01 (odd) and 0x3c02 (even) -> 0x3c02.
  EXPECT_EQ(f32_to_f16(1.f + 3 * std::ldexp(1.f, -11)), 0x3c02);
  // Just above the first tie -> up.
  EXPECT_EQ(f32_to_f16(1.f + std::ldexp(1.f, -11) + std::ldexp(1.f, -20)), 0x3c01);
  EXPECT_EQ(f32_to_f16(-1.f - std::ldexp(1.f, -11)), 0xbc00);
  EXPECT_EQ(f32_to_f16(-1.f - 3 * std::ldexp(1.f, -11)), 0xbc02);
  // fp16 integers are spaced 2 in [2048, 4096): 2049 is halfway between 2048 (even mantissa)
  // and 2050 -> 2048; 2051 is halfway between 2050 (odd) and 2052 -> 2052.
  EXPECT_EQ(f16_to_f32(f32_to_f16(2049.f)), 2048.f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(2051.f)), 2052.f);
}

TEST(F16, EveryMidpointBetweenNeighboursRoundsToEven) {
  // Adjacent positive fp16 values a = value(h), b = value(h+1) (for h = 0x7bff, b = 65536, the
  // point where the rounding goes to Inf). The midpoint has at most 12 significant bits, so it is
  // exact in fp32.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double a = f16_decode(static_cast<uint16_t>(h));
    const double b = h == 0x7bffu ? 65536.0 : f16_decode(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);
    ASSERT_EQ(double(mid), (a + b) / 2);
    const uint16_t even = static_cast<uint16_t>((h & 1u) ? h + 1 : h);
    ASSERT_EQ(f32_to_f16(mid), even) << std::hex << "h=0x" << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 0.f)), h) << std::hex << "h=0x" << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, INFINITY)), h + 1) << std::hex << "h=0x" << h;
    ASSERT_EQ(f32_to_f16(-mid), even | 0x8000u) << std::hex << "h=0x" << h;
  }
}

TEST(F16, OverflowGoesToInfinity) {
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);  // largest finite fp16 stays
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.f);
  // 65520 is halfway between 65504 (0x7bff, odd) and 65536 (the Inf step): ties to Inf.
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-65520.f), 0xfc00);
  // Anything below the midpoint stays finite: 65519.99 (f32 65519.9921875) -> 65504.
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.f, 0.f)), 0x7bff);
  EXPECT_EQ(f32_to_f16(-65519.99f), 0xfbff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
}

TEST(F16, NanStaysNan) {
  for (uint32_t u :
       {0x7fc00000u, 0x7f800001u, 0x7f801fffu, 0x7fffffffu, 0xffc00000u, 0xff800001u}) {
    const uint16_t h = f32_to_f16(bits(u));
    EXPECT_TRUE(f16_is_nan(h)) << std::hex << "u=0x" << u << " -> 0x" << h;
    EXPECT_EQ(h >> 15, u >> 31) << "sign of NaN kept";
  }
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7c01)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0xfc01)));
}

TEST(F16, NegativeZeroAndSubnormals) {
  EXPECT_EQ(f32_to_f16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_f16(0.f), 0x0000);
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(f16_to_f32(0x8000), 0.f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.f, -24));     // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.f, -14));     // smallest normal
  EXPECT_EQ(f16_to_f32(0x8001), -std::ldexp(1.f, -24));
  // 2^-25 is halfway between 0 (even) and 2^-24: goes to +0; the negative one to -0.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.f, -25)), 0x8000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25) + std::ldexp(1.f, -40)), 0x0001);
  // 3*2^-25 is halfway between 0x0001 (odd) and 0x0002 (even).
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.f, -25)), 0x0002);
  // Far below the smallest subnormal: zero of the same sign.
  EXPECT_EQ(f32_to_f16(1e-30f), 0x0000);
  EXPECT_EQ(f32_to_f16(-1e-30f), 0x8000);
  // 2^-14 - 2^-25: halfway between 0x03ff (odd) and 0x0400 (smallest normal, even).
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -14) - std::ldexp(1.f, -25)), 0x0400);
}

TEST(F16, AllBitPatternsWidenExactlyAndRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = f16_to_f32(h);
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << "0x" << i;
      const uint16_t back = f32_to_f16(f);
      ASSERT_TRUE(f16_is_nan(back)) << std::hex << "0x" << i;
      ASSERT_EQ(back >> 15, h >> 15) << std::hex << "0x" << i;
      continue;
    }
    ASSERT_EQ(double(f), f16_decode(h)) << std::hex << "0x" << i;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << "0x" << i;
  }
}

// ---------------------------------------------------------------------------------------------
// Buffer helpers used by every kernel.

TEST(DTypeBuffers, LoadStoreAndRoundToDtype) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_name(DType::kF32), "fp32");
  EXPECT_EQ(dtype_name(DType::kF16), "fp16");
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");

  const uint16_t h16[3] = {0x3c00, 0xc000, 0x7bff};  // 1, -2, 65504
  EXPECT_EQ(load_as_f32(h16, DType::kF16, 1), -2.f);
  EXPECT_EQ(load_as_f32(h16, DType::kF16, 2), 65504.f);
  const uint16_t hb[2] = {0x3f80, 0x4049};  // 1, 3.140625
  EXPECT_EQ(load_as_f32(hb, DType::kBF16, 1), 3.140625f);
  const float f[2] = {0.1f, -7.f};
  EXPECT_EQ(load_as_f32(f, DType::kF32, 0), 0.1f);

  const float tie_b = bits(0x3f818000u);  // bf16 tie -> 0x3f82
  uint16_t outb[2] = {0, 0};
  store_from_f32(outb, DType::kBF16, 1, tie_b);
  EXPECT_EQ(outb[0], 0);
  EXPECT_EQ(outb[1], 0x3f82);
  uint16_t outh[2] = {0, 0};
  store_from_f32(outh, DType::kF16, 0, 65520.f);
  EXPECT_EQ(outh[0], 0x7c00);
  float outf[2] = {0, 0};
  store_from_f32(outf, DType::kF32, 1, 0.1f);
  EXPECT_EQ(outf[1], 0.1f);

  EXPECT_EQ(round_to_dtype(0.1f, DType::kF32), 0.1f);
  EXPECT_EQ(round_to_dtype(tie_b, DType::kBF16), bits(0x3f820000u));
  EXPECT_EQ(round_to_dtype(1.f + std::ldexp(1.f, -11), DType::kF16), 1.f);
  EXPECT_EQ(round_to_dtype(65520.f, DType::kF16), std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace qlinear
