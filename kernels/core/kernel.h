// The kernel interface (SPEC section 6). A kernel answers "can I?" before "do it":
//   is_supported(host)          can this host run me at all (ISA, GPU, compiled in)?
//   can_implement(layer, shape) can I compute this layer at this shape (scheme, alignment, M)?
//   prepare(weights)            once per layer (at load, or on first use): pack a private copy
//                               (prepare_with_tuning: and take what it times from an earlier
//                               layer of the same shape, see PrepareContext).
//   PreparedKernel::run(args)   per request.
// Each check returns OK or a status whose message is the reason, shown to users verbatim.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/host_info.h"
#include "kernels/core/layer.h"

namespace qlinear {

class TuningCache;  // kernels/core/tuning_cache.h

// How a layer prepares a kernel (Kernel::prepare_with_tuning).
struct PrepareContext {
  // What the loads of earlier layers of the same N, K, scheme and bias timed (see TuningCache):
  // a kernel takes its own choices from there where they are stored, and stores what it times
  // otherwise. nullptr: nothing is shared.
  TuningCache* tuning = nullptr;
  // Prepared on demand: by a request, for a kernel the layer's load did not prepare (one the
  // request names), while the device serves other requests. The kernel still takes what
  // `tuning` holds, but stores nothing there (what it times beside running requests is not what
  // a load times), and times with less scratch (cuda.cutlass_sm90 times its tiles cold, without
  // the rotated timing's copies of the weights, up to 512 MB), so that serving layers keep more
  // of the device memory they may need. Where it times its own choices, its explanation says
  // "on first use" where a load's says "at load".
  bool on_demand = false;
};

// Rows of activations a kernel is best at; the registry skips it for M buckets outside.
struct MRange {
  int64_t min = 1;
  int64_t max = std::numeric_limits<int64_t>::max();
  bool contains(int64_t lo, int64_t hi) const { return lo >= min && hi <= max; }
};

// A kernel bound to one layer's weights. `run` may be called from many threads at once.
class PreparedKernel {
 public:
  virtual ~PreparedKernel() = default;
  // Quantizes x, runs the GEMM and the epilogue. Fails with INVALID_ARGUMENT on non-finite input
  // (naming the first bad row); never aborts.
  virtual absl::Status run(const RunArgs& args, RunTimings* timings) const = 0;
  // Bytes this kernel holds for the layer beyond the shared LayerWeights (packed copies).
  virtual int64_t extra_bytes() const { return 0; }
  // Where the kernel computes, e.g. "cpu" or "cuda:0".
  virtual std::string device() const { return "cpu"; }
  // Autotune (SPEC section 6): the time in microseconds of one call at `shape` (the layer's N and
  // K; M rows; x and y in the shape's dtypes) on synthetic inputs, with the weights read from
  // memory as in serving (the GPU kernels: cold cache); the median of several calls. Kernels
  // whose speed the priority order cannot predict implement it: the GPU kernels, and the CPU
  // kernels but the reference (which of them is fastest depends on the CPU). The default,
  // UNIMPLEMENTED, means "not measurable: the priority order decides". Called at load, never on a
  // request path.
  virtual absl::StatusOr<double> measure_us(const ProblemShape& shape) const {
    (void)shape;
    return absl::UnimplementedError("not measurable; the priority order decides");
  }
  // The largest M measure_us times: a bucket whose measured M is larger is measured at this M
  // (the CPU kernels: one call at M = 2048 on a large layer takes seconds on a small host).
  virtual int64_t max_measured_m() const { return std::numeric_limits<int64_t>::max(); }
  // How much faster another kernel must measure to be ranked ahead of this one where the priority
  // order ranks this one first among the measured: this one keeps the lead while its time is at
  // most (1 + margin) times the fastest. The noise of its measurement; 0, the default: the
  // faster time wins.
  virtual double measure_margin() const { return 0.0; }
  // How the kernel runs m rows where it chooses for itself (cuda.cutlass_sm90: the tile it timed
  // fastest at load, and the launch), for a request's selection explanation; empty where it has
  // no such choice. Not called on the hot path.
  virtual std::string variant(int64_t m) const {
    (void)m;
    return "";
  }
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Stable name, e.g. "cpu.reference"; used for forcing, disabling and metadata.
  virtual absl::string_view name() const = 0;
  virtual absl::Status is_supported(const HostInfo& host) const = 0;
  virtual absl::Status can_implement(const LayerConfig& config,
                                     const ProblemShape& shape) const = 0;
  virtual MRange preferred_m() const { return MRange{}; }
  // Whether its PreparedKernel may time itself (PreparedKernel::measure_us, autotune). False
  // promises that it never does: autotune never measures the kernel, so a layer need not prepare
  // it at load where higher-priority kernels cover every shape it could be chosen for. The
  // default, true, is the safe answer for a kernel that does not say.
  virtual bool measurable() const { return true; }
  // About how many bytes of host memory prepare takes for a layer of configuration `config` (a
  // packed copy of its weights), so that a load can be refused RESOURCE_EXHAUSTED where the host
  // lacks them, rather than the process be killed for memory as the copy's pages are touched. 0,
  // the default: none, or device memory only.
  virtual int64_t host_bytes_to_prepare(const LayerConfig& config) const {
    (void)config;
    return 0;
  }
  // `weights` outlives the returned object.
  virtual absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const = 0;
  // prepare, where what the kernel times for itself (cuda.cutlass_sm90's tiles, ...) is taken
  // from context.tuning when an earlier layer of the same shape stored it there, and stored there
  // otherwise (see PrepareContext; a default context: prepare). The default, for kernels that
  // time nothing of their own, is prepare.
  virtual absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare_with_tuning(
      const LayerWeights& weights, const PrepareContext& context) const {
    (void)context;
    return prepare(weights);
  }
};

// A kernel's family: its name up to the first '.' ("cpu", "cuda"), the device it computes on.
// Autotune ranks a kernel by its measured time only among the kernels of its family.
inline absl::string_view kernel_family(absl::string_view kernel_name) {
  return kernel_name.substr(0, kernel_name.find('.'));
}
inline absl::string_view kernel_family(const Kernel& k) { return kernel_family(k.name()); }

}  // namespace qlinear
