// The kernel registry (SPEC section 6): one explicit ordered candidate list per platform, best
// first, the reference last; the first candidate that passes every check wins, and every skip
// has a reason. No static self-registration: `register_builtin_kernels` names what is compiled in.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/core/host_info.h"
#include "kernels/core/kernel.h"

namespace qlinear {

// The priority order, best first. A name here need not be compiled in; a kernel whose name is
// not here cannot be registered. GPU kernels come first: when a usable GPU is present, a layer
// lives there; otherwise each declines with the reason and the CPU list takes over.
const std::vector<std::string>& kernel_priority_order();

// M buckets: the layer keeps one kernel choice per bucket. Bounds are inclusive.
struct MBucket {
  int64_t lo;
  int64_t hi;
};
const std::vector<MBucket>& m_buckets();
size_t m_bucket_index(int64_t m);

// One line of a selection explanation.
struct CandidateVerdict {
  std::string kernel;
  bool selected = false;
  std::string reason;  // why skipped; empty when selected
};

struct Selection {
  const Kernel* kernel = nullptr;
  std::vector<CandidateVerdict> explanation;
};

// Thread-safe for concurrent readers once set up; `add` and `set_disabled` are set-up calls.
class Registry {
 public:
  // Inserts `kernel` at the position its name has in kernel_priority_order(). Registering a name
  // that is already present keeps the first registration (idempotent). A name missing from the
  // order is INVALID_ARGUMENT.
  absl::Status add(std::unique_ptr<Kernel> kernel);

  // Registered kernels, in priority order.
  std::vector<const Kernel*> kernels() const;
  const Kernel* find(absl::string_view name) const;

  // Kernels the operator turned off (QLINEAR_DISABLED_KERNELS, --disabled-kernels). Names of the
  // priority order are accepted even when not compiled in (one configuration for every host);
  // other names are INVALID_ARGUMENT so that a typo does not silently leave a kernel on.
  absl::Status set_disabled(const std::vector<std::string>& names);
  bool is_disabled(absl::string_view name) const { return disabled_.contains(name); }

  // Whether `kernel` can run on `host` at all: OK, or the reason (disabled, unsupported).
  absl::Status usable(const Kernel& kernel, const HostInfo& host) const;

  // Picks the kernel for (config, shape). With `forced` non-empty, that kernel or an error:
  // unknown name -> INVALID_ARGUMENT; disabled, unsupported or cannot implement ->
  // FAILED_PRECONDITION naming the reason. Without it, the first candidate that is usable, prefers
  // the M bucket [bucket_lo, bucket_hi] and can implement the shape; when none fits,
  // FAILED_PRECONDITION listing every candidate's reason.
  absl::StatusOr<Selection> select(const HostInfo& host, const LayerConfig& config,
                                   const ProblemShape& shape, absl::string_view forced,
                                   int64_t bucket_lo, int64_t bucket_hi) const;

 private:
  std::vector<std::unique_ptr<Kernel>> kernels_;  // kept in priority order
  absl::flat_hash_set<std::string> disabled_;
};

// Registers every kernel compiled into this binary. An error (a kernel whose name is missing from
// kernel_priority_order()) is a bug in this build, never a property of the host.
absl::Status register_builtin_kernels(Registry* registry);

// Whether the CUDA kernels replay small calls from CUDA graphs (on by default; see
// kernels/cuda/cuda_host_call.h). A no-op in a binary built without CUDA.
void enable_cuda_graphs(bool enabled);

// Reserves `bytes` of pinned host memory and as much GPU memory for each of the CUDA serving
// path's stream contexts now, so that requests whose copies fit never allocate (without it the
// first request of a new largest size on a context grows that context's buffers: on the H200
// host about 20 ms at M = 2048 on a 4096 x 4096 layer). Returns the bytes reserved in all: 0 with
// `bytes` 0, without a usable GPU and in a binary built without CUDA.
absl::StatusOr<int64_t> reserve_gpu_staging(int64_t bytes);

// Shrinks the CUDA serving path's stream contexts back to the start-up reservation where no call
// has needed more for `idle` (a context in use is skipped); returns the bytes released, pinned
// host and GPU memory together. Frees GPU memory, which waits for the device's work in flight:
// for a housekeeping thread, not a request. 0 in a binary built without CUDA or before any GPU
// call.
int64_t trim_gpu_staging(absl::Duration idle);

// What the CUDA serving path's stream contexts hold now: pinned host and GPU memory (zeros
// before any GPU call, and in a binary built without CUDA).
struct GpuStagingBytes {
  int64_t host = 0;
  int64_t device = 0;
};
GpuStagingBytes gpu_staging_bytes();

// Starts the CPU kernels' thread pool now (else their first call does) and describes it for the
// start-up log: "CPU kernels on T threads", and where the host's limit of threads stopped some
// of the workers, how many it was sized for and that it stays that narrow.
std::string start_cpu_kernel_threads();
// The description alone, for `threads` started of `asked`.
std::string describe_cpu_kernel_threads(int threads, int asked);

// Parses "a,b , c" into names (empty entries dropped).
std::vector<std::string> parse_kernel_list(absl::string_view csv);

}  // namespace qlinear
