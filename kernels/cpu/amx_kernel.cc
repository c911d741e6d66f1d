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
// On a 16-core Xeon with AMX (amx_gemm alone, medians of 36 calls, the settings in turns, ms at
// M = 64 / 256 / 1024): 6144 x 4096 with 16 tasks per thread 1.155 / 1.540 / 4.448 and 4 tasks
// 0.621 / 1.471 / 4.834 for the GEMM before its row pairs and A tiles, 0.531 / 1.314 / 4.078 for
// the GEMM now; 4096 x 14336, 3.284 / 3.907 / 9.201, 1.079 / 2.895 / 8.790 and 0.856 / 2.483 /
// 8.549. (2 tasks per thread measured faster on 6144 x 4096 at M = 256 and 1024, and up to 1.5x
// slower on 4096 x 14336.) A call of one row tile (M <= 16) streams the weights and takes
// kAmxStreamTasksPerThread (16) instead: at M = 1 / 4 / 16 on 6144 x 4096 0.173 / 0.172 / 0.181
// ms against 0.181 / 0.179 / 0.198 with 4, at M = 1 / 16 on 28672 x 4096 0.598 / 0.652 against
// 0.661 / 0.679, on 4096 x 14336 0.333 / 0.349 against 0.344 / 0.327.
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
  // stream bounds every CPU kernel. Measured with bench/cpu/qlinear_cpu_bench --quick (weights
  // rotated past the L3; time of cpu.onednn, which runs AMX there too, over this kernel's, same
  // run; docs/kernels.md, "The AMX kernel"). On a 2-core Intel Xeon with AMX:
  //   (6144, 4096): M = 1 1.24, 16 1.27, 64 1.12, 256 1.30, 1024 1.31
  //   (4096, 4096): M = 1 1.08, 16 1.41, 64 1.25, 256 1.29, 1024 1.24
  // where cpu.avx512_vnni was 0.94-1.06 at M = 16 and 0.45-0.71 from M = 64. On a GPU host's
  // 16-thread Xeon with AMX (125-147 GB/s read), M = 1 / 16 / 256: (6144, 4096) 1.53 / 1.46 /
  // 1.35, (4096, 4096) 1.40 / 1.32 / 1.66, (28672, 4096) 1.58 / 1.60 / 1.95, (4096, 14336) 1.49 /
  // 1.59 / 1.62, against cpu.avx512_vnni's 1.69 / 1.43 / 0.90, 1.67 / 1.33 / 1.04, 1.69 / 1.50 /
  // 1.05, 1.71 / 1.67 / 1.11: where the cores share more bandwidth the VNNI kernel streams the
  // weights fastest at M = 1, and the two are level through M = 16. So it comes first in the
  // priority order from M = 17; autotune measures it against the others on each layer, host and
  // bucket.
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
