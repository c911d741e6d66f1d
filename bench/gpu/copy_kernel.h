// Memory-bandwidth ceilings the benchmark prints: a device-to-device copy with 16-byte loads and
// stores from every SM (a cudaMemcpy replayed in a graph may run on a copy engine, which is
// slower than the SMs), and a read-only stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace qlinear::gpu {

// bytes must be a multiple of 16 and both pointers 16-byte aligned.
cudaError_t launch_copy_16b(const void* src, void* dst, size_t bytes, int sm_count,
                            cudaStream_t stream);

// The device memory the read kernels below write their sink into, for sm_count SMs.
inline size_t read_sink_bytes(int sm_count) { return static_cast<size_t>(sm_count) * 4 * 512 * 4; }

// Reads `bytes` once with 16-byte streaming loads from every SM: the read-bandwidth ceiling a
// weight-streaming kernel is measured against. sink: read_sink_bytes(sm_count).
cudaError_t launch_read_16b(const void* src, size_t bytes, int sm_count, void* sink,
                            cudaStream_t stream);

// The forms of a plain read of `bytes` that the benchmark times a layer's weights with, the
// fastest standing for the weights read alone: 0 launch_read_16b; 1 and 2 the same grid with 8
// or 16 loads in flight per thread up to the end of its share; 3-5 bulk copies into shared
// memory, equal contiguous ranges per block (3: one block per SM, 6 chunks of 32 KB in flight;
// 4: 8 of 16 KB; 5: two blocks per SM, 6 of 16 KB each). sink: read_sink_bytes(sm_count).
constexpr int kReadForms = 6;
const char* read_form_name(int form);
cudaError_t launch_read_form(int form, const void* src, size_t bytes, int sm_count, void* sink,
                             cudaStream_t stream);

// Reads an n x k int8 matrix in cuda.stream_s8's order: units of `rows` rows x (32 KB / rows)
// bytes of K, one contiguous range of units per block (sm_count blocks), `depth` (2, 3 or 4)
// units in flight per block; interleaved: block b takes units b, b + sm_count, ... instead.
// sink: read_sink_bytes(sm_count).
cudaError_t launch_read_rows(const void* w, int64_t n, int64_t k, int rows, int depth, int sm_count,
                             void* sink, cudaStream_t stream, bool interleaved = false);

// Reads an n x k int8 matrix in the order cuda.cutlass_sm90's swapped 16 x 64 x 256 tile streams
// its weights (tiles of 64 rows dealt to min(tiles, sm_count) blocks in turn, sm_count blocks
// where split != 0; each tile's K in k-tiles of 256 bytes as two 128-byte TMA boxes, `stages`
// (4, 6 or 10) k-tiles in flight per block), from `map` (stream_s8_weights_map of the matrix).
// rows: the tiles' and the boxes' height (map's boxes must be as tall): 64, or 32 with 20 stages
// or 128 with 5 (the same 160 KB in flight as 64 rows with 10).
// rotation r: tile t starts its k-loop at k-tile (r * t) % k_tiles and wraps around. split s > 1:
// the tiles past the last whole wave are each cut into s slices of K (k_tiles a multiple of s),
// dealt to the blocks in turn after their whole tiles; kReadEvenSplit: every block reads an equal
// contiguous share of all the k-tiles. Only the tiles from first_tile on are read. sink:
// read_sink_bytes(sm_count).
struct StreamTmaMap;
inline constexpr int kReadEvenSplit = -1;
cudaError_t launch_read_tiles(const StreamTmaMap& map, int64_t n, int64_t k, int rotation,
                              int split, int sm_count, void* sink, cudaStream_t stream,
                              int64_t first_tile = 0, int stages = 10, int rows = 64);

// Each of `ctas` blocks reads its own tile of 64 rows x k (block b rows 64 b ...) from `map`
// (stream_s8_weights_map's 3-D descriptor with 64 rows and `chunks` 2 or 4), one 3-D TMA load per
// k-tile of 128 x chunks bytes, 160 KB in flight (10 or 5 k-tiles). sink: read_sink_bytes(ctas).
cudaError_t launch_read_tiles_3d(const StreamTmaMap& map, int64_t k, int chunks, int ctas,
                                 void* sink, cudaStream_t stream);

// One block that does nothing: what a launch costs in the benchmark's timing harness.
cudaError_t launch_empty(cudaStream_t stream);

// `ctas` blocks of 384 threads that do nothing but hold 227 KB of shared memory each, as the
// swapped tiles' CTAs do: what such a launch costs.
cudaError_t launch_empty_wide(int ctas, cudaStream_t stream);

// One block that writes the %globaltimer (ns) at *out as it starts: launched before and after a
// kernel, what its launch and its end cost around its CTAs' own stamps.
cudaError_t launch_stamp(uint64_t* out, cudaStream_t stream);

// `ctas` blocks of 128 threads that each run `kb` (16 or 64) KB of straight-line machine code
// twice; block b writes the SM cycles of the first and the second pass at out[2 b], out[2 b + 1]
// (the first fetches the code, the second finds it in the SM's instruction caches).
cudaError_t launch_cold_code(int kb, int ctas, uint64_t* out, cudaStream_t stream);

}  // namespace qlinear::gpu
