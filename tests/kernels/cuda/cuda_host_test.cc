// Device detection and the compiled-architecture gate (SPEC section 6: is_supported honours the
// compute capability and what was compiled in). Runs with or without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/core/host_info.h"
#include "kernels/cuda/cuda_context.h"

namespace qlinear::gpu {
namespace {

// What the load-time tunes keep of their timings (run anywhere).
TEST(LoadTiming, MedianIsTheMiddleSampleAndTheUpperOfTwo) {
  std::vector<double> odd = {9, 1, 5, 7, 3};
  EXPECT_EQ(median_of(odd), 5);
  std::vector<double> even = {4, 1, 3, 2};
  EXPECT_EQ(median_of(even), 3);
  std::vector<double> one = {2.5};
  EXPECT_EQ(median_of(one), 2.5);
}

TEST(LoadTiming, LowestMedianPicksTheFirstOfEqualsAndIgnoresOutliers) {
  // The second candidate's fastest sample is the lowest of all, but its median is not.
  std::vector<std::vector<double>> samples = {{10, 11, 12}, {1, 20, 21}, {9, 10, 30}};
  EXPECT_EQ(lowest_median(samples), 2u);
  std::vector<std::vector<double>> ties = {{5, 6, 7}, {6, 6, 6}, {4}};
  EXPECT_EQ(lowest_median(ties), 2u);
  std::vector<std::vector<double>> equal = {{6, 6}, {6, 6}};
  EXPECT_EQ(lowest_median(equal), 0u);
}

TEST(CudaArch, MachineCodeRunsOnItsMajorVersionAndArchSpecificOnlyOnItsOwn) {
  EXPECT_TRUE(check_cuda_arch("90a", 9, 0).ok());
  EXPECT_EQ(check_cuda_arch("90a", 8, 0).message(), "compiled for sm_90a, device is sm_80");
  EXPECT_EQ(check_cuda_arch("90a", 10, 0).message(), "compiled for sm_90a, device is sm_100");
  EXPECT_EQ(check_cuda_arch("90a-real", 9, 1).message(), "compiled for sm_90a, device is sm_91");
  EXPECT_TRUE(check_cuda_arch("80-real", 8, 6).ok());
  EXPECT_TRUE(check_cuda_arch("80-real", 8, 9).ok());
  EXPECT_FALSE(check_cuda_arch("80-real", 9, 0).ok());
  EXPECT_FALSE(check_cuda_arch("89-real", 8, 0).ok());
}

TEST(CudaArch, PtxIsCompiledByTheDriverForNewerDevices) {
  EXPECT_TRUE(check_cuda_arch("80", 9, 0).ok());  // "80" = sm_80 machine code + compute_80 PTX
  EXPECT_TRUE(check_cuda_arch("80-virtual", 12, 0).ok());
  EXPECT_FALSE(check_cuda_arch("90-virtual", 8, 9).ok());
  EXPECT_EQ(check_cuda_arch("80-virtual", 7, 5).message(),
            "compiled for compute_80, device is sm_75");
}

TEST(CudaArch, ListsTakeAnyMatchingEntry) {
  EXPECT_TRUE(check_cuda_arch("80;89;90a", 8, 9).ok());
  EXPECT_TRUE(check_cuda_arch("80;89;90a", 9, 0).ok());
  EXPECT_TRUE(check_cuda_arch("80-real;89-real;90a-real", 8, 6).ok());
  EXPECT_EQ(check_cuda_arch("89-real;90a-real", 8, 0).message(),
            "compiled for sm_89, sm_90a, device is sm_80");
  EXPECT_FALSE(check_cuda_arch("", 9, 0).ok());
}

TEST(CudaArch, ThisBuildRecordsItsArchitectures) { EXPECT_FALSE(compiled_cuda_archs().empty()); }

// With no driver or no device, detection records why and does not crash; with a GPU it names it.
TEST(CudaHost, DetectionNamesTheGpuOrTheReason) {
  const HostInfo h = detect_host_info();
  EXPECT_TRUE(h.cuda_compiled);
  if (h.gpus.empty()) {
    EXPECT_FALSE(h.cuda_error.empty());
    const absl::Status st = cuda_device_usable(h);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(st.message(), "no CUDA device (" + h.cuda_error + ")");
    std::printf("no GPU: %s\n", h.gpu_description().c_str());
  } else {
    EXPECT_FALSE(h.gpus[0].name.empty());
    EXPECT_GT(h.gpus[0].sm_count, 0);
    EXPECT_GT(h.gpus[0].memory_bytes, 0);
    EXPECT_GT(h.gpus[0].cc_major, 0);
    std::printf("GPU: %s\n", h.gpu_description().c_str());
  }
}

}  // namespace
}  // namespace qlinear::gpu
