// The two ceilings of a CPU W8A8 GEMM on this machine, measured rather than looked up: the DRAM
// read bandwidth every core together gets (the limit of small M, where each weight byte is used
// M times) and the VPDPBUSD rate of every core together (the limit of large M).
//
// Compiled with AVX-512 VNNI flags; call only on hosts that passed avx512_vnni_isa_status().
#pragma once

#include <cstddef>
#include <cstdint>

namespace qlinear::bench {

// Reads `bytes` bytes from `data` (64-byte aligned, bytes a multiple of 256) with 512-bit loads
// and returns a value that depends on all of them (so the loads cannot be dropped).
uint64_t read_stream_avx512(const uint8_t* data, size_t bytes);

// Runs `iterations` x 24 independent VPDPBUSD (zmm); returns a value that depends on them.
// Each VPDPBUSD is 64 int8 multiply-adds, i.e. 128 operations.
uint64_t vpdpbusd_loop_avx512(int64_t iterations);

}  // namespace qlinear::bench
