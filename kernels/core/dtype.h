// Element types on the wire and in kernels, and exact scalar conversions between them.
//
// Conversions to a narrower type round to nearest, ties to even (RNE), as the SPEC requires for
// `out()`. fp16 overflow gives +-Inf (as CUDA's __float2half_rn and vLLM do); NaN stays NaN.
// These are scalar and exact: the oracle uses them, and vectorized kernels are tested against them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace qlinear {

enum class DType : int { kF32 = 1, kF16 = 2, kBF16 = 3 };

inline size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
absl::string_view dtype_name(DType t);

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bfloat16: the upper 16 bits of an fp32.
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // RNE on the 16 bits dropped; overflow carries into Inf
  return static_cast<uint16_t>(u >> 16);
}

// IEEE binary16. Implemented out of line with the compiler's _Float16, whose conversions are
// correctly rounded (RNE) in software or F16C.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Reads element i of a buffer of type t as fp32 (exact widening).
inline float load_as_f32(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.f;
}

// Writes v to element i of a buffer of type t with one RNE conversion (`out()` of the SPEC).
inline void store_from_f32(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      return;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      return;
  }
}

// Rounds v to type t and widens it back: what a value held in t looks like in fp32.
inline float round_to_dtype(float v, DType t) {
  switch (t) {
    case DType::kF32:
      return v;
    case DType::kF16:
      return f16_to_f32(f32_to_f16(v));
    case DType::kBF16:
      return bf16_to_f32(f32_to_bf16(v));
  }
  return v;
}

}  // namespace qlinear
