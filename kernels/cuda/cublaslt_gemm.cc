#include "kernels/cuda/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cuda/cuda_context.h"
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

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

class CublasLtPrepared final : public CudaPreparedKernel {
 public:
  static absl::StatusOr<std::unique_ptr<CublasLtPrepared>> create(const LayerWeights& weights);
  ~CublasLtPrepared() override;

  absl::Status run(const RunArgs& args, RunTimings* timings) const override {
    return run_host(args, timings, nullptr);
  }
  absl::Status run_debug(const RunArgs& args, DebugOutputs* debug) const override {
    return run_host(args, nullptr, debug);
  }
  size_t device_scratch_bytes(int64_t m) const override {
    return ScratchLayout(m, weights_.config.n, weights_.config.k).total;
  }
  absl::Status run_device(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                          const StageEvents* events) const override;
  int64_t extra_bytes() const override {
    return static_cast<int64_t>(w_.size() + sb_.size() + bias_.size() + azp_adj_.size());
  }
  std::string device() const override { return "cuda:0"; }

 private:
  explicit CublasLtPrepared(const LayerWeights& weights) : weights_(weights) {}
  absl::Status init();
  absl::Status matmul(const int8_t* xq, int64_t m, int32_t* acc, void* workspace,
                      cudaStream_t stream) const;
  absl::Status run_host(const RunArgs& args, RunTimings* timings, DebugOutputs* debug) const;
  absl::Status enqueue_host(StreamContext* ctx, const RunArgs& args, DebugOutputs* debug,
                            int64_t* bad_row) const;

  const LayerWeights& weights_;
  StreamPool* pool_ = nullptr;
  DeviceBuffer w_, sb_, bias_, azp_adj_;
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
  // One bf16 row through the whole path at load: CUDA loads kernels lazily and cuBLASLt sets up
  // on its first call, which on the H200 made a layer's first request about 1 ms slower.
  const LayerConfig& c = weights.config;
  std::vector<uint16_t> x(static_cast<size_t>(c.k), 0), y(static_cast<size_t>(c.n));
  RunArgs warm;
  warm.x = x.data();
  warm.x_dtype = DType::kBF16;
  warm.m = 1;
  warm.y = y.data();
  warm.y_dtype = DType::kBF16;
  RETURN_IF_ERROR(p->run(warm, nullptr));
  return p;
}

absl::Status CublasLtPrepared::init() {
  const LayerConfig& c = weights_.config;
  ASSIGN_OR_RETURN(pool_, StreamPool::get());
  RETURN_IF_ERROR(w_.allocate(static_cast<size_t>(c.n * c.k),
                              absl::StrCat("the layer's weights [", c.n, ", ", c.k, "] int8")));
  RETURN_IF_CUDA_ERROR(cudaMemcpy(w_.get(), weights_.w.data(), w_.size(), cudaMemcpyHostToDevice));
  RETURN_IF_ERROR(sb_.allocate(static_cast<size_t>(c.n) * 4, "the weight scales"));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpy(sb_.get(), weights_.sb.data(), sb_.size(), cudaMemcpyHostToDevice));
  if (c.has_bias) {
    RETURN_IF_ERROR(bias_.allocate(static_cast<size_t>(c.n) * 4, "the bias"));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpy(bias_.get(), weights_.bias.data(), bias_.size(), cudaMemcpyHostToDevice));
  }
  if (is_asymmetric(c.scheme)) {
    RETURN_IF_ERROR(azp_adj_.allocate(static_cast<size_t>(c.n) * 4, "the zero-point adjustment"));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(azp_adj_.get(), weights_.azp_adj.data(), azp_adj_.size(),
                                    cudaMemcpyHostToDevice));
  }
  // A cudaMemcpy from pageable memory may return before its DMA lands, and the requests'
  // non-blocking streams do not wait for the legacy stream it ran on: wait here, once.
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(cudaStreamLegacy));

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
    st = cublasLtMatmul(handle_, desc_, &alpha, w_.get(), w_layout_, xq, &x_layout, &beta, acc,
                        &acc_layout, acc, &acc_layout, &a.algo, workspace, kWorkspaceBytes, stream);
  }
  // The range's algorithm was chosen at another M; should it not fit this one, let cuBLASLt
  // choose for this call.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    st = cublasLtMatmul(handle_, desc_, &alpha, w_.get(), w_layout_, xq, &x_layout, &beta, acc,
                        &acc_layout, acc, &acc_layout, nullptr, workspace, kWorkspaceBytes, stream);
  }
  RETURN_IF_CUBLAS_ERROR(st);
  return absl::OkStatus();
}

absl::Status CublasLtPrepared::run_device(const DeviceRunArgs& args, void* scratch,
                                          cudaStream_t stream, const StageEvents* events) const {
  const LayerConfig& c = weights_.config;
  const int64_t m = args.m;
  if (m < 1) return absl::InvalidArgumentError("M must be >= 1");
  const ScratchLayout L(m, c.n, c.k);
  int8_t* xq = at<int8_t>(scratch, L.xq);
  int32_t* acc = at<int32_t>(scratch, L.acc);
  float* sa = args.sa != nullptr ? args.sa : at<float>(scratch, L.sa);
  int32_t* azp = args.azp != nullptr ? args.azp : at<int32_t>(scratch, L.azp);

  if (events != nullptr) RETURN_IF_CUDA_ERROR(cudaEventRecord(events->e[0], stream));
  QuantizeParams qp;
  qp.scheme = static_cast<QuantScheme>(c.scheme);
  qp.input_scale = c.input_scale;
  qp.input_zero_point = c.input_zero_point;
  RETURN_IF_CUDA_ERROR(launch_quantize_s8(args.x, static_cast<ElemType>(args.x_dtype), m, c.k, qp,
                                          xq, sa, azp, stream));
  if (events != nullptr) RETURN_IF_CUDA_ERROR(cudaEventRecord(events->e[1], stream));
  RETURN_IF_ERROR(matmul(xq, m, acc, at<void>(scratch, L.workspace), stream));
  EpilogueArgs ep;
  ep.acc = acc;
  ep.m = m;
  ep.n = c.n;
  ep.scheme = qp.scheme;
  ep.sa = sa;
  ep.azp = azp;
  ep.sb = sb_.as<float>();
  ep.azp_adj = is_asymmetric(c.scheme) ? azp_adj_.as<int32_t>() : nullptr;
  ep.bias = c.has_bias ? bias_.as<float>() : nullptr;
  ep.y = args.y;
  ep.y_type = static_cast<ElemType>(args.y_dtype);
  RETURN_IF_CUDA_ERROR(launch_epilogue_s32(ep, stream));
  if (events != nullptr) RETURN_IF_CUDA_ERROR(cudaEventRecord(events->e[2], stream));
  return absl::OkStatus();
}

// Sizes of one host call, and where its pieces live in the context's device and pinned buffers:
// device [x | y | sa | azp | scratch], pinned [x | y | sa | azp].
struct HostCallLayout {
  size_t x_bytes, y_bytes, row_bytes;
  size_t d_x, d_y, d_sa, d_azp, d_scratch, d_total;
  size_t h_x, h_y, h_sa, h_azp, h_total;
  HostCallLayout(const RunArgs& a, int64_t n, int64_t k, size_t scratch_bytes) {
    x_bytes = static_cast<size_t>(a.m * k) * dtype_size(a.x_dtype);
    y_bytes = static_cast<size_t>(a.m * n) * dtype_size(a.y_dtype);
    row_bytes = static_cast<size_t>(a.m) * 4;
    d_x = 0;
    d_y = d_x + align_up(x_bytes);
    d_sa = d_y + align_up(y_bytes);
    d_azp = d_sa + align_up(row_bytes);
    d_scratch = d_azp + align_up(row_bytes);
    d_total = d_scratch + scratch_bytes;
    h_x = 0;
    h_y = h_x + align_up(x_bytes);
    h_sa = h_y + align_up(y_bytes);
    h_azp = h_sa + align_up(row_bytes);
    h_total = h_azp + align_up(row_bytes);
  }
};

// Host <-> pinned copies of large requests go in chunks so that the host memcpy of one chunk
// overlaps the DMA of the previous one (for M = 2048 x 4096 bf16 the copies, not the GPU, are
// most of a request). At most StreamContext::kCopyEvents chunks per direction.
constexpr size_t kMinChunkBytes = size_t{2} << 20;

size_t chunk_bytes(size_t total) {
  const size_t per_event = (total + StreamContext::kCopyEvents - 1) / StreamContext::kCopyEvents;
  return std::max(kMinChunkBytes, align_up(per_event));
}

int64_t first_nan_row(const float* sa, int64_t m) {
  for (int64_t r = 0; r < m; ++r) {
    if (std::isnan(sa[r])) return r;
  }
  return -1;
}

absl::Status CublasLtPrepared::enqueue_host(StreamContext* ctx, const RunArgs& args,
                                            DebugOutputs* debug, int64_t* bad_row) const {
  const LayerConfig& c = weights_.config;
  const HostCallLayout L(args, c.n, c.k, device_scratch_bytes(args.m));
  RETURN_IF_ERROR(ctx->device.reserve(L.d_total, absl::StrCat("a request of ", args.m, " rows")));
  RETURN_IF_ERROR(
      ctx->host.reserve(L.h_total, absl::StrCat("staging a request of ", args.m, " rows")));
  char* dev = static_cast<char*>(ctx->device.get());
  char* host = static_cast<char*>(ctx->host.get());
  const cudaStream_t s = ctx->stream;

  // x: host -> pinned -> device, chunk by chunk (the pinned buffer holds all of x, so a chunk's
  // memcpy never waits for an earlier chunk's DMA).
  const size_t x_chunk = chunk_bytes(L.x_bytes);
  for (size_t off = 0; off < L.x_bytes; off += x_chunk) {
    const size_t len = std::min(x_chunk, L.x_bytes - off);
    std::memcpy(host + L.h_x + off, static_cast<const char*>(args.x) + off, len);
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(dev + L.d_x + off, host + L.h_x + off, len, cudaMemcpyHostToDevice, s));
  }
  DeviceRunArgs d;
  d.x = dev + L.d_x;
  d.x_dtype = args.x_dtype;
  d.m = args.m;
  d.y = dev + L.d_y;
  d.y_dtype = args.y_dtype;
  d.sa = reinterpret_cast<float*>(dev + L.d_sa);
  d.azp = reinterpret_cast<int32_t*>(dev + L.d_azp);
  StageEvents ev;
  for (int i = 0; i < 3; ++i) ev.e[i] = ctx->events[i];
  char* scratch = dev + L.d_scratch;
  RETURN_IF_ERROR(run_device(d, scratch, s, &ev));

  // sa (which also flags non-finite rows) and azp first, then y in chunks, each chunk's arrival
  // marked by an event so that the host copies it out while the next one is in flight.
  const bool asym = is_asymmetric(c.scheme);
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host + L.h_sa, d.sa, L.row_bytes, cudaMemcpyDeviceToHost, s));
  if (asym) {
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(host + L.h_azp, d.azp, L.row_bytes, cudaMemcpyDeviceToHost, s));
  }
  const size_t y_chunk = chunk_bytes(L.y_bytes);
  int chunks = 0;
  for (size_t off = 0; off < L.y_bytes; off += y_chunk, ++chunks) {
    const size_t len = std::min(y_chunk, L.y_bytes - off);
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host + L.h_y + off, static_cast<char*>(d.y) + off, len,
                                         cudaMemcpyDeviceToHost, s));
    RETURN_IF_CUDA_ERROR(cudaEventRecord(ctx->copy_events[chunks], s));
  }
  const ScratchLayout S(args.m, c.n, c.k);
  if (debug != nullptr) {
    debug->xq.resize(static_cast<size_t>(args.m * c.k));
    debug->acc.resize(static_cast<size_t>(args.m * c.n));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(debug->xq.data(), scratch + S.xq, debug->xq.size(),
                                         cudaMemcpyDeviceToHost, s));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(debug->acc.data(), scratch + S.acc, debug->acc.size() * 4,
                                         cudaMemcpyDeviceToHost, s));
  }

  const float* h_sa = reinterpret_cast<const float*>(host + L.h_sa);
  const int32_t* h_azp = reinterpret_cast<const int32_t*>(host + L.h_azp);
  for (int i = 0; i < chunks; ++i) {
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(ctx->copy_events[i]));
    if (i == 0) {
      *bad_row = first_nan_row(h_sa, args.m);
      if (*bad_row >= 0) break;  // the caller reports it; y stays untouched
    }
    const size_t off = static_cast<size_t>(i) * y_chunk;
    std::memcpy(static_cast<char*>(args.y) + off, host + L.h_y + off,
                std::min(y_chunk, L.y_bytes - off));
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
  if (*bad_row >= 0) return absl::OkStatus();

  if (args.sa != nullptr) std::memcpy(args.sa, h_sa, L.row_bytes);
  if (args.azp != nullptr && asym) std::memcpy(args.azp, h_azp, L.row_bytes);
  if (debug != nullptr) {
    debug->sa.assign(h_sa, h_sa + args.m);
    if (asym) {
      debug->azp.assign(h_azp, h_azp + args.m);
    } else {
      debug->azp.assign(static_cast<size_t>(args.m), 0);
    }
  }
  return absl::OkStatus();
}

absl::Status CublasLtPrepared::run_host(const RunArgs& args, RunTimings* timings,
                                        DebugOutputs* debug) const {
  const LayerConfig& c = weights_.config;
  if (args.m < 1) return absl::InvalidArgumentError("M must be >= 1");
  int64_t bad_row = -1;
  {
    StreamLease ctx(pool_);
    absl::Status s = enqueue_host(ctx.get(), args, debug, &bad_row);
    if (!s.ok()) {
      // Work already queued may still read or write the context's buffers: drain it before the
      // next request can take them.
      cudaStreamSynchronize(ctx->stream);
      cudaGetLastError();
      return s;
    }
    if (timings != nullptr && bad_row < 0) {
      // CUDA events on the request's stream (resolution about 0.5 us): quantize_ns is the
      // quantization kernel, gemm_ns the cuBLASLt GEMM plus the epilogue kernel. The copies
      // between host and device are in neither.
      float q_ms = 0.f, g_ms = 0.f;
      RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&q_ms, ctx->events[0], ctx->events[1]));
      RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&g_ms, ctx->events[1], ctx->events[2]));
      timings->quantize_ns = static_cast<int64_t>(q_ms * 1e6);
      timings->gemm_ns = static_cast<int64_t>(g_ms * 1e6);
    }
  }
  if (bad_row >= 0) {
    // The same message as the reference: the row from the GPU, the column and value from x.
    int64_t col = 0;
    float v = 0.f;
    for (; col < c.k; ++col) {
      v = load_as_f32(args.x, args.x_dtype, static_cast<size_t>(bad_row * c.k + col));
      if (!std::isfinite(v)) break;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("x row ", bad_row, " holds a non-finite value (", v, " at column ", col, ")"));
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
