// Where this process's cgroup keeps its limits (memory, CPU quota), for cgroup v2 and v1.
//
// A container with a cgroup namespace of its own (Docker and Kubernetes on cgroup v2) sees its
// cgroup at the mount's root, /sys/fs/cgroup. A process without one (a systemd service with
// MemoryMax= or CPUQuota=, a container sharing the host's cgroup namespace) sees the whole tree,
// and its cgroup is the path /proc/self/cgroup names: its limits are there, or on an ancestor.
#pragma once

#include <string>
#include <vector>

namespace qlinear {

// The directories whose limits apply to this process, innermost first: its cgroup as
// /proc/self/cgroup names it (under /sys/fs/cgroup for v2, under /sys/fs/cgroup/<controller> for
// a v1 controller, "memory" or "cpu", or under /sys/fs/cgroup/<mount> where the hierarchy is
// mounted by another name, "cpu,cpuacct"), then each ancestor up to the mount's root, which is
// always last (and alone where /proc/self/cgroup cannot be read or names "/"). Directories need
// not exist: a reader takes each file it can read. `root` prefixes every path (tests give a
// directory laid out as /proc and /sys/fs/cgroup are).
std::vector<std::string> cgroup_v2_dirs(const std::string& root = "");
std::vector<std::string> cgroup_v1_dirs(const std::string& controller, const std::string& root = "",
                                        const std::string& mount = "");

}  // namespace qlinear
