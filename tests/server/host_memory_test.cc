// available_memory_bytes against fake /proc and /sys/fs/cgroup trees: the host's MemAvailable,
// capped by a cgroup v2 or v1 memory limit less the cgroup's working set.
#include "server/core/host_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace qlinear {
namespace {

namespace fs = std::filesystem;

class HostMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("qlinear_host_memory_" +
             std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  int64_t available() const { return available_memory_bytes(root_.string()); }

  fs::path root_;
};

constexpr int64_t kGiB = int64_t{1} << 30;

TEST_F(HostMemoryTest, NothingReadableIsUnknown) { EXPECT_EQ(available(), -1); }

TEST_F(HostMemoryTest, HostMemAvailableInKilobytes) {
  write("proc/meminfo",
        "MemTotal:       32000000 kB\nMemFree:         1000000 kB\n"
        "MemAvailable:   16777216 kB\nBuffers:          100 kB\n");
  EXPECT_EQ(available(), 16 * kGiB);
}

TEST_F(HostMemoryTest, CgroupV2LimitLessItsWorkingSetCapsTheHost) {
  write("proc/meminfo", "MemAvailable:   67108864 kB\n");  // 64 GiB on the node
  write("sys/fs/cgroup/memory.max", std::to_string(2 * kGiB) + "\n");
  write("sys/fs/cgroup/memory.current", std::to_string(kGiB) + "\n");
  // 256 MiB of the usage is inactive page cache, which the kernel reclaims before it kills.
  write("sys/fs/cgroup/memory.stat",
        "anon 500000000\nfile 600000000\ninactive_file " + std::to_string(kGiB / 4) + "\n");
  EXPECT_EQ(available(), 2 * kGiB - (kGiB - kGiB / 4));
}

TEST_F(HostMemoryTest, CgroupV2WithoutALimitLeavesTheHost) {
  write("proc/meminfo", "MemAvailable:   1048576 kB\n");
  write("sys/fs/cgroup/memory.max", "max\n");
  write("sys/fs/cgroup/memory.current", "12345\n");
  EXPECT_EQ(available(), kGiB);
}

TEST_F(HostMemoryTest, CgroupV1LimitAndAHugeUnsetLimit) {
  write("proc/meminfo", "MemAvailable:   67108864 kB\n");
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", std::to_string(4 * kGiB) + "\n");
  write("sys/fs/cgroup/memory/memory.usage_in_bytes", std::to_string(3 * kGiB) + "\n");
  write("sys/fs/cgroup/memory/memory.stat", "cache 100\ntotal_inactive_file 0\n");
  EXPECT_EQ(available(), kGiB);
  // v1 reports "no limit" as a number near 2^63.
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(available(), 64 * kGiB);
}

// A process that sees the whole cgroup tree (a systemd service with MemoryMax=, no cgroup
// namespace of its own): its own cgroup's limit, and a tighter one on an ancestor, apply; the
// mount's root, which holds no limit, is not all there is.
TEST_F(HostMemoryTest, AServicesOwnCgroupAndItsAncestorsLimits) {
  write("proc/meminfo", "MemAvailable:   67108864 kB\n");
  write("proc/self/cgroup", "0::/system.slice/qlinear.service\n");
  write("sys/fs/cgroup/memory.current", std::to_string(40 * kGiB) + "\n");  // the root: no max
  write("sys/fs/cgroup/system.slice/qlinear.service/memory.max", std::to_string(8 * kGiB) + "\n");
  write("sys/fs/cgroup/system.slice/qlinear.service/memory.current",
        std::to_string(5 * kGiB) + "\n");
  EXPECT_EQ(available(), 3 * kGiB);
  write("sys/fs/cgroup/system.slice/memory.max", std::to_string(12 * kGiB) + "\n");
  write("sys/fs/cgroup/system.slice/memory.current", std::to_string(11 * kGiB) + "\n");
  EXPECT_EQ(available(), kGiB);
  // cgroup v1: the memory hierarchy's path.
  write("proc/self/cgroup", "7:memory:/system.slice/qlinear.service\n");
  write("sys/fs/cgroup/memory/system.slice/qlinear.service/memory.limit_in_bytes",
        std::to_string(2 * kGiB) + "\n");
  write("sys/fs/cgroup/memory/system.slice/qlinear.service/memory.usage_in_bytes",
        std::to_string(kGiB / 2) + "\n");
  EXPECT_EQ(available(), kGiB + kGiB / 2);
}

TEST_F(HostMemoryTest, UsageAboveTheLimitLeavesNothingAndACgroupAloneIsEnough) {
  write("sys/fs/cgroup/memory.max", std::to_string(kGiB) + "\n");
  write("sys/fs/cgroup/memory.current", std::to_string(2 * kGiB) + "\n");
  EXPECT_EQ(available(), 0);  // no meminfo, no memory.stat: the limit less the usage, at least 0
}

// The ledger holds what each allocation under way reserved: a second reservation sees the memory
// less the first's, is refused naming what is left, and fits once the first is given back (a
// moved hold gives back once, a reset one at once); unknown memory refuses nothing.
TEST(HostMemoryLedgerTest, ReservationsUnderWayCountAsTaken) {
  int64_t avail = 100;
  HostMemoryLedger ledger([&avail] { return avail; });
  absl::StatusOr<HostMemoryLedger::Hold> a = ledger.reserve(60);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(ledger.held(), 60);
  absl::StatusOr<HostMemoryLedger::Hold> b = ledger.reserve(60);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.status().message(),
            "only 40 are available beside other allocations under way (the host's MemAvailable, "
            "or a container's memory limit less its use)");
  {
    HostMemoryLedger::Hold moved = *std::move(a);
    EXPECT_EQ(ledger.held(), 60);
  }
  EXPECT_EQ(ledger.held(), 0);
  b = ledger.reserve(60);
  ASSERT_TRUE(b.ok()) << b.status();
  b->reset();
  EXPECT_EQ(ledger.held(), 0);
  absl::StatusOr<HostMemoryLedger::Hold> c = ledger.reserve(101);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "only 100 are available (the host's MemAvailable, or a container's memory limit less "
            "its use)");
  avail = -1;
  c = ledger.reserve(int64_t{1} << 50);
  EXPECT_TRUE(c.ok()) << c.status();
}

}  // namespace
}  // namespace qlinear
