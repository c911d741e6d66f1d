#include "kernels/cpu/amx_kernel.h"

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cpu/avx512_vnni_kernel.h"
#include "kernels/cpu/cpu_support.h"

namespace qlinear::cpu {

absl::Status amx_supported(const HostInfo& host) { return amx_isa_status(host); }

namespace {

// Only tasks_per_thread applies to cpu.amx (the rest is the VNNI GEMM's streaming): 4, not 16.
// Every task reads its panels' weights whole, so fewer row ranges per panel read them fewer times.
// On a 16-core Xeon with AMX (amx_gemm alone, medians of 50 calls, the settings in turns, ms at
// M = 64 / 256 / 1024): 6144 x 4096, 16 tasks per thread 1.740 / 1.394 / 2.329, 4 0.300 / 0.823
// / 2.063, 2 0.379 / 0.695 / 1.791; 4096 x 14336 (M = 256 / 1024), 16 3.224 / 5.552, 4 1.551 /
// 5.157, 2 2.956 / 7.603. 4 was never far from the fastest.
VnniTuning amx_tuning() {
  VnniTuning t;
  t.tasks_per_thread = 4;
  return t;
}

class AmxKernel final : public Kernel {
 public:
  absl::string_view name() const override { return "cpu.amx"; }
  absl::Status is_supported(const HostInfo& host) const override { return amx_supported(host); }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    // Every scheme, dtype and shape: tails in M, N and K are handled, not refused.
    if (config.k > kMaxK) {
      return absl::InvalidArgumentError(absl::StrCat("K=", config.k, " exceeds ", kMaxK));
    }
    if (shape.m < 1) return absl::InvalidArgumentError("M must be >= 1");
    return absl::OkStatus();
  }
  // From M = 17: a tile multiplies 16 rows whatever the call holds, and at small M the weights'
  // stream bounds every CPU kernel. Measured with bench/cpu/qlinear_cpu_bench --quick on a
  // 2-core Intel Xeon with AMX (weights rotated past the L3; time of cpu.onednn, which runs AMX
  // there too, over this kernel's, same run; docs/kernels.md, "The AMX kernel"):
  //   (6144, 4096): M = 1 0.93, 16 1.28, 64 1.24, 256 1.19, 1024 1.16
  //   (4096, 4096): M = 1 1.20, 16 1.43, 64 1.26, 256 1.24, 1024 1.12
  // where cpu.avx512_vnni was 1.04-1.14 at M = 16 and 0.44-0.71 from M = 64. In a second run on
  // (4096, 4096): M = 2 1.34, 4 1.36, 8 1.41, 16 1.44, cpu.avx512_vnni 1.64, 1.55, 1.19, 1.15: it
  // leads from M = 8 and trails cpu.avx512_vnni by 0.1 ms at M = 2-4. On a GPU host's 16-thread
  // Xeon with AMX (157 GB/s), --quick, (6144, 4096): M = 16 0.99 against cpu.avx512_vnni's 1.39
  // (it streams the weights at 65 GB/s, cpu.avx512_vnni at 91), M = 256 1.22 against 1.01; where
  // the cores share more bandwidth the VNNI kernel's streaming leads through M = 16. So it comes
  // first in the priority order from M = 17; autotune measures it against the others on each
  // layer, host and bucket (it picked cpu.avx512_vnni at M = 16 and cpu.amx at 256 there).
  MRange preferred_m() const override { return MRange{17}; }
  // Its packed copy of the weights: N and K padded to 16 and 64.
  int64_t host_bytes_to_prepare(const LayerConfig& config) const override {
    return (config.n + 15) / 16 * 16 * ((config.k + 63) / 64 * 64);
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
    RETURN_IF_ERROR(amx_supported(host_info()));
    return prepare_panels(weights, amx_tuning(), PanelGemm::kAmx);
  }
};

}  // namespace

std::unique_ptr<Kernel> make_amx_kernel() { return std::make_unique<AmxKernel>(); }

}  // namespace qlinear::cpu
