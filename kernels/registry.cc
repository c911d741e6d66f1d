#include "kernels/registry.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/core/status.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/reference/reference_w8a8.h"
#if QLINEAR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace qlinear {

const std::vector<std::string>& kernel_priority_order() {
  static const std::vector<std::string> order = {
      // NVIDIA GPUs.
      "cuda.gemv_s8",       // small M: streams the weights once, quantizes in the same launch
      "cuda.stream_s8",     // small M: weight stream started ahead of the quantization
      "cuda.cutlass_sm90",  // Hopper, every M, fused epilogue
      "cuda.cublaslt",      // any NVIDIA GPU; separate epilogue kernel
      // CPUs.
      "cpu.amx",          // AMX tiles (TDPBUSD), for CPUs with AMX-INT8
      "cpu.avx512_vnni",  // VPDPBUSD micro-kernels, small-M weight streaming
      "cpu.onednn",       // oneDNN int8 matmul
      "cpu.avx2",         // VPMADDWD micro-kernels, for hosts without AVX-512 VNNI
      "cpu.reference",    // the oracle; always fits
  };
  return order;
}

const std::vector<MBucket>& m_buckets() {
  // Decode (1), small batches, then powers of four up to prefill sizes.
  static const std::vector<MBucket> buckets = {
      {1, 1}, {2, 16}, {17, 64}, {65, 256}, {257, 1024}, {1025, INT64_MAX},
  };
  return buckets;
}

size_t m_bucket_index(int64_t m) {
  const auto& b = m_buckets();
  for (size_t i = 0; i < b.size(); ++i) {
    if (m <= b[i].hi) return i;
  }
  return b.size() - 1;
}

namespace {

size_t priority_of(absl::string_view name) {
  const auto& order = kernel_priority_order();
  return static_cast<size_t>(std::find(order.begin(), order.end(), name) - order.begin());
}

std::string range_str(int64_t lo, int64_t hi) {
  return hi == INT64_MAX ? absl::StrCat(">= ", lo) : absl::StrCat(lo, "..", hi);
}

}  // namespace

absl::Status Registry::add(std::unique_ptr<Kernel> kernel) {
  const absl::string_view name = kernel->name();
  const size_t prio = priority_of(name);
  if (prio == kernel_priority_order().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel '", name, "' is not in the priority order"));
  }
  if (find(name) != nullptr) return absl::OkStatus();  // idempotent
  auto pos = std::find_if(kernels_.begin(), kernels_.end(),
                          [&](const auto& k) { return priority_of(k->name()) > prio; });
  kernels_.insert(pos, std::move(kernel));
  return absl::OkStatus();
}

std::vector<const Kernel*> Registry::kernels() const {
  std::vector<const Kernel*> out;
  for (const auto& k : kernels_) out.push_back(k.get());
  return out;
}

const Kernel* Registry::find(absl::string_view name) const {
  for (const auto& k : kernels_) {
    if (k->name() == name) return k.get();
  }
  return nullptr;
}

absl::Status Registry::set_disabled(const std::vector<std::string>& names) {
  // Any name of the priority order is accepted, compiled in or not, so that one configuration
  // serves every host; anything else is a typo that would silently leave a kernel on.
  const auto& order = kernel_priority_order();
  for (const std::string& n : names) {
    if (std::find(order.begin(), order.end(), n) == order.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot disable unknown kernel '", n, "'; known kernels: ", absl::StrJoin(order, ", ")));
    }
  }
  disabled_ = absl::flat_hash_set<std::string>(names.begin(), names.end());
  return absl::OkStatus();
}

absl::Status Registry::usable(const Kernel& kernel, const HostInfo& host) const {
  if (is_disabled(kernel.name())) {
    return absl::FailedPreconditionError("disabled by the operator");
  }
  return kernel.is_supported(host);
}

absl::StatusOr<Selection> Registry::select(const HostInfo& host, const LayerConfig& config,
                                           const ProblemShape& shape, absl::string_view forced,
                                           int64_t bucket_lo, int64_t bucket_hi) const {
  Selection sel;
  if (!forced.empty()) {
    const Kernel* k = find(forced);
    if (k == nullptr) {
      std::vector<std::string> known;
      for (const auto& kk : kernels_) known.emplace_back(kk->name());
      return absl::InvalidArgumentError(
          absl::StrCat("unknown kernel '", forced, "'; registered: ", absl::StrJoin(known, ", ")));
    }
    absl::Status s = usable(*k, host);
    if (s.ok()) s = k->can_implement(config, shape);
    if (!s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("forced kernel ", forced, " cannot run this request: ", s.message()));
    }
    sel.kernel = k;
    for (const auto& kk : kernels_) {
      sel.explanation.push_back(
          {std::string(kk->name()), kk.get() == k, kk.get() == k ? "" : "not forced"});
    }
    return sel;
  }
  for (const auto& kk : kernels_) {
    CandidateVerdict v{std::string(kk->name()), false, ""};
    if (sel.kernel != nullptr) {
      v.reason = "a higher-priority kernel was selected";
      sel.explanation.push_back(std::move(v));
      continue;
    }
    absl::Status s = usable(*kk, host);
    if (s.ok() && !kk->preferred_m().contains(bucket_lo, bucket_hi)) {
      const MRange r = kk->preferred_m();
      s = absl::FailedPreconditionError(absl::StrCat("prefers M ", range_str(r.min, r.max),
                                                     ", bucket is M ",
                                                     range_str(bucket_lo, bucket_hi)));
    }
    if (s.ok()) s = kk->can_implement(config, shape);
    if (s.ok()) {
      v.selected = true;
      sel.kernel = kk.get();
    } else {
      v.reason = std::string(s.message());
    }
    sel.explanation.push_back(std::move(v));
  }
  if (sel.kernel == nullptr) {
    std::vector<std::string> reasons;
    for (const auto& v : sel.explanation) reasons.push_back(absl::StrCat(v.kernel, ": ", v.reason));
    return absl::FailedPreconditionError(
        absl::StrCat("no kernel can run this request (", absl::StrJoin(reasons, "; "), ")"));
  }
  return sel;
}

absl::Status register_builtin_kernels(Registry* registry) {
  // Order of these calls does not matter: the priority order decides.
#if QLINEAR_HAVE_CUDA
  RETURN_IF_ERROR(register_cuda_kernels(registry));
#endif
  RETURN_IF_ERROR(register_cpu_kernels(registry));
  return registry->add(reference::make_reference_kernel());
}

void enable_cuda_graphs(bool enabled) {
#if QLINEAR_HAVE_CUDA
  set_cuda_graphs(enabled);
#else
  (void)enabled;
#endif
}

absl::StatusOr<int64_t> reserve_gpu_staging(int64_t bytes) {
#if QLINEAR_HAVE_CUDA
  return reserve_cuda_staging(bytes);
#else
  (void)bytes;
  return 0;
#endif
}

int64_t trim_gpu_staging(absl::Duration idle) {
#if QLINEAR_HAVE_CUDA
  return trim_cuda_staging(absl::ToChronoNanoseconds(idle));
#else
  (void)idle;
  return 0;
#endif
}

GpuStagingBytes gpu_staging_bytes() {
  GpuStagingBytes b;
#if QLINEAR_HAVE_CUDA
  std::tie(b.host, b.device) = cuda_staging_bytes();
#endif
  return b;
}

std::string start_cpu_kernel_threads() {
  const cpu::ThreadPool& pool = cpu::ThreadPool::global();
  return describe_cpu_kernel_threads(pool.threads(), pool.threads_asked());
}

std::string describe_cpu_kernel_threads(int threads, int asked) {
  std::string s = absl::StrCat("CPU kernels on ", threads, " thread", threads == 1 ? "" : "s");
  if (threads < asked) {
    absl::StrAppend(&s, " (warning: only ", threads, " of the ", asked,
                    " it was sized for could be started: the host's limit of threads, e.g. "
                    "ulimit -u or the cgroup's pids.max, was reached; they stay ",
                    threads, " until a restart)");
  }
  return s;
}

std::vector<std::string> parse_kernel_list(absl::string_view csv) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(csv, ',')) {
    absl::string_view p = absl::StripAsciiWhitespace(part);
    if (!p.empty()) out.emplace_back(p);
  }
  return out;
}

}  // namespace qlinear
