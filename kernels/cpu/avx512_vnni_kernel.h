// cpu.avx512_vnni: the W8A8 op on AVX-512 VNNI (VPDPBUSD), bit-exact with cpu.reference.
//
// This file pair is generic code (no ISA flags): it answers is_supported / can_implement, packs
// the weights at load and splits each call over the thread pool; the AVX-512 code it calls lives
// in quantize_avx512, epilogue_avx512 and avx512_vnni_gemm, which are compiled for that ISA only
// and are never entered on a host that failed is_supported.
//
// Per call: quantize x to xq + 128 (uint8) per row, then one register-tiled GEMM over the packed
// weights with the epilogue fused per tile. Work is split over 64-column weight panels (and over
// row blocks when there are few panels), claimed dynamically by the persistent pool, so every
// panel streams from memory once per call whatever M is. Up to VnniTuning::stream_max_m rows a
// panel's rows stay in one task; up to block_max_m rows the row tiles go through K in blocks,
// streaming the next block while they multiply.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "kernels/core/host_info.h"
#include "kernels/core/kernel.h"

namespace qlinear::cpu {

// OK when this binary holds the AVX-512 VNNI code and the host has avx512f, avx512bw, avx512vl
// and avx512_vnni; otherwise the reason, for users.
absl::Status avx512_vnni_supported(const HostInfo& host);

// How cpu.avx512_vnni splits and streams a call. The defaults are what the server runs;
// qlinear_cpu_bench --vnni-variants times others beside them (avx512_vnni_kernel.cc has the
// measurements behind the defaults).
struct VnniTuning {
  // Up to this M a panel's rows stay in one task where there are whole_rows_min_panels panels per
  // thread (so each panel streams from DRAM into one core), and a single row tile prefetches the
  // weights prefetch_bytes ahead.
  int64_t stream_max_m = 128;
  int64_t prefetch_bytes = 1024;      // 0: no prefetch
  int64_t whole_rows_min_panels = 2;  // 0: rows split as at larger M (GemmSplit)
  // Up to this M a task's row tiles go through K in k_block-deep blocks, and with
  // prefetch_next_block each block's tiles stream the next one into L2 (beyond, and with
  // k_block 0, K is blocked only past 4096).
  int64_t block_max_m = 256;
  int64_t k_block = 512;
  bool prefetch_next_block = true;
  // Tasks per thread: the last task bounds the imbalance between threads (a late-waking worker,
  // or a core taken by another process), the number of tasks bounds the claiming overhead.
  int64_t tasks_per_thread = 16;
  // Quantize rows on several threads only when there is enough of it to repay the hand-off.
  int64_t parallel_quantize_min_elems = int64_t{1} << 15;
};

std::unique_ptr<Kernel> make_avx512_vnni_kernel();

// The prepared form cpu.avx512_vnni and cpu.amx share: the weights packed in 64-column panels
// (vnni_pack.h), x quantized per row to xq + 128, then the GEMM's tiles with the epilogue fused,
// split over the thread pool. Call only after the kernel's own is_supported passed.
enum class PanelGemm { kVnni, kAmx };
absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare_panels(const LayerWeights& weights,
                                                               const VnniTuning& tuning,
                                                               PanelGemm gemm);
// The kernel with other tuning (benchmarks and tests; the server runs the defaults).
std::unique_ptr<Kernel> make_avx512_vnni_kernel(const VnniTuning& tuning);

}  // namespace qlinear::cpu
