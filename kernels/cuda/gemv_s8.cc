#include "kernels/cuda/gemv_s8.h"

#include <cuda_runtime_api.h>

#include <array>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_host_call.h"
#include "kernels/cuda/gemv_s8_device.h"

namespace qlinear::gpu {
namespace {

// One plan per padded token count (8, 16, 32, 64).
constexpr std::array<int, 4> kMPads = {8, 16, 32, 64};

int m_pad_index(int64_t m) {
  const int pad = gemv_m_pad(m);
  return pad == 8 ? 0 : pad == 16 ? 1 : pad == 32 ? 2 : 3;
}

class GemvS8Prepared final : public HostCallPreparedKernel {
 public:
  static absl::StatusOr<std::unique_ptr<GemvS8Prepared>> create(const LayerWeights& weights);

  // sa and azp, when the caller passes none.
  size_t device_scratch_bytes(int64_t m) const override {
    return 2 * align_up(static_cast<size_t>(m) * 4);
  }

 private:
  explicit GemvS8Prepared(const LayerWeights& weights) : HostCallPreparedKernel(weights) {}

  absl::Status tune();
  absl::Status enqueue(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                       const StageEvents* events, const DeviceDebugOutputs* debug) const override;

  struct Plan {
    bool valid = false;
    GemvS8Plan plan;
  };
  std::array<Plan, kMPads.size()> plans_;
};

absl::StatusOr<std::unique_ptr<GemvS8Prepared>> GemvS8Prepared::create(
    const LayerWeights& weights) {
  std::unique_ptr<GemvS8Prepared> p(new GemvS8Prepared(weights));
  RETURN_IF_ERROR(p->attach());
  RETURN_IF_ERROR(p->tune());
  if (p->plans_[0].valid) RETURN_IF_ERROR(p->warm_up());
  return p;
}

// Chooses each M group's launch plan at load: every split of the layer that fits is timed on the
// layer's own weights with a cold L2 (timing catches what a cost model misses: how the clusters
// land on the GPCs, how the tiles divide among them, the register pressure of each variant).
absl::Status GemvS8Prepared::tune() {
  const LayerConfig& c = weights_.config;
  constexpr int kCandidates = 64;                    // every plan (at most 4 x 8 x 2)
  constexpr size_t kFlushBytes = size_t{128} << 20;  // over twice the L2
  DeviceBuffer x, y, sa, flush;
  RETURN_IF_ERROR(x.allocate(static_cast<size_t>(kGemvMaxM * c.k) * 2, "tuning activations"));
  RETURN_IF_ERROR(y.allocate(static_cast<size_t>(kGemvMaxM * c.n) * 2, "tuning outputs"));
  RETURN_IF_ERROR(sa.allocate(kGemvMaxM * 4, "tuning scales"));
  RETURN_IF_ERROR(flush.allocate(kFlushBytes, "an L2 flush buffer for tuning"));
  cudaStream_t stream = nullptr;
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::Status status = [&]() -> absl::Status {
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(x.get(), 0, x.size(), stream));
    for (size_t i = 0; i < kMPads.size(); ++i) {
      if (!gemv_s8_fits(c.k, kMPads[i])) continue;
      GemvS8Args a;
      a.x = x.get();
      a.m = kMPads[i];
      a.n = c.n;
      a.k = c.k;
      a.quant = quantize_params(c);
      a.w = dev_->w.as<int8_t>();
      a.sb = dev_->sb.as<float>();
      a.azp_adj = is_asymmetric(c.scheme) ? dev_->azp_adj.as<int32_t>() : nullptr;
      a.bias = c.has_bias ? dev_->bias.as<float>() : nullptr;
      a.y = y.get();
      a.sa = sa.as<float>();
      const cudaError_t e = tune_gemv_s8(a, kMPads[i], flush.get(), flush.size(), kCandidates,
                                         stream, &plans_[i].plan);
      if (e == cudaErrorNotSupported) continue;
      RETURN_IF_CUDA_ERROR(e);
      plans_[i].valid = true;
    }
    return absl::OkStatus();
  }();
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  cudaGetLastError();  // failures of the two lines above have no one to report to
  return status;
}

absl::Status GemvS8Prepared::enqueue(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                                     const StageEvents* events,
                                     const DeviceDebugOutputs* debug) const {
  const LayerConfig& c = weights_.config;
  if (args.m < 1 || args.m > kGemvMaxM) {
    return absl::FailedPreconditionError(
        absl::StrCat("M=", args.m, " is outside 1..", kGemvMaxM, " (cuda.gemv_s8)"));
  }
  const Plan& plan = plans_[m_pad_index(args.m)];
  if (!plan.valid) {
    return absl::FailedPreconditionError(
        absl::StrCat("M=", args.m, " with K=", c.k, " does not fit cuda.gemv_s8's shared memory"));
  }
  GemvS8Args a;
  a.x = args.x;
  a.x_type = static_cast<ElemType>(args.x_dtype);
  a.m = args.m;
  a.n = c.n;
  a.k = c.k;
  a.quant = quantize_params(c);
  a.w = dev_->w.as<int8_t>();
  a.sb = dev_->sb.as<float>();
  a.azp_adj = is_asymmetric(c.scheme) ? dev_->azp_adj.as<int32_t>() : nullptr;
  a.bias = c.has_bias ? dev_->bias.as<float>() : nullptr;
  a.y = args.y;
  a.y_type = static_cast<ElemType>(args.y_dtype);
  char* s = static_cast<char*>(scratch);
  a.sa = args.sa != nullptr ? args.sa : reinterpret_cast<float*>(s);
  a.azp = args.azp != nullptr
              ? args.azp
              : reinterpret_cast<int32_t*>(s + align_up(static_cast<size_t>(args.m) * 4));
  if (debug != nullptr) {
    a.xq = debug->xq;
    a.acc = debug->acc;
  }
  // Quantization happens inside the launch: the quantize stage takes no time of its own.
  RETURN_IF_CUDA_ERROR(record_stage(events, 0, stream));
  RETURN_IF_CUDA_ERROR(record_stage(events, 1, stream));
  RETURN_IF_CUDA_ERROR(launch_gemv_s8(a, plan.plan, stream));
  RETURN_IF_CUDA_ERROR(record_stage(events, 2, stream));
  return absl::OkStatus();
}

class GemvS8Kernel final : public Kernel {
 public:
  absl::string_view name() const override { return kGemvS8KernelName; }
  absl::Status is_supported(const HostInfo& host) const override {
    RETURN_IF_ERROR(cuda_device_usable(host));
    return gemv_s8_device_gate(host.gpus[0]);
  }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    RETURN_IF_ERROR(check_rows_of_16_bytes(config, "16-byte weight loads", "16-row mma tiles"));
    if (shape.m < 1 || shape.m > kGemvMaxM) {
      return absl::FailedPreconditionError(
          absl::StrCat("M=", shape.m, " is outside 1..", kGemvMaxM, " (small-M kernel)"));
    }
    if (!gemv_s8_fits(config.k, gemv_m_pad(shape.m))) {
      return absl::FailedPreconditionError(
          absl::StrCat("M=", shape.m, " rows of K=", config.k,
                       " quantized activations do not fit in shared memory"));
    }
    return absl::OkStatus();
  }
  // Decode (M = 1) only. Measured on the H200 (bench/gpu/gpu_bench.cc, weights rotated past L2,
  // bf16 in/out, bias; gemv plans tuned at load as prepare does), op time in us, gemv vs
  // cuda.cutlass_sm90 vs cuda.cublaslt:
  //   (N, K)          M=1: gemv   cutlass  cublaslt    M=16: gemv   cutlass  cublaslt
  //   6144 x 4096          20.5    17.0     19.1              30.0    16.3     18.3
  //   4096 x 4096          19.7    15.8     18.8              29.0    13.9     16.5
  //   28672 x 4096         45.2    38.2     40.7              67.5    37.5     42.3
  //   4096 x 14336         32.2    35.8     39.6              51.5    28.5     28.9
  //   8192 x 8192          39.5    32.2     29.5              59.0    29.1     32.4
  //   57344 x 8192        134.7   120.3    167.3             180.1   123.0    169.2
  //   8192 x 28672         79.1    82.2     75.1             120.2    80.3     74.2
  // At M = 1 it won on the long-K 4096 x 14336 and lost elsewhere; at M = 4-16 the per-token work
  // (quantization in every block, one mma per 8 tokens) outgrows the streaming and it loses
  // everywhere, so it stays out of the other buckets. cuda.stream_s8 has since beaten it at M = 1
  // on every shape (25.9 vs 32.3 us on 4096 x 14336), so the server does not register it
  // (kernels/cuda/cuda_kernels.cc).
  MRange preferred_m() const override { return MRange{1, 1}; }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
    ASSIGN_OR_RETURN(std::unique_ptr<GemvS8Prepared> p, GemvS8Prepared::create(weights));
    return std::unique_ptr<PreparedKernel>(std::move(p));
  }
};

}  // namespace

absl::Status gemv_s8_device_gate(const GpuInfo& g) {
  if (g.cc_major < 9) {
    return absl::FailedPreconditionError(
        absl::StrCat("needs compute capability 9.0 or newer (thread block clusters), device is sm_",
                     g.cc_major, g.cc_minor));
  }
  return absl::OkStatus();
}

std::unique_ptr<Kernel> make_gemv_s8_kernel() { return std::make_unique<GemvS8Kernel>(); }

}  // namespace qlinear::gpu
