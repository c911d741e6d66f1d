#include "kernels/core/cgroup.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace qlinear {
namespace {

// Whether a v1 hierarchy's controller list ("cpu,cpuacct") holds `controller`.
bool lists(absl::string_view list, absl::string_view controller) {
  for (absl::string_view c : absl::StrSplit(list, ',')) {
    if (c == controller) return true;
  }
  return false;
}

// The cgroup path /proc/self/cgroup gives for v2 (hierarchy "0", no controllers; `controller`
// empty) or for the v1 hierarchy holding `controller`; "/" where there is none.
std::string cgroup_path(const std::string& root, absl::string_view controller) {
  std::ifstream in(root + "/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "hierarchy-ID:controller-list:path" (the path may itself hold colons).
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3 || f[2].empty() || f[2][0] != '/') continue;
    const bool match = controller.empty() ? f[0] == "0" && f[1].empty() : lists(f[1], controller);
    if (match) return std::string(f[2]);
  }
  return "/";
}

// `mount` + `path` and each ancestor up to `mount`, innermost first. A path that climbs ("..")
// is not followed: only the mount is read then.
std::vector<std::string> dirs_from(const std::string& mount, const std::string& path) {
  std::vector<std::string> dirs;
  std::vector<absl::string_view> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  for (absl::string_view p : parts) {
    if (p == "." || p == "..") parts.clear();
  }
  for (size_t n = parts.size(); n > 0; --n) {
    std::string d = mount;
    for (size_t i = 0; i < n; ++i) absl::StrAppend(&d, "/", parts[i]);
    dirs.push_back(std::move(d));
  }
  dirs.push_back(mount);
  return dirs;
}

}  // namespace

std::vector<std::string> cgroup_v2_dirs(const std::string& root) {
  return dirs_from(root + "/sys/fs/cgroup", cgroup_path(root, ""));
}

std::vector<std::string> cgroup_v1_dirs(const std::string& controller, const std::string& root,
                                        const std::string& mount) {
  return dirs_from(root + "/sys/fs/cgroup/" + (mount.empty() ? controller : mount),
                   cgroup_path(root, controller));
}

}  // namespace qlinear
