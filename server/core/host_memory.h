// How much memory a layer upload may still take, read from the kernel's own accounting.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace qlinear {

// The bytes this process may still allocate: the host's MemAvailable (/proc/meminfo), and, inside
// a cgroup with a memory limit (a container, a Kubernetes pod), no more than that limit less the
// cgroup's working set (its usage less its inactive file pages, which the kernel reclaims first:
// what the kubelet and the OOM killer go by). cgroup v2 (memory.max, memory.current, memory.stat)
// and v1 (memory/memory.limit_in_bytes, memory.usage_in_bytes, memory.stat) are read, in the
// process's own cgroup and each of its ancestors (kernels/core/cgroup.h: a systemd service's
// MemoryMax= is found too); a limit of "max" or of 2^60 bytes or more is no limit. -1 when nothing
// can be read. `root` prefixes every path (tests give a directory laid out as /proc and
// /sys/fs/cgroup are).
int64_t available_memory_bytes(const std::string& root = "");

// What available_memory_bytes reads, as an error that quotes its figure says it.
inline constexpr char kAvailableMemorySource[] =
    "the host's MemAvailable, or a container's memory limit less its use";

// Host memory promised to allocations under way. An allocation that zero-fills what it takes (an
// upload's weight buffer, a CPU kernel's packed copy of the weights) meets the OOM killer rather
// than bad_alloc when the memory runs out, so it is checked against the memory available first.
// Two that start together would each see the same free memory: each reserves its bytes here
// instead, against the memory available less what the others under way hold, and holds them until
// its pages are taken (the available figure counts them then). Thread-safe.
class HostMemoryLedger {
 public:
  // `available`: the memory left in bytes, negative where unknown (nothing is then refused).
  explicit HostMemoryLedger(std::function<int64_t()> available =
                                [] { return available_memory_bytes(); })
      : available_(std::move(available)) {}

  // Bytes held; given back when destroyed.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& o) noexcept : ledger_(o.ledger_), bytes_(o.bytes_) { o.ledger_ = nullptr; }
    Hold& operator=(Hold&& o) noexcept;
    ~Hold() { reset(); }
    void reset();

   private:
    friend class HostMemoryLedger;
    HostMemoryLedger* ledger_ = nullptr;
    int64_t bytes_ = 0;
  };

  // Holds `bytes` where they fit in the memory available less what is held; otherwise
  // RESOURCE_EXHAUSTED "only N are available[ beside other allocations under way] (<source>)",
  // for the caller to prefix with what needed them.
  absl::StatusOr<Hold> reserve(int64_t bytes);
  // What is held now.
  int64_t held() const;

 private:
  const std::function<int64_t()> available_;
  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace qlinear
