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
// panel streams from memory once per call whatever M is.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "kernels/core/host_info.h"
#include "kernels/core/kernel.h"

namespace qlinear::cpu {

// OK when this binary holds the AVX-512 VNNI code and the host has avx512f, avx512bw, avx512vl
// and avx512_vnni; otherwise the reason, for users.
absl::Status avx512_vnni_supported(const HostInfo& host);

std::unique_ptr<Kernel> make_avx512_vnni_kernel();

}  // namespace qlinear::cpu
