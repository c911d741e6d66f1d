// The process's device fault: the first report is kept, listeners hear of it once (at once where
// one is already recorded), and a removed listener is not called.
#include "kernels/core/device_fault.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qlinear {
namespace {

class DeviceFaultTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_device_fault_for_testing(); }
  void TearDown() override { clear_device_fault_for_testing(); }
};

TEST_F(DeviceFaultTest, KeepsTheFirstReportAndTellsEachListenerOnce) {
  EXPECT_FALSE(device_fault().has_value());
  std::vector<std::string> heard_a, heard_b, heard_removed;
  const int a = add_device_fault_listener([&](const std::string& w) { heard_a.push_back(w); });
  const int b = add_device_fault_listener([&](const std::string& w) { heard_b.push_back(w); });
  const int removed =
      add_device_fault_listener([&](const std::string& w) { heard_removed.push_back(w); });
  EXPECT_NE(a, b);
  remove_device_fault_listener(removed);

  report_device_fault("cuda:0: cudaErrorIllegalAddress");
  report_device_fault("a later fault");
  ASSERT_TRUE(device_fault().has_value());
  EXPECT_EQ(*device_fault(), "cuda:0: cudaErrorIllegalAddress");
  EXPECT_EQ(heard_a, std::vector<std::string>{"cuda:0: cudaErrorIllegalAddress"});
  EXPECT_EQ(heard_b, heard_a);
  EXPECT_TRUE(heard_removed.empty());

  // A listener added after the fault hears of it at once.
  std::vector<std::string> late;
  const int c = add_device_fault_listener([&](const std::string& w) { late.push_back(w); });
  EXPECT_EQ(late, heard_a);
  for (int id : {a, b, c}) remove_device_fault_listener(id);
}

}  // namespace
}  // namespace qlinear
