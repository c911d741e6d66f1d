#include "kernels/cuda/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_host_call.h"
#include "kernels/cuda/epilogue_s32.h"
#include "kernels/cuda/quantize_s8.h"

namespace qlinear::gpu {
namespace {

static_assert(static_cast<int>(DType::kF32) == static_cast<int>(ElemType::kF32));
static_assert(static_cast<int>(DType::kF16) == static_cast<int>(ElemType::kF16));
static_assert(static_cast<int>(DType::kBF16) == static_cast<int>(ElemType::kBF16));
static_assert(static_cast<int>(Scheme::kDynamicSymmetric) ==
              static_cast<int>(QuantScheme::kDynamicSymmetric));
static_assert(static_cast<int>(Scheme::kStaticSymmetric) ==
              static_cast<int>(QuantScheme::kStaticSymmetric));
static_assert(static_cast<int>(Scheme::kDynamicAsymmetric) ==
              static_cast<int>(QuantScheme::kDynamicAsymmetric));
static_assert(static_cast<int>(Scheme::kStaticAsymmetric) ==
              static_cast<int>(QuantScheme::kStaticAsymmetric));

// cuBLASLt workspace per stream context. 32 MiB is what NVIDIA recommends for Hopper; it lets the
// heuristic pick split-K and stream-K algorithms for small M, which need it.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// The M values at which cuBLASLt's heuristic is asked at load, and the rows each answer serves
// (a request uses the first range whose m_max >= M). The ranges are the server's M buckets; the
// query point is the top of each range, the size that costs most within it.
struct AlgoRange {
  int64_t m_max;
  int64_t m_query;
};
constexpr AlgoRange kAlgoRanges[] = {
    {1, 1},        // decode: a GEMV; cuBLASLt picks a split-K/stream-K weight-streaming algorithm
    {16, 16},      // small batches: still weight-bound
    {64, 64},      //
    {256, 256},    // the crossover from weight-bound to compute-bound
    {1024, 1024},  //
    {std::numeric_limits<int64_t>::max(), 4096},  // prefill: compute-bound, large tiles
};
constexpr int kNumAlgoRanges = sizeof(kAlgoRanges) / sizeof(kAlgoRanges[0]);

int algo_range_index(int64_t m) {
  for (int i = 0; i < kNumAlgoRanges; ++i) {
    if (m <= kAlgoRanges[i].m_max) return i;
  }
  return kNumAlgoRanges - 1;
}

// Where run_device keeps its intermediates inside the caller's scratch (each 256-byte aligned).
struct ScratchLayout {
  size_t xq = 0, acc = 0, sa = 0, azp = 0, workspace = 0, total = 0;
  ScratchLayout(int64_t m, int64_t n, int64_t k) {
    size_t off = 0;
    auto take = [&off](size_t bytes) {
      const size_t at = off;
      off += align_up(bytes);
      return at;
    };
    xq = take(static_cast<size_t>(m * k));
    acc = take(static_cast<size_t>(m * n) * 4);
    sa = take(static_cast<size_t>(m) * 4);
    azp = take(static_cast<size_t>(m) * 4);
    workspace = take(kWorkspaceBytes);
    total = off;
  }
};

class CublasLtPrepared final : public HostCallPreparedKernel {
 public:
  static absl::StatusOr<std::unique_ptr<CublasLtPrepared>> create(const LayerWeights& weights);
  ~CublasLtPrepared() override;

  size_t device_scratch_bytes(int64_t m) const override {
    return ScratchLayout(m, weights_.config.n, weights_.config.k).total;
  }

 private:
  explicit CublasLtPrepared(const LayerWeights& weights) : HostCallPreparedKernel(weights) {}
  absl::Status init();
  absl::Status matmul(const int8_t* xq, int64_t m, int32_t* acc, void* workspace,
                      cudaStream_t stream) const;
  // Quantize, cuBLASLt GEMM, epilogue kernel; a debug call also copies xq and acc out of the
  // scratch.
  absl::Status enqueue(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                       const StageEvents* events, const DeviceDebugOutputs* debug) const override;
  // Only the quantize kernel reads x.
  bool x_read_once(const RunArgs&) const override { return true; }
  // The epilogue kernel writes y once; the quantize kernel mirrors sa and azp.
  bool outputs_direct(const RunArgs&) const override { return true; }

  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t w_layout_ = nullptr;
  struct Algo {
    bool valid = false;
    cublasLtMatmulAlgo_t algo{};
  };
  Algo algos_[kNumAlgoRanges];
};

absl::StatusOr<std::unique_ptr<CublasLtPrepared>> CublasLtPrepared::create(
    const LayerWeights& weights) {
  std::unique_ptr<CublasLtPrepared> p(new CublasLtPrepared(weights));
  RETURN_IF_ERROR(p->init());  // on failure the destructor releases what init made
  // cuBLASLt also sets up on its first call, which on the H200 made a layer's first request about
  // 1 ms slower.
  RETURN_IF_ERROR(p->warm_up());
  return p;
}

absl::Status CublasLtPrepared::init() {
  const LayerConfig& c = weights_.config;
  RETURN_IF_ERROR(attach());

  RETURN_IF_CUBLAS_ERROR(cublasLtCreate(&handle_));
  RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  // W [N, K] row-major is a K x N column-major matrix with leading dimension K.
  RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutCreate(&w_layout_, CUDA_R_8I, c.k, c.n, c.k));

  cublasLtMatmulPreference_t pref = nullptr;
  RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (int i = 0; i < kNumAlgoRanges && st == CUBLAS_STATUS_SUCCESS; ++i) {
    const int64_t m = kAlgoRanges[i].m_query;
    cublasLtMatrixLayoutOpaque_t x_layout, acc_layout;
    st = cublasLtMatrixLayoutInit(&x_layout, CUDA_R_8I, c.k, m, c.k);
    if (st != CUBLAS_STATUS_SUCCESS) break;
    st = cublasLtMatrixLayoutInit(&acc_layout, CUDA_R_32I, c.n, m, c.n);
    if (st != CUBLAS_STATUS_SUCCESS) break;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        handle_, desc_, w_layout_, &x_layout, &acc_layout, &acc_layout, pref, 1, &result, &found);
    // No algorithm for this M is not fatal: the call then lets cuBLASLt choose (algo = null).
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      algos_[i].valid = true;
      algos_[i].algo = result.algo;
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  RETURN_IF_CUBLAS_ERROR(st);
  return absl::OkStatus();
}

CublasLtPrepared::~CublasLtPrepared() {
  if (w_layout_ != nullptr) cublasLtMatrixLayoutDestroy(w_layout_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

absl::Status CublasLtPrepared::matmul(const int8_t* xq, int64_t m, int32_t* acc, void* workspace,
                                      cudaStream_t stream) const {
  const LayerConfig& c = weights_.config;
  // Per-call layouts live on the stack (cublasLtMatrixLayoutInit): no allocation per request.
  cublasLtMatrixLayoutOpaque_t x_layout, acc_layout;
  RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutInit(&x_layout, CUDA_R_8I, c.k, m, c.k));
  RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutInit(&acc_layout, CUDA_R_32I, c.n, m, c.n));
  const int32_t alpha = 1, beta = 0;
  const Algo& a = algos_[algo_range_index(m)];
  cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (a.valid) {
    st = cublasLtMatmul(handle_, desc_, &alpha, dev_->w.get(), w_layout_, xq, &x_layout, &beta, acc,
                        &acc_layout, acc, &acc_layout, &a.algo, workspace, kWorkspaceBytes, stream);
  }
  // The range's algorithm was chosen at another M; should it not fit this one, let cuBLASLt
  // choose for this call.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    st = cublasLtMatmul(handle_, desc_, &alpha, dev_->w.get(), w_layout_, xq, &x_layout, &beta, acc,
                        &acc_layout, acc, &acc_layout, nullptr, workspace, kWorkspaceBytes, stream);
  }
  RETURN_IF_CUBLAS_ERROR(st);
  return absl::OkStatus();
}

absl::Status CublasLtPrepared::enqueue(const DeviceRunArgs& args, void* scratch,
                                       cudaStream_t stream, const StageEvents* events,
                                       const DeviceDebugOutputs* debug) const {
  const LayerConfig& c = weights_.config;
  const int64_t m = args.m;
  if (m < 1) return absl::InvalidArgumentError("M must be >= 1");
  const ScratchLayout L(m, c.n, c.k);
  int8_t* xq = at<int8_t>(scratch, L.xq);
  int32_t* acc = at<int32_t>(scratch, L.acc);
  float* sa = args.sa != nullptr ? args.sa : at<float>(scratch, L.sa);
  int32_t* azp = args.azp != nullptr ? args.azp : at<int32_t>(scratch, L.azp);

  RETURN_IF_CUDA_ERROR(record_stage(events, 0, stream));
  const QuantizeParams qp = quantize_params(c);
  RETURN_IF_CUDA_ERROR(launch_quantize_s8(args.x, static_cast<ElemType>(args.x_dtype), m, c.k, qp,
                                          xq, sa, azp, stream, nullptr, 0, nullptr, true,
                                          RowParamsMirror{args.sa_host, args.azp_host}));
  RETURN_IF_CUDA_ERROR(record_stage(events, 1, stream));
  RETURN_IF_ERROR(matmul(xq, m, acc, at<void>(scratch, L.workspace), stream));
  EpilogueArgs ep;
  ep.acc = acc;
  ep.m = m;
  ep.n = c.n;
  ep.scheme = qp.scheme;
  ep.sa = sa;
  ep.azp = azp;
  ep.sb = dev_->sb.as<float>();
  ep.azp_adj = is_asymmetric(c.scheme) ? dev_->azp_adj.as<int32_t>() : nullptr;
  ep.bias = c.has_bias ? dev_->bias.as<float>() : nullptr;
  ep.y = args.y;
  ep.y_type = static_cast<ElemType>(args.y_dtype);
  RETURN_IF_CUDA_ERROR(launch_epilogue_s32(ep, stream));
  RETURN_IF_CUDA_ERROR(record_stage(events, 2, stream));
  if (debug != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(debug->xq, xq, static_cast<size_t>(m * c.k),
                                         cudaMemcpyDeviceToDevice, stream));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(debug->acc, acc, static_cast<size_t>(m * c.n) * 4,
                                         cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

class CublasLtKernel final : public Kernel {
 public:
  absl::string_view name() const override { return kCublasLtKernelName; }
  absl::Status is_supported(const HostInfo& host) const override {
    return cuda_device_usable(host);
  }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    if (config.k > kMaxK) {
      return absl::FailedPreconditionError(absl::StrCat("K=", config.k, " exceeds ", kMaxK));
    }
    if (config.k % 4 != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("K=", config.k, " is not a multiple of 4 (cuBLASLt int8 GEMM alignment)"));
    }
    if (config.n % 4 != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("N=", config.n, " is not a multiple of 4 (cuBLASLt int8 GEMM alignment)"));
    }
    if (shape.m < 1) return absl::FailedPreconditionError("M must be >= 1");
    if (shape.m > std::numeric_limits<int32_t>::max()) {
      return absl::FailedPreconditionError(
          absl::StrCat("M=", shape.m, " exceeds 2^31-1 rows (one quantization block per row)"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
    ASSIGN_OR_RETURN(std::unique_ptr<CublasLtPrepared> p, CublasLtPrepared::create(weights));
    return std::unique_ptr<PreparedKernel>(std::move(p));
  }
};

}  // namespace

std::unique_ptr<Kernel> make_cublaslt_kernel() { return std::make_unique<CublasLtKernel>(); }

}  // namespace qlinear::gpu
