// Which cgroup directories hold this process's limits (kernels/core/cgroup.h), against fake /proc
// trees: a container's own namespace, a systemd service seeing the whole tree (v2), and v1
// controllers, mounted by their name or by their hierarchy's.
#include "kernels/core/cgroup.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace qlinear {
namespace {

class CgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/cgroup_test." + std::to_string(getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/proc/self");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void proc_self_cgroup(const std::string& text) {
    std::ofstream(root_ + "/proc/self/cgroup") << text;
  }
  // `rel` paths under root_/sys/fs/cgroup.
  std::vector<std::string> under(const std::vector<std::string>& rel) const {
    std::vector<std::string> out;
    for (const std::string& r : rel) out.push_back(root_ + "/sys/fs/cgroup" + r);
    return out;
  }
  std::string root_;
};

TEST_F(CgroupTest, WithoutProcSelfCgroupOnlyTheMountsRoot) {
  EXPECT_EQ(cgroup_v2_dirs(root_), under({""}));
  EXPECT_EQ(cgroup_v1_dirs("memory", root_), under({"/memory"}));
}

TEST_F(CgroupTest, AContainersOwnNamespaceIsTheMountsRoot) {
  proc_self_cgroup("0::/\n");
  EXPECT_EQ(cgroup_v2_dirs(root_), under({""}));
}

TEST_F(CgroupTest, AServiceSeesItsCgroupAndEachAncestor) {
  proc_self_cgroup("0::/system.slice/qlinear.service\n");
  EXPECT_EQ(cgroup_v2_dirs(root_), under({"/system.slice/qlinear.service", "/system.slice", ""}));
  // No v1 hierarchy listed: the v1 mount's root alone.
  EXPECT_EQ(cgroup_v1_dirs("memory", root_), under({"/memory"}));
}

TEST_F(CgroupTest, V1ControllersByTheirHierarchy) {
  proc_self_cgroup(
      "12:pids:/user.slice\n"
      "9:memory:/docker/abc\n"
      "4:cpu,cpuacct:/kubepods/pod1/c:2\n"
      "1:name=systemd:/init.scope\n"
      "0::/ignored\n");
  EXPECT_EQ(cgroup_v1_dirs("memory", root_),
            under({"/memory/docker/abc", "/memory/docker", "/memory"}));
  EXPECT_EQ(cgroup_v1_dirs("cpu", root_, "cpu,cpuacct"),
            under({"/cpu,cpuacct/kubepods/pod1/c:2", "/cpu,cpuacct/kubepods/pod1",
                   "/cpu,cpuacct/kubepods", "/cpu,cpuacct"}));
  EXPECT_EQ(cgroup_v1_dirs("cpuacct", root_).front(),
            root_ + "/sys/fs/cgroup/cpuacct/kubepods/pod1/c:2");
  EXPECT_EQ(cgroup_v2_dirs(root_), under({"/ignored", ""}));
}

TEST_F(CgroupTest, APathThatClimbsOrIsNotAbsoluteIsNotFollowed) {
  proc_self_cgroup("0::/a/../../etc\n");
  EXPECT_EQ(cgroup_v2_dirs(root_), under({""}));
  proc_self_cgroup("0::relative\n");
  EXPECT_EQ(cgroup_v2_dirs(root_), under({""}));
}

}  // namespace
}  // namespace qlinear
