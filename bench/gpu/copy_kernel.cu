#include <cstdint>
#include <type_traits>

#include "bench/gpu/copy_kernel.h"
#include "kernels/cuda/sm90_async_device.cuh"
#include "kernels/cuda/stream_s8_device.h"

namespace qlinear::gpu {
namespace {

__global__ void __launch_bounds__(512)
    copy_16b(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Four independent loads in flight per thread before the stores.
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

// Reads every byte once (8 independent 16-byte loads in flight per thread) and writes one word
// per thread, so that the compiler keeps the loads.
__global__ void __launch_bounds__(512)
    read_16b(const uint4* __restrict__ src, size_t n, uint32_t* __restrict__ sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldcs(src + i + j * stride);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = src[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  sink[static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}

// read_16b with every load of a thread's step in flight, the last step too: each thread keeps
// kLoads 16-byte loads in flight until its share ends (read_16b's last, partial step issues one
// load at a time, which is most of a thread's share on a layer of 16-64 MB).
template <int kLoads>
__global__ void __launch_bounds__(512)
    read_16b_all(const uint4* __restrict__ src, size_t n, uint32_t* __restrict__ sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += kLoads * stride) {
    uint4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      v[j] = i + j * stride < n ? __ldcs(src + i + j * stride) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  sink[static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}

// Reads `bytes` with bulk copies into shared memory, as the weight-streaming kernels do: block b
// takes the b-th of gridDim.x equal contiguous ranges of kChunk-byte chunks and keeps kDepth of
// them in flight (a ring of kDepth slots, one mbarrier each), one thread issuing and waiting.
template <int kChunk, int kDepth>
__global__ void __launch_bounds__(32)
    read_bulk(const uint8_t* __restrict__ src, size_t bytes, uint32_t* __restrict__ sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t bars[kDepth];
  if (threadIdx.x != 0) return;
  const size_t chunks = (bytes + kChunk - 1) / kChunk, blocks = gridDim.x;
  const size_t begin = chunks * blockIdx.x / blocks, end = chunks * (blockIdx.x + 1) / blocks;
  for (int d = 0; d < kDepth; ++d) device::mbar_init(device::smem_addr(&bars[d]), 1);
  device::mbar_init_fence();
  const uint64_t policy = device::l2_evict_first();
  auto issue = [&](size_t c) {
    const int slot = static_cast<int>((c - begin) % kDepth);
    const size_t off = c * kChunk;
    const auto len = static_cast<uint32_t>(bytes - off < kChunk ? bytes - off : kChunk);
    const uint32_t bar = device::smem_addr(&bars[slot]);
    device::mbar_expect_tx(bar, len);
    device::bulk_copy(device::smem_addr(ring + slot * kChunk), src + off, len, bar, policy);
  };
  for (size_t c = begin; c < end && c < begin + kDepth; ++c) issue(c);
  for (size_t c = begin; c < end; ++c) {
    const size_t r = c - begin;
    device::mbar_wait(device::smem_addr(&bars[r % kDepth]), static_cast<uint32_t>(r / kDepth) & 1);
    if (c + kDepth < end) issue(c + kDepth);
  }
  sink[blockIdx.x] = ring[0];
#endif
}

// Reads an n x k int8 matrix in units of `rows` rows x (32 KB / rows) bytes of K, row block
// after row block and K fastest, as cuda.stream_s8 walks its weights: block b reads the b-th of
// gridDim.x contiguous, equal ranges of units, kDepth units in flight (32 KB each). Interleaved:
// block b reads units b, b + gridDim.x, b + 2 gridDim.x, ... instead, so that the blocks read
// neighbouring units at any moment.
template <int kDepth, bool kInterleaved>
__global__ void __launch_bounds__(1024)
    read_rows(const int8_t* __restrict__ w, int64_t n, int64_t k, int rows,
              uint32_t* __restrict__ sink) {
  const int64_t chunk = 32768 / rows;
  const int64_t chunks = (k + chunk - 1) / chunk;
  const int64_t units = (n + rows - 1) / rows * chunks;
  const int64_t G = gridDim.x;
  const int64_t begin = kInterleaved ? 0 : units * blockIdx.x / G;
  const int64_t end =
      kInterleaved ? (units - blockIdx.x + G - 1) / G : units * (blockIdx.x + 1) / G;
  const int per_row = static_cast<int>(chunk / 16);
  uint32_t acc = 0;
  for (int64_t u0 = begin; u0 < end; u0 += kDepth) {
    uint4 v[kDepth][2];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t li = u0 + d;
      const int64_t u = kInterleaved ? blockIdx.x + li * G : li;
      const int64_t rb = u / chunks, c = u % chunks;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int j = static_cast<int>(threadIdx.x) + 1024 * i;
        const int64_t r = rb * rows + j / per_row;
        const int64_t col = c * chunk + static_cast<int64_t>(j % per_row) * 16;
        v[d][i] = li < end && r < n && col < k
                      ? __ldcs(reinterpret_cast<const uint4*>(w + r * k + col))
                      : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
#pragma unroll
      for (int i = 0; i < 2; ++i) acc ^= v[d][i].x ^ v[d][i].y ^ v[d][i].z ^ v[d][i].w;
    }
  }
  sink[static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}

// Reads an n x k int8 matrix in the order cuda.cutlass_sm90's swapped 16 x 64 x 256 tile streams
// its weights: tiles of 64 rows, block b taking tiles b, b + gridDim.x, ...; each tile's K in
// k-tiles of 256 bytes, each two 128-byte x 64-row TMA boxes (map: stream_s8_weights_map's, the
// 128-byte swizzle of CUTLASS's loads), kStages k-tiles in flight, one thread issuing and waiting.
// kTileRows: the tiles' and the boxes' height (64 as the tile's; 32 and 128 to compare).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// One thread streams `count` loads through a ring of kStages slots, each on its mbarrier in bars:
// issue(s, slot, bar) queues load s; the first kStages go at once, then each slot's next load as
// soon as its last one has arrived.
template <int kStages, class Issue>
__device__ __forceinline__ void stream_ring(uint64_t* bars, int64_t count, Issue&& issue) {
  for (int d = 0; d < kStages; ++d) device::mbar_init(device::smem_addr(&bars[d]), 1);
  device::mbar_init_fence();
  auto queue = [&](int64_t s) {
    const int slot = static_cast<int>(s % kStages);
    issue(s, slot, device::smem_addr(&bars[slot]));
  };
  for (int64_t s = 0; s < count && s < kStages; ++s) queue(s);
  for (int64_t s = 0; s < count; ++s) {
    device::mbar_wait(device::smem_addr(&bars[s % kStages]),
                      static_cast<uint32_t>(s / kStages) & 1);
    if (s + kStages < count) queue(s + kStages);
  }
}
#endif

// rotation r: tile t's k-loop starts at k-tile (r * t) % k_tiles and wraps, so that the tiles read
// at one moment lie in different columns of the matrix (0: every tile from k = 0).
// split s > 1: the tiles past the last whole wave (tiles % gridDim.x of them) are each cut into s
// slices of K, dealt to the blocks in turn after their whole tiles; s = kReadEvenSplit: every
// block reads an equal contiguous share of all the tiles' k-tiles (tile after tile, K fastest).
constexpr int kTileK = 256, kTileBox = 128;
template <int kStages, int kTileRows>
__global__ void __launch_bounds__(32)
    read_tiles(const __grid_constant__ StreamTmaMap map, int64_t n, int64_t k, int rotation,
               int split, int64_t first_tile, uint32_t* __restrict__ sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) uint8_t ring[];
  __shared__ __align__(8) uint64_t bars[kStages];
  if (threadIdx.x != 0) return;
  const int64_t tiles = (n + kTileRows - 1) / kTileRows - first_tile;
  const int64_t k_tiles = (k + kTileK - 1) / kTileK;
  const int64_t G = gridDim.x, b = blockIdx.x;
  int64_t count = (tiles - b + G - 1) / G * k_tiles;
  // The tail's slices (split > 1): this block's whole tiles first, then its slices.
  const int64_t whole = tiles / G, tail = tiles % G;
  const bool sliced = split > 1 && tail > 0 && k_tiles % split == 0;
  const int64_t slice_k = sliced ? k_tiles / split : k_tiles;
  if (sliced) count = whole * k_tiles + (tail * split - b + G - 1) / G * slice_k;
  // The even shares (split == kReadEvenSplit).
  const int64_t total = tiles * k_tiles, first = b * total / G;
  if (split == kReadEvenSplit) count = (b + 1) * total / G - first;
  const uint64_t policy = device::l2_evict_first();
  stream_ring<kStages>(bars, count, [&](int64_t s, int slot, uint32_t bar) {
    int64_t t = b + s / k_tiles * G, kk = (s % k_tiles + rotation * t) % k_tiles;
    if (split == kReadEvenSplit) {
      t = (first + s) / k_tiles;
      kk = (first + s) % k_tiles;
    } else if (sliced && s >= whole * k_tiles) {
      const int64_t u = b + (s - whole * k_tiles) / slice_k * G;  // the tail's slice u
      t = whole * G + u / split;
      kk = u % split * slice_k + (s - whole * k_tiles) % slice_k;
    }
    t += first_tile;
    const uint32_t dst = device::smem_addr(ring + slot * kTileRows * kTileK);
    device::mbar_expect_tx(bar, kTileRows * kTileK);
    for (int h = 0; h < kTileK / kTileBox; ++h) {
      device::tma_load_2d(dst + h * kTileRows * kTileBox, &map,
                          static_cast<int32_t>(kk * kTileK + h * kTileBox),
                          static_cast<int32_t>(t * kTileRows), bar, policy);
    }
  });
  sink[blockIdx.x] = ring[0];
#endif
}

// read_tiles with one 3-D load per k-tile (launch_read_tiles_3d).
template <int kChunks>
__global__ void __launch_bounds__(32) read_tiles_3d(const __grid_constant__ StreamTmaMap map,
                                                    int64_t k, uint32_t* __restrict__ sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kStages = 20 / kChunks, kTileBytes = 64 * 128 * kChunks;
  extern __shared__ __align__(1024) uint8_t ring[];
  __shared__ __align__(8) uint64_t bars[kStages];
  if (threadIdx.x != 0) return;
  const int64_t count = (k + 128 * kChunks - 1) / (128 * kChunks);
  const uint64_t policy = device::l2_evict_first();
  stream_ring<kStages>(bars, count, [&](int64_t s, int slot, uint32_t bar) {
    const uint32_t dst = device::smem_addr(ring + slot * kTileBytes);
    device::mbar_expect_tx(bar, kTileBytes);
    device::tma_load_3d(dst, &map, 0, static_cast<int32_t>(blockIdx.x * 64),
                        static_cast<int32_t>(s * kChunks), bar, policy);
  });
  sink[blockIdx.x] = ring[0];
#endif
}

__global__ void empty_kernel() {}

// Writes the %globaltimer (ns) at *out.
__global__ void __launch_bounds__(32) stamp_kernel(uint64_t* out) {
  if (threadIdx.x == 0) *out = device::globaltimer();
}

// An empty block of the swapped tiles' shape: 384 threads holding all of shared memory.
__global__ void __launch_bounds__(384, 1) empty_wide_kernel() {}

// kOps multiply-adds in eight independent chains of straight-line code (16 bytes of machine code
// each), run twice in one loop: the first pass fetches the code, the second finds it cached.
// Thread 0 writes each pass's SM cycles at out[2 * block] and out[2 * block + 1].
template <int kOps>
__global__ void __launch_bounds__(128) cold_code_kernel(uint32_t seed, uint64_t* out) {
  uint32_t v[8];
  for (int j = 0; j < 8; ++j) v[j] = seed + threadIdx.x * 8 + j;
  uint64_t pass[2] = {0, 0};
#pragma unroll 1
  for (int r = 0; r < 2; ++r) {
    const uint64_t start = clock64();
#pragma unroll
    for (int i = 0; i < kOps / 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * v[j] + (seed | 1u);
    }
    uint32_t all = 0;
    for (int j = 0; j < 8; ++j) all ^= v[j];
    // The stamp after the last result, so that the pass's instructions have all run.
    asm volatile("" ::"r"(all));
    const uint64_t end = clock64();
    if (r == 0) {
      pass[0] = end - start;
    } else {
      pass[1] = end - start;
    }
    if (all == 0x9e3779b9u) out[0] = all;  // (keeps the chains live)
  }
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = pass[0];
    out[2 * blockIdx.x + 1] = pass[1];
  }
}

}  // namespace

cudaError_t launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 32, 0, stream>>>();
  return cudaGetLastError();
}

cudaError_t launch_empty_wide(int ctas, cudaStream_t stream) {
  constexpr int kSmem = 227 * 1024;
  static const cudaError_t attr =
      cudaFuncSetAttribute(empty_wide_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return attr;
  empty_wide_kernel<<<ctas, 384, kSmem, stream>>>();
  return cudaGetLastError();
}

cudaError_t launch_stamp(uint64_t* out, cudaStream_t stream) {
  stamp_kernel<<<1, 32, 0, stream>>>(out);
  return cudaGetLastError();
}

cudaError_t launch_cold_code(int kb, int ctas, uint64_t* out, cudaStream_t stream) {
  switch (kb) {
    case 16:
      cold_code_kernel<1024><<<ctas, 128, 0, stream>>>(0x2545f491u, out);
      break;
    case 64:
      cold_code_kernel<4096><<<ctas, 128, 0, stream>>>(0x2545f491u, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_read_16b(const void* src, size_t bytes, int sm_count, void* sink,
                            cudaStream_t stream) {
  if (bytes % 16 != 0) return cudaErrorInvalidValue;
  read_16b<<<sm_count * 4, 512, 0, stream>>>(static_cast<const uint4*>(src), bytes / 16,
                                             static_cast<uint32_t*>(sink));
  return cudaGetLastError();
}

namespace {

template <int kChunk, int kDepth>
cudaError_t launch_bulk(const void* src, size_t bytes, int blocks, void* sink,
                        cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(
      read_bulk<kChunk, kDepth>, cudaFuncAttributeMaxDynamicSharedMemorySize, kChunk * kDepth);
  if (attr != cudaSuccess) return attr;
  read_bulk<kChunk, kDepth><<<blocks, 32, kChunk * kDepth, stream>>>(
      static_cast<const uint8_t*>(src), bytes, static_cast<uint32_t*>(sink));
  return cudaGetLastError();
}

}  // namespace

const char* read_form_name(int form) {
  switch (form) {
    case 0:
      return "ld8";
    case 1:
      return "ld8-all";
    case 2:
      return "ld16-all";
    case 3:
      return "bulk32Kx6";
    case 4:
      return "bulk16Kx8";
    case 5:
      return "2bulk16Kx6";
    default:
      return "?";
  }
}

cudaError_t launch_read_form(int form, const void* src, size_t bytes, int sm_count, void* sink,
                             cudaStream_t stream) {
  if (bytes % 16 != 0) return cudaErrorInvalidValue;
  const auto* v = static_cast<const uint4*>(src);
  auto* out = static_cast<uint32_t*>(sink);
  switch (form) {
    case 0:
      return launch_read_16b(src, bytes, sm_count, sink, stream);
    case 1:
      read_16b_all<8><<<sm_count * 4, 512, 0, stream>>>(v, bytes / 16, out);
      return cudaGetLastError();
    case 2:
      read_16b_all<16><<<sm_count * 4, 512, 0, stream>>>(v, bytes / 16, out);
      return cudaGetLastError();
    case 3:
      return launch_bulk<32768, 6>(src, bytes, sm_count, sink, stream);
    case 4:
      return launch_bulk<16384, 8>(src, bytes, sm_count, sink, stream);
    case 5:
      return launch_bulk<16384, 6>(src, bytes, 2 * sm_count, sink, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_read_rows(const void* w, int64_t n, int64_t k, int rows, int depth, int sm_count,
                             void* sink, cudaStream_t stream, bool interleaved) {
  if (k % 16 != 0 || rows <= 0 || 32768 % rows != 0 || 32768 / rows < 16) {
    return cudaErrorInvalidValue;
  }
  const auto* src = static_cast<const int8_t*>(w);
  auto* out = static_cast<uint32_t*>(sink);
  auto launch = [&](auto depth_c) {
    constexpr int kDepth = decltype(depth_c)::value;
    if (interleaved) {
      read_rows<kDepth, true><<<sm_count, 1024, 0, stream>>>(src, n, k, rows, out);
    } else {
      read_rows<kDepth, false><<<sm_count, 1024, 0, stream>>>(src, n, k, rows, out);
    }
  };
  switch (depth) {
    case 2:
      launch(std::integral_constant<int, 2>{});
      break;
    case 3:
      launch(std::integral_constant<int, 3>{});
      break;
    case 4:
      launch(std::integral_constant<int, 4>{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_read_tiles(const StreamTmaMap& map, int64_t n, int64_t k, int rotation,
                              int split, int sm_count, void* sink, cudaStream_t stream,
                              int64_t first_tile, int stages, int rows) {
  const int64_t tiles = (n + rows - 1) / rows - first_tile;
  // (Where K is split, every SM takes a share, however few the tiles.)
  const auto grid = static_cast<unsigned>(tiles < sm_count && split == 0 ? tiles : sm_count);
  auto launch = [&](auto depth, auto height) -> cudaError_t {
    constexpr int kStages = decltype(depth)::value;
    constexpr int kRows = decltype(height)::value;
    constexpr int smem = kStages * kRows * kTileK;
    static const cudaError_t attr = cudaFuncSetAttribute(
        read_tiles<kStages, kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return attr;
    read_tiles<kStages, kRows><<<grid, 32, smem, stream>>>(map, n, k, rotation, split, first_tile,
                                                           static_cast<uint32_t*>(sink));
    return cudaGetLastError();
  };
  using std::integral_constant;
  if (rows == 32 && stages == 20)
    return launch(integral_constant<int, 20>{}, integral_constant<int, 32>{});
  if (rows == 128 && stages == 5)
    return launch(integral_constant<int, 5>{}, integral_constant<int, 128>{});
  if (rows != 64) return cudaErrorInvalidValue;
  const integral_constant<int, 64> tall;
  switch (stages) {
    case 4:
      return launch(integral_constant<int, 4>{}, tall);
    case 6:
      return launch(integral_constant<int, 6>{}, tall);
    case 10:
      return launch(integral_constant<int, 10>{}, tall);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_read_tiles_3d(const StreamTmaMap& map, int64_t k, int chunks, int ctas,
                                 void* sink, cudaStream_t stream) {
  auto launch = [&](auto c) -> cudaError_t {
    constexpr int kChunks = decltype(c)::value;
    constexpr int smem = 20 / kChunks * 64 * 128 * kChunks;
    static const cudaError_t attr = cudaFuncSetAttribute(
        read_tiles_3d<kChunks>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return attr;
    read_tiles_3d<kChunks><<<ctas, 32, smem, stream>>>(map, k, static_cast<uint32_t*>(sink));
    return cudaGetLastError();
  };
  if (chunks == 2) return launch(std::integral_constant<int, 2>{});
  if (chunks == 4) return launch(std::integral_constant<int, 4>{});
  return cudaErrorInvalidValue;
}

cudaError_t launch_copy_16b(const void* src, void* dst, size_t bytes, int sm_count,
                            cudaStream_t stream) {
  if (bytes % 16 != 0) return cudaErrorInvalidValue;
  copy_16b<<<sm_count * 4, 512, 0, stream>>>(static_cast<const uint4*>(src),
                                             static_cast<uint4*>(dst), bytes / 16);
  return cudaGetLastError();
}

}  // namespace qlinear::gpu
