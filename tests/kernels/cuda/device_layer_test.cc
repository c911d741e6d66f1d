// The CUDA kernels prepared for one layer share one device copy of its weights
// (shared_device_layer): device memory grows by the weights once, not once per kernel, the copy
// is freed with its last kernel, another layer gets its own, and each kernel still computes the
// reference's y from the shared copy.
#include "kernels/cuda/device_layer.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cutlass_sm90_gemm.h"
#include "kernels/cuda/gemv_s8.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace qlinear::gpu::testing {
namespace {

int64_t free_device_bytes() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return static_cast<int64_t>(free);
}

TEST(SharedDeviceLayer, OneCopyPerLayerWhateverTheKernels) {
  QLINEAR_REQUIRE_GPU();
  SCOPED_TRACE(seed_note());
  SplitMix64 rng = test_rng();
  // 256 MiB of weights: far above what scratch, streams and handles take, so the free-memory
  // deltas below tell one copy from three.
  const int64_t n = 16384, k = 16384, w_bytes = n * k;
  const std::shared_ptr<const LayerWeights> w =
      make_layer(rng, Scheme::kDynamicSymmetric, n, k, true);
  ASSERT_NE(w, nullptr);
  std::vector<std::unique_ptr<Kernel>> kernels;
  kernels.push_back(make_gemv_s8_kernel());
  kernels.push_back(make_cutlass_sm90_kernel());
  kernels.push_back(make_cublaslt_kernel());

  const int64_t before = free_device_bytes();
  std::vector<Prepared> prepared;
  int64_t reported = 0;
  for (const auto& kern : kernels) {
    if (!kern->is_supported(host_info()).ok()) continue;
    prepared.push_back(prepare(*kern, w));
    ASSERT_NE(prepared.back().kernel, nullptr) << kern->name();
    reported += prepared.back().owner->extra_bytes();
  }
  ASSERT_GE(prepared.size(), 2u) << "needs two CUDA kernels that run here";
  const int64_t used = before - free_device_bytes();
  EXPECT_GE(used, w_bytes);
  EXPECT_LT(used, w_bytes + w_bytes / 2) << prepared.size() << " kernels hold " << used
                                         << " bytes for " << w_bytes << " bytes of weights";
  // The layer's memory, as the kernels report it, counts the shared copy once.
  EXPECT_GE(reported, w_bytes);
  EXPECT_LT(reported, w_bytes + w_bytes / 8);

  // Every kernel computes the reference's y from the shared copy.
  for (const Prepared& p : prepared) {
    EXPECT_TRUE(check_call(p, make_x(rng, 1, k, DType::kBF16), DType::kBF16, 1, DType::kBF16));
  }

  // Equal weights in another LayerWeights are another layer: their own copy.
  const auto w2 = std::make_shared<const LayerWeights>(*w);
  const int64_t before2 = free_device_bytes();
  Prepared other = prepare(*kernels[1], w2);
  if (other.kernel != nullptr) {
    EXPECT_GE(before2 - free_device_bytes(), w_bytes);
  }
  other = Prepared();

  // The copy goes with its last kernel.
  prepared.pop_back();
  EXPECT_LT(before - free_device_bytes(), w_bytes + w_bytes / 2);  // still held
  prepared.clear();
  EXPECT_LT(before - free_device_bytes(), w_bytes / 2);
}

}  // namespace
}  // namespace qlinear::gpu::testing
