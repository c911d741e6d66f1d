// A loaded layer: its immutable weights, every kernel prepared for it, and the kernel choice
// per M bucket. Immutable after creation and shared (std::shared_ptr) by the store and by every
// request running on it, so an unload or replace never frees memory under a running request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/kernel.h"
#include "kernels/core/weights.h"
#include "kernels/registry.h"

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
};

// The kernel that will serve one request.
struct KernelChoice {
  const Kernel* kernel = nullptr;
  const PreparedKernel* prepared = nullptr;
  std::vector<CandidateVerdict> explanation;  // filled only when asked for
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
  };

  // Prepares every usable kernel that can implement the layer at some M and computes the bucket
  // choices, ranking each bucket's measurable candidates by their measured time when autotune is
  // on (see Layer::autotune_bucket). A forced kernel that cannot run the layer is
  // FAILED_PRECONDITION. A failed measurement never fails the load.
  static absl::StatusOr<std::shared_ptr<const Layer>> create(
      Options options, std::shared_ptr<const LayerWeights> weights, const Registry& registry,
      const HostInfo& host);

  // Chooses the kernel for one request. `forced` (request) overrides the layer's forced kernel.
  // Without one: the first of the request's bucket's candidates (in the bucket's ranking, which
  // autotune may have reordered) that can implement the shape; the explanation names that same
  // kernel.
  absl::StatusOr<KernelChoice> choose(const ProblemShape& shape, absl::string_view forced,
                                      bool explain) const;

  const std::string& name() const { return options_.name; }
  const Options& options() const { return options_; }
  const LayerConfig& config() const { return weights_->config; }
  const LayerWeights& weights() const { return *weights_; }
  const std::vector<BucketInfo>& buckets() const { return buckets_; }
  int64_t total_bytes() const { return total_bytes_; }
  std::string device() const;
  int64_t loaded_unix_ms() const { return loaded_unix_ms_; }

 private:
  Layer(Options options, std::shared_ptr<const LayerWeights> weights, const Registry& registry,
        const HostInfo& host);

  struct Prepared {
    const Kernel* kernel;
    std::unique_ptr<PreparedKernel> state;
  };
  const PreparedKernel* find_prepared(const Kernel* k) const;
  // Measures bucket `bi`'s candidates that can implement `shape` and moves the measured ones, as
  // one block ranked fastest first, to the position of the first measurable candidate; those
  // whose measurement failed follow the block. Records the measurements in buckets_[bi].
  void autotune_bucket(size_t bi, const ProblemShape& shape);
  // The explanation of choosing `shape` in bucket `bi` from its ranked candidates; `chosen` is
  // set to the kernel that runs (null when no prepared candidate fits).
  absl::StatusOr<std::vector<CandidateVerdict>> explain_ranked(size_t bi, const ProblemShape& shape,
                                                               const Kernel** chosen) const;

  Options options_;
  std::shared_ptr<const LayerWeights> weights_;  // outlives prepared_ (declared first)
  const Registry& registry_;
  const HostInfo& host_;
  std::vector<Prepared> prepared_;  // in priority order
  // Per bucket, the prepared kernels that are usable and prefer that bucket, in priority order:
  // the request path walks this short list with can_implement only.
  std::vector<std::vector<const Prepared*>> bucket_candidates_;
  std::vector<BucketInfo> buckets_;
  int64_t total_bytes_ = 0;
  int64_t loaded_unix_ms_ = 0;
};

}  // namespace qlinear
