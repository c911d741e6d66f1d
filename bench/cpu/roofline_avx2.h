// The ceilings of the AVX2 W8A8 GEMM on this machine, measured rather than looked up, for hosts
// without AVX-512 VNNI: the DRAM read bandwidth (as roofline_avx512.h, with 256-bit loads) and
// the rate of cpu.avx2's inner pair, VPMADDWD then VPADDD, on every core together.
//
// Compiled with AVX2 flags; call only on hosts that passed avx2_isa_status().
#pragma once

#include <cstddef>
#include <cstdint>

namespace qlinear::bench {

// Reads `bytes` bytes from `data` (64-byte aligned, bytes a multiple of 256) with 256-bit loads
// and returns a value that depends on all of them (so the loads cannot be dropped).
uint64_t read_stream_avx2(const uint8_t* data, size_t bytes);

// Runs `iterations` x 12 independent VPMADDWD + VPADDD pairs (ymm); returns a value that depends
// on them. Each VPMADDWD is 16 multiply-adds, i.e. 32 operations (int8 operations: each of its
// products is one of the GEMM's int8 x int8 products).
uint64_t vpmaddwd_loop_avx2(int64_t iterations);

}  // namespace qlinear::bench
