// Rounding an fp32 value to the nearest integer (ties to even) with one fp32 add instead of the
// conversion instruction, for the CUDA kernels that quantize activations. Host and device: the
// kernels use it on the GPU, and the host test (tests/kernels/quantize_rne_test.cc) checks on the
// CPU, for every 16-bit input, that it quantizes as the reference does.
//
// For |x| < 2^22, x + 1.5 * 2^23 lies in [2^23, 2^24), where the unit in the last place is 1, so
// the adder's own round-to-nearest-even leaves 1.5 * 2^23 + rne(x) (the offset is even, so ties
// round the same way). The sum's low mantissa bits are then rne(x) in two's complement, and its
// low byte is rne(x) as an int8 wherever -128 <= rne(x) <= 127. On the GPU the add runs on the
// fp32 pipe, at eight times the rate of the conversion unit that cvt.rni.s32.f32 takes (16
// conversions per SM and clock on compute capability 9.0).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QLINEAR_HOST_DEVICE __host__ __device__
#else
#define QLINEAR_HOST_DEVICE
#endif

namespace qlinear::gpu {

inline constexpr float kRneOffset = 12582912.f;  // 1.5 * 2^23

// The bits of x + 1.5 * 2^23 (one fp32 add, rounded to nearest even): rne(x) in the low bits for
// |x| < 2^22.
QLINEAR_HOST_DEVICE inline uint32_t rne_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(__fadd_rn(x, kRneOffset));
#else
  const float s = x + kRneOffset;
  uint32_t b;
  std::memcpy(&b, &s, sizeof b);
  return b;
#endif
}

// The low bytes of four words packed, the first in the lowest byte (three byte permutes on the
// GPU).
QLINEAR_HOST_DEVICE inline uint32_t low_bytes4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(__byte_perm(a, b, 0x0040u), __byte_perm(c, d, 0x0040u), 0x5410u);
#else
  return (a & 0xffu) | (b & 0xffu) << 8 | (c & 0xffu) << 16 | (d & 0xffu) << 24;
#endif
}

}  // namespace qlinear::gpu
