// cuda.quantize: per-token activation quantization on the GPU (SPEC section 2), bit-exact with
// reference::quantize_activations for all four schemes and fp32/fp16/bf16 input.
//
// Not a registry kernel by itself: the GEMM kernels call it before their int8 GEMM.
//
// This header is compiled by nvcc and by the host compiler, so it holds plain C++ only (no
// Abseil): the enums below mirror qlinear::DType and qlinear::Scheme value for value, which the
// host glue checks with static_asserts.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace qlinear::gpu {

// Same values as qlinear::DType.
enum class ElemType : int { kF32 = 1, kF16 = 2, kBF16 = 3 };
// Same values as qlinear::Scheme.
enum class QuantScheme : int {
  kDynamicSymmetric = 1,
  kStaticSymmetric = 2,
  kDynamicAsymmetric = 3,
  kStaticAsymmetric = 4,
};

struct QuantizeParams {
  QuantScheme scheme = QuantScheme::kDynamicSymmetric;
  float input_scale = 0.f;       // static schemes
  int32_t input_zero_point = 0;  // static asymmetric
};

// Where quantized element (row, e) goes: xq + (e / chunk) * chunk_stride + row * row_stride +
// e % chunk. The default (chunk = 0) is row-major [m, k]. cuda.stream_s8 asks for its K chunks
// one after another, each holding every row's slice of the chunk (a ring slot's activations in
// one copy).
struct XqLayout {
  int64_t chunk = 0;  // elements per chunk (a multiple of 8), or 0: row-major
  int64_t chunk_stride = 0;
  int64_t row_stride = 0;
};

// Second places, in mapped pinned memory, where a launch also writes each row's sa and (when the
// launch's azp is not null) azp, so that the host reads them without a copy back: null, or
// [m] each. The device buffers stay what a GEMM after the launch reads.
struct RowParamsMirror {
  float* sa = nullptr;
  int32_t* azp = nullptr;
};

// Quantizes x [m, k] (row-major, x_type, device memory) into xq [m, k] int8, sa [m] and, when
// azp is not null, azp [m] (0 for symmetric schemes). One block per row (a cluster of blocks per
// row for up to 16 long rows of 16-bit values, the row in shared memory for 17-256 long rows of
// them, a warp per row from 1024): the row's absmax or min/max reduction also detects non-finite
// values, then a second pass over the row (from registers, shared memory or L2) writes xq. A row
// holding NaN/Inf gets sa[row] = NaN, which a real scale never is (finite rows give finite or +Inf
// scales), and unspecified xq/azp: the caller finds the first bad row by scanning sa, which it
// copies back anyway, so the check needs no flag, memset or atomic. Requires 1 <= m < 2^31 and k >=
// 1; any alignment (8 elements per vector access when x is 16-byte aligned and k % 8 == 0, 4 when k
// % 4 == 0). When `zero` is given, the launch also sets zero[0, zero_count) to 0 (the counters of
// cuda.stream_s8, its programmatic dependent); with `layout`, xq is written in that layout instead
// of row-major. With split false, the rows are never split between blocks (one block per row
// where the split form would take up to 8 per row: fewer SMs busy while a programmatic
// dependent's blocks wait to start). With `mirror`, sa and azp are written there as well.
// Returns the launch error, if any.
cudaError_t launch_quantize_s8(const void* x, ElemType x_type, int64_t m, int64_t k,
                               const QuantizeParams& params, int8_t* xq, float* sa, int32_t* azp,
                               cudaStream_t stream, int32_t* zero = nullptr, int64_t zero_count = 0,
                               const XqLayout* layout = nullptr, bool split = true,
                               RowParamsMirror mirror = {});

// Sets zero[0, count) to 0 in a kernel of one block that lets a kernel launched after it as its
// programmatic dependent start at once (the quantize kernel's start, with no rows): for
// cuda.cutlass_sm90's quantizing tiles where the GEMM quantizes every row itself. Requires count
// >= 1. Returns the launch error, if any.
cudaError_t launch_zero_for_dependent(int32_t* zero, int64_t count, cudaStream_t stream);

// For benchmarks: from how many bytes of x on the 16-bit rows of 1024 tokens or more take the ring
// form (each row read once, through shared memory) rather than the warp form (read twice, the
// second time from L2). -1 (the default): the measured rule (past 3/4 of the L2 for rows of 8192
// values or more, past twice the L2 for shorter ones); 0: wherever the ring can hold the rows;
// INT64_MAX: never. Applies to launches made after it, in any thread.
void set_quantize_ring_min_bytes(int64_t bytes);

// How many blocks launch_quantize_s8 gives each of m rows of k 16-bit values when it may split
// them (vector-aligned rows): 2-8 for up to 16 rows of 4096 values or more, else 1.
int quantize_blocks_per_row(int64_t m, int64_t k);

}  // namespace qlinear::gpu
