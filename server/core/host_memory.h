// How much memory a layer upload may still take, read from the kernel's own accounting.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace qlinear
