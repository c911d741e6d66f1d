// cpu.avx2: the W8A8 op on AVX2 + FMA + F16C, bit-exact with cpu.reference, for x86-64 hosts
// without AVX-512 VNNI (AMD Zen 2 and Zen 3, Intel before Ice Lake server, client cores).
//
// This file pair is generic code (no ISA flags): it answers is_supported / can_implement, packs
// the weights at load and splits each call over the thread pool; the AVX2 code it calls lives in
// quantize_avx2, epilogue_avx2 and avx2_gemm, which are compiled for that ISA only and are never
// entered on a host that failed is_supported.
//
// Per call: quantize x to int16 xq per row, then one register-tiled VPMADDWD GEMM over the packed
// int8 weights with the epilogue fused per tile (avx2_gemm.h says why not VPMADDUBSW). Work is
// split over 16-column weight panels (and over row blocks when there are few panels or more
// than kAvx2MaxRows rows), claimed dynamically by the persistent pool; each panel streams from
// memory once per call (row blocks of one panel run on neighbouring tasks, so a second reads it
// mostly from cache).
//
// On hosts with AVX-512 VNNI, cpu.avx512_vnni and cpu.onednn come first in the priority order;
// cpu.avx2 serves where they cannot run (and where they are disabled).
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "kernels/core/host_info.h"
#include "kernels/core/kernel.h"

namespace qlinear::cpu {

// OK when this binary holds the AVX2 code and the host has avx2, fma and f16c; otherwise the
// reason, for users.
absl::Status avx2_supported(const HostInfo& host);

std::unique_ptr<Kernel> make_avx2_kernel();

}  // namespace qlinear::cpu
