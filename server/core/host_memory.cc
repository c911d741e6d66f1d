#include "server/core/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/core/cgroup.h"

namespace qlinear {
namespace {

constexpr int64_t kNoLimit = int64_t{1} << 60;

// The first whitespace-separated number of a file (a cgroup limit or usage), or -1 where the
// file is missing, says "max" or holds something else.
int64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word)) return -1;
  int64_t v = 0;
  std::istringstream parse(word);
  if (!(parse >> v) || !parse.eof() || v < 0) return -1;
  return v;
}

// The value of `key` in a file of "key value" lines (memory.stat, /proc/meminfo), times `unit`;
// -1 when absent.
int64_t read_keyed(const std::string& path, const std::string& key, int64_t unit) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string k;
    int64_t v = 0;
    if (fields >> k >> v && k == key && v >= 0) return v * unit;
  }
  return -1;
}

// What the cgroup at `dir` has left under its limit, or -1 without a limit.
int64_t cgroup_headroom(const std::string& limit_file, const std::string& usage_file,
                        const std::string& stat_file, const std::string& inactive_key) {
  const int64_t limit = read_number(limit_file);
  if (limit < 0 || limit >= kNoLimit) return -1;
  const int64_t usage = read_number(usage_file);
  if (usage < 0) return -1;
  const int64_t inactive = std::max<int64_t>(0, read_keyed(stat_file, inactive_key, 1));
  const int64_t working_set = std::max<int64_t>(0, usage - inactive);
  return std::max<int64_t>(0, limit - working_set);
}

}  // namespace

int64_t available_memory_bytes(const std::string& root) {
  int64_t avail = read_keyed(root + "/proc/meminfo", "MemAvailable:", 1024);
  auto cap = [&avail](int64_t headroom) {
    if (headroom >= 0) avail = avail < 0 ? headroom : std::min(avail, headroom);
  };
  // The process's cgroup and each ancestor: a limit on any of them applies.
  for (const std::string& d : cgroup_v2_dirs(root)) {
    cap(cgroup_headroom(d + "/memory.max", d + "/memory.current", d + "/memory.stat",
                        "inactive_file"));
  }
  for (const std::string& d : cgroup_v1_dirs("memory", root)) {
    cap(cgroup_headroom(d + "/memory.limit_in_bytes", d + "/memory.usage_in_bytes",
                        d + "/memory.stat", "total_inactive_file"));
  }
  return avail;
}

HostMemoryLedger::Hold& HostMemoryLedger::Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    reset();
    ledger_ = o.ledger_;
    bytes_ = o.bytes_;
    o.ledger_ = nullptr;
  }
  return *this;
}

void HostMemoryLedger::Hold::reset() {
  if (ledger_ == nullptr) return;
  absl::MutexLock lock(&ledger_->mu_);
  ledger_->held_ -= bytes_;
  ledger_ = nullptr;
}

absl::StatusOr<HostMemoryLedger::Hold> HostMemoryLedger::reserve(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  // (Read under the lock: an allocation whose hold ends meanwhile has its pages counted in the
  // figure read after it.)
  const int64_t avail = available_();
  if (avail >= 0 && bytes > avail - held_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "only ", std::max<int64_t>(0, avail - held_), " are available",
        held_ > 0 ? " beside other allocations under way" : "", " (", kAvailableMemorySource, ")"));
  }
  held_ += bytes;
  Hold h;
  h.ledger_ = this;
  h.bytes_ = bytes;
  return h;
}

int64_t HostMemoryLedger::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

}  // namespace qlinear
