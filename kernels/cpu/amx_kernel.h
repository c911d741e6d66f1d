// cpu.amx: the W8A8 op on AMX tiles (TDPBUSD), bit-exact with cpu.reference, for the batch and
// prefill sizes where the multiplies bound a call on CPUs with AMX-INT8 (Intel Xeon from
// Sapphire Rapids on).
//
// This file pair is generic code (no ISA flags): it answers is_supported / can_implement; its
// prepared form is cpu.avx512_vnni's (prepare_panels, avx512_vnni_kernel.h) with the AMX GEMM
// (amx_gemm), which, as the AVX-512 quantization and epilogue, is compiled for its ISA only and
// never entered on a host that failed is_supported.
//
// Per call: quantize x to xq + 128 (uint8) per row, then the tile GEMM over cpu.avx512_vnni's
// packed panels (K padded to 64) with the epilogue fused per tile, split over 64-column panels
// and, where the panels are too few for the threads, over row ranges of 16-row tiles.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "kernels/core/host_info.h"
#include "kernels/core/kernel.h"

namespace qlinear::cpu {

// OK when this binary holds the AMX code, the host has AMX-INT8 and AVX-512 VNNI, and the OS gave
// this process the tiles' state; otherwise the reason, for users.
absl::Status amx_supported(const HostInfo& host);

std::unique_ptr<Kernel> make_amx_kernel();

}  // namespace qlinear::cpu
