// A loaded layer: its immutable weights, the kernels prepared for it, and the kernel choice per
// M bucket. Shared (std::shared_ptr) by the store and by every request running on it, so an
// unload or replace never frees memory under a running request. Its weights and choices are
// immutable after creation; a kernel the layer cannot choose without forcing is prepared on the
// first request that needs it (thread-safe, once), which is the only state that changes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/core/kernel.h"
#include "kernels/core/tuning_cache.h"
#include "kernels/core/weights.h"
#include "kernels/registry.h"
#include "server/core/host_memory.h"

namespace qlinear {

// One candidate's autotune measurement at load.
struct KernelMeasurement {
  std::string kernel;
  double us = 0;      // one call at the bucket's measured M, when `error` is empty
  std::string error;  // why the measurement failed; empty when it succeeded
};

struct BucketInfo {
  MBucket bucket;
  std::string kernel;  // chosen for bf16 in and out; empty if none fits
  std::vector<CandidateVerdict> explanation;
  // Autotune: the candidates measured at load with bf16 in and out at M = measured_m, in priority
  // order. Empty when the priority order alone ranks the bucket (autotune off, a forced kernel,
  // or fewer than two measurable candidates).
  int64_t measured_m = 0;
  std::vector<KernelMeasurement> measured;
  // Whether `measured` are the times an earlier layer of the same N, K, scheme and bias measured
  // for the same candidates, each running the same variant of itself (Options::tuning).
  bool measured_shared = false;
  // The kernel first in the priority order among those measured, where another measured faster
  // by no more than its measure_margin (this fraction) and it kept the lead; empty otherwise.
  std::string kept_by_margin;
  double margin = 0;
};

// The kernel that will serve one request.
struct KernelChoice {
  const Kernel* kernel = nullptr;
  const PreparedKernel* prepared = nullptr;
  std::vector<CandidateVerdict> explanation;  // filled only when asked for
  bool prepared_now = false;  // this call prepared the kernel (the layer's bytes grew)
};

class Layer {
 public:
  struct Options {
    std::string name;
    std::string forced_kernel;  // every request runs here unless it forces another
    // Measure the eligible candidates of each M bucket at load and rank the measurable ones by
    // time (SPEC section 6, autotune); off, or with a forced kernel, the priority order decides.
    bool autotune = true;
    std::string weight_sha256;
    std::vector<int64_t> logical_widths;
    // Where the layer takes what an earlier layer of its shape timed at load (autotune's
    // measurements, and what its kernels time for themselves) and stores what it times (see
    // TuningCache); null: the layer times everything itself.
    std::shared_ptr<TuningCache> tuning;
    // The host memory left, against which each kernel that takes host memory reserves what it
    // needs (Kernel::host_bytes_to_prepare) while it is prepared, at load and on demand: one that
    // needs more than is left beside the other allocations under way is RESOURCE_EXHAUSTED rather
    // than the process killed for memory. Null: not checked.
    std::shared_ptr<HostMemoryLedger> host_memory;
  };

  // Prepares the kernels the layer can choose without forcing (see may_choose in layer.cc) and
  // the forced kernel, and computes the bucket choices, ranking each bucket's measurable
  // candidates by their measured time when autotune is on (see Layer::autotune_bucket). Other
  // usable kernels that can implement the layer somewhere are prepared on demand by choose(). A
  // forced kernel that cannot run the layer is FAILED_PRECONDITION. A failed measurement never
  // fails the load; a failed prepare does.
  static absl::StatusOr<std::shared_ptr<const Layer>> create(
      Options options, std::shared_ptr<const LayerWeights> weights, const Registry& registry,
      const HostInfo& host);

  // Whether `forced` (a layer's forced kernel) can serve a layer of configuration `c` on this
  // host: INVALID_ARGUMENT for an unknown name, FAILED_PRECONDITION naming why it cannot. create
  // checks it, and an upload checks it at its header, before any weight arrives.
  static absl::Status check_forced_kernel(const Registry& registry, const HostInfo& host,
                                          const LayerConfig& c, const std::string& forced);

  // Chooses the kernel for one request. `forced` (request) overrides the layer's forced kernel.
  // Without one: the first of the request's bucket's candidates (in the bucket's ranking, which
  // autotune may have reordered) that can implement the shape; the explanation names that same
  // kernel. A chosen kernel not prepared yet is prepared now, once (a failure is this request's
  // status, and the next request tries again); once it is prepared, choose takes no lock.
  absl::StatusOr<KernelChoice> choose(const ProblemShape& shape, absl::string_view forced,
                                      bool explain) const;

  const std::string& name() const { return options_.name; }
  const Options& options() const { return options_; }
  const LayerConfig& config() const { return weights_->config; }
  const LayerWeights& weights() const { return *weights_; }
  const std::vector<BucketInfo>& buckets() const { return buckets_; }
  // The weights plus every prepared kernel's extra bytes; grows when a kernel is prepared on
  // demand.
  int64_t total_bytes() const { return total_bytes_.load(std::memory_order_relaxed); }
  std::string device() const;
  int64_t loaded_unix_ms() const { return loaded_unix_ms_; }

 private:
  Layer(Options options, std::shared_ptr<const LayerWeights> weights, const Registry& registry,
        const HostInfo& host);

  // A usable kernel that can implement the layer somewhere, prepared at load or on demand.
  struct Slot {
    explicit Slot(const Kernel* k) : kernel(k) {}
    const Kernel* const kernel;
    std::atomic<const PreparedKernel*> ready{nullptr};  // == state.get() once prepared
    absl::Mutex mu;                                     // held while preparing
    std::unique_ptr<PreparedKernel> state;              // written once, under mu
    // A CPU kernel not prepared at load because an earlier layer of the same shape measured it
    // slower everywhere and released it: autotune ranks it by that layer's times.
    bool released_by_earlier_layer = false;
  };
  Slot* find_slot(const Kernel* k) const;
  // The slot's prepared kernel, preparing it first if needed (*prepared_now then set, when
  // given). Lock-free once prepared. At load (`at_load`) the kernel shares what it times through
  // options_.tuning; a kernel prepared on demand, while requests run on the GPU, takes what is
  // stored there but stores nothing, and times with less scratch (PrepareContext::on_demand).
  absl::StatusOr<const PreparedKernel*> prepared(Slot& slot, bool at_load,
                                                 bool* prepared_now = nullptr) const;
  // What one load measured: per key (the candidates, their variants and the measured shape, as
  // autotune_bucket stores them in options_.tuning), each candidate's time or error.
  using LoadTimes =
      std::map<std::string, std::vector<std::pair<std::string, absl::StatusOr<double>>>>;
  // Measures bucket `bi`'s prepared, measurable candidates that can implement `shape`, of the
  // family (the name up to its '.', the device) of the first of them, at `shape`'s M or the
  // smallest max_measured_m among them if lower, and moves the measured ones, as one block ranked
  // fastest first, to the position of the first of them; those whose measurement failed follow
  // the block. Records the measurements in buckets_[bi]. A bucket measured at the same M as an
  // earlier one of the same load takes that one's times from `load_times`.
  void autotune_bucket(size_t bi, const ProblemShape& shape, LoadTimes* load_times);
  // At the end of a load without a forced kernel: releases every prepared CPU kernel that no
  // bucket ranks first among those that can run a probed shape (a bucket's ends and its measured
  // M, every dtype pair), so that a kernel prepared only to be measured, and measured slower
  // everywhere, holds no packed copy. A request that needs it later prepares it again (choose).
  // GPU kernels stay: they share the layer's device copy of the weights.
  void release_unchosen();
  // The explanation of choosing `shape` in bucket `bi` from its ranked candidates; `chosen` is
  // set to the kernel that runs (null when no candidate fits).
  absl::StatusOr<std::vector<CandidateVerdict>> explain_ranked(size_t bi, const ProblemShape& shape,
                                                               const Kernel** chosen) const;

  Options options_;
  std::shared_ptr<const LayerWeights> weights_;  // outlives slots_ (declared first)
  const Registry& registry_;
  const HostInfo& host_;
  // In priority order; created at load and never added to, so pointers to them stay valid.
  std::vector<std::unique_ptr<Slot>> slots_;
  // Per bucket, the slots whose kernels prefer that bucket, in the bucket's ranking (priority
  // order, or autotune's): the request path walks this short list with can_implement only.
  std::vector<std::vector<Slot*>> bucket_candidates_;
  std::vector<BucketInfo> buckets_;
  mutable std::atomic<int64_t> total_bytes_{0};
  // Whether every CPU measurement of this load succeeded (only then does it share the CPU kernels
  // it kept with later layers of its shape).
  bool cpu_measurements_ok_ = true;
  int64_t loaded_unix_ms_ = 0;
};

}  // namespace qlinear
