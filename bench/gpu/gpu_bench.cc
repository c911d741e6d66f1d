// qlinear_gpu_bench: the full W8A8 op (quantize + GEMM + epilogue) of every CUDA kernel on the
// Llama-3 8B and 70B projection shapes, next to a bare cuBLASLt int8 GEMM (int32 out) of the same
// shape measured in the same run, with the roofline of each row.
//
// Why: the GEMM is the floor a W8A8 kernel can reach on this GPU through cuBLASLt; the ratio to it
// says what quantization and the epilogue cost, and "x floor" says how far either is from what
// the memory system and the tensor cores allow.
//
// How it measures: bf16 x in and bf16 y out in device memory (no PCIe in the timing), per-token x
// per-channel scales with bias. Each timed repetition is one CUDA graph replay (the launches of
// one op) between two CUDA events; the median of the repetitions is reported after warm-up. For
// M <= 64, where the op streams its weights, repetitions rotate over enough weight copies (>= 256
// MB together, over 4x the 60 MB L2) that weights come from HBM as they do in a served model.
// Floor = max(bytes / 4.3 TB/s, 2*M*N*K / 1979 TOPS) with bytes = weights + x + y (the GPU's
// measured copy bandwidth and the datasheet's dense int8 peak; an SM copy kernel's bandwidth
// measured in this run is printed too). A last section times the serving path (`run` on host
// buffers, copies included) for M = 1 and 2048.
//
// Usage: qlinear_gpu_bench [--quick] [--reps=N] [--warmup=N]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu/copy_kernel.h"
#include "common/args.h"
#include "common/random.h"
#include "kernels/core/dtype.h"
#include "kernels/core/host_info.h"
#include "kernels/core/status.h"
#include "kernels/core/weights.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/registry.h"

namespace qlinear::gpu {
namespace {

constexpr double kCopyBytesPerS = 4.3e12;  // measured D2D copy on the H200, read + write
constexpr double kInt8OpsPerS = 1979e12;   // datasheet dense int8 tensor peak
constexpr size_t kRotateBytes = size_t{256} << 20;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct ShapeCase {
  const char* model;
  const char* proj;
  int64_t n, k;
};
const ShapeCase kShapes[] = {
    {"8B", "qkv", 6144, 4096},    {"8B", "o", 4096, 4096},  {"8B", "gate_up", 28672, 4096},
    {"8B", "down", 4096, 14336},  {"70B", "o", 8192, 8192}, {"70B", "gate_up", 57344, 8192},
    {"70B", "down", 8192, 28672},
};
const int64_t kMs[] = {1, 16, 64, 256, 1024, 4096};

struct Options {
  bool quick = false;
  int64_t reps = 100;
  int64_t warmup = 10;
};

// Times `enqueue(slot)` (which queues one repetition's work on `stream`) as CUDA graph replays,
// slot rotating over [0, slots). Returns the median in microseconds.
absl::StatusOr<double> median_us(cudaStream_t stream, int slots, const Options& o,
                                 const std::function<absl::Status(int)>& enqueue) {
  // Eager first: module loading and cuBLASLt's first-call set-up stay out of the capture.
  for (int s = 0; s < slots; ++s) RETURN_IF_ERROR(enqueue(s));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  std::vector<cudaGraphExec_t> graphs(slots, nullptr);
  absl::Status status = absl::OkStatus();
  for (int s = 0; s < slots && status.ok(); ++s) {
    RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    absl::Status st = enqueue(s);
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream, &g);
    if (!st.ok()) status = st;
    if (status.ok() && e != cudaSuccess) {
      status = cuda_error_status(e, "cudaStreamEndCapture", __FILE__, __LINE__);
    }
    if (status.ok()) {
      const cudaError_t ie = cudaGraphInstantiate(&graphs[s], g, 0);
      if (ie != cudaSuccess)
        status = cuda_error_status(ie, "cudaGraphInstantiate", __FILE__, __LINE__);
    }
    if (g != nullptr) cudaGraphDestroy(g);
  }
  std::vector<cudaEvent_t> ev(2 * o.reps, nullptr);
  for (cudaEvent_t& e : ev) {
    if (status.ok()) {
      const cudaError_t ce = cudaEventCreate(&e);
      if (ce != cudaSuccess) status = cuda_error_status(ce, "cudaEventCreate", __FILE__, __LINE__);
    }
  }
  std::vector<float> ms(o.reps, 0.f);
  if (status.ok()) {
    auto launch = [&](int i) -> absl::Status {
      RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graphs[i % slots], stream));
      return absl::OkStatus();
    };
    for (int i = 0; i < o.warmup && status.ok(); ++i) status = launch(i);
    for (int i = 0; i < o.reps && status.ok(); ++i) {
      status = [&]() -> absl::Status {
        RETURN_IF_CUDA_ERROR(cudaEventRecord(ev[2 * i], stream));
        RETURN_IF_ERROR(launch(i));
        RETURN_IF_CUDA_ERROR(cudaEventRecord(ev[2 * i + 1], stream));
        return absl::OkStatus();
      }();
    }
    if (status.ok()) {
      const cudaError_t se = cudaStreamSynchronize(stream);
      if (se != cudaSuccess)
        status = cuda_error_status(se, "cudaStreamSynchronize", __FILE__, __LINE__);
    }
    for (int i = 0; i < o.reps && status.ok(); ++i) {
      const cudaError_t ee = cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
      if (ee != cudaSuccess)
        status = cuda_error_status(ee, "cudaEventElapsedTime", __FILE__, __LINE__);
    }
  }
  for (cudaEvent_t e : ev) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaGraphExec_t g : graphs) {
    if (g != nullptr) cudaGraphExecDestroy(g);
  }
  RETURN_IF_ERROR(status);
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

// A bare cuBLASLt int8 TN GEMM with int32 output, the anchor: same layouts as cuda.cublaslt,
// algorithm from the heuristic at this exact M.
class BareGemm {
 public:
  ~BareGemm() {
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (c_) cublasLtMatrixLayoutDestroy(c_);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
  }
  absl::Status init(cublasLtHandle_t h, int64_t m, int64_t n, int64_t k) {
    h_ = h;
    RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32I, CUDA_R_32I));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    RETURN_IF_CUBLAS_ERROR(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    RETURN_IF_CUBLAS_ERROR(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
    RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutCreate(&a_, CUDA_R_8I, k, n, k));
    RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutCreate(&b_, CUDA_R_8I, k, m, k));
    RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutCreate(&c_, CUDA_R_32I, n, m, n));
    cublasLtMatmulPreference_t pref = nullptr;
    RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(h_, desc_, a_, b_, c_, c_, pref, 1, &r, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    RETURN_IF_CUBLAS_ERROR(st);
    if (found == 0) return absl::NotFoundError("cuBLASLt has no int8 algorithm for this shape");
    algo_ = r.algo;
    return absl::OkStatus();
  }
  absl::Status enqueue(const int8_t* w, const int8_t* xq, int32_t* acc, void* workspace,
                       cudaStream_t s) const {
    const int32_t alpha = 1, beta = 0;
    RETURN_IF_CUBLAS_ERROR(cublasLtMatmul(h_, desc_, &alpha, w, a_, xq, b_, &beta, acc, c_, acc, c_,
                                          &algo_, workspace, kWorkspaceBytes, s));
    return absl::OkStatus();
  }

 private:
  cublasLtHandle_t h_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
};

absl::StatusOr<double> measure_copy_tbps(cudaStream_t s) {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer a, b;
  RETURN_IF_ERROR(a.allocate(bytes, "the copy benchmark"));
  RETURN_IF_ERROR(b.allocate(bytes, "the copy benchmark"));
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(a.get(), 1, bytes, s));
  Options o;
  o.reps = 10;
  o.warmup = 2;
  ASSIGN_OR_RETURN(double us, median_us(s, 1, o, [&](int) -> absl::Status {
                     RETURN_IF_CUDA_ERROR(
                         launch_copy_16b(a.get(), b.get(), bytes, host_info().gpus[0].sm_count, s));
                     return absl::OkStatus();
                   }));
  return 2.0 * bytes / (us * 1e-6) / 1e12;
}

std::vector<uint16_t> random_bf16(SplitMix64& rng, size_t count) {
  std::vector<uint16_t> v(count);
  for (uint16_t& h : v) h = f32_to_bf16(rng.uniform(-2.f, 2.f));
  return v;
}

struct Row {
  std::string shape;
  int64_t m;
  std::string kernel;
  double op_us, gemm_us;
  double tops, weight_tbps, x_floor, ratio;
};

void print_row(const Row& r) {
  std::printf("%-20s %5lld  %-14s %10.1f %10.1f %7.2f %8.1f %8.2f %8.2f\n", r.shape.c_str(),
              static_cast<long long>(r.m), r.kernel.c_str(), r.op_us, r.gemm_us, r.ratio, r.tops,
              r.weight_tbps, r.x_floor);
  std::fflush(stdout);
}

absl::Status run_shape(const ShapeCase& sc, const Registry& registry, const Options& o,
                       cudaStream_t stream, cublasLtHandle_t lt, std::vector<Row>* rows) {
  const int64_t n = sc.n, k = sc.k;
  const int64_t max_m = kMs[sizeof(kMs) / sizeof(kMs[0]) - 1];
  SplitMix64 rng(0x5eed0000ull + static_cast<uint64_t>(n * 131 + k));
  LayerSpec spec;
  spec.n = n;
  spec.k = k;
  spec.scheme = Scheme::kDynamicSymmetric;
  spec.weight_scale = random_floats(rng, static_cast<size_t>(n), 0.5e-3f, 2e-3f);
  spec.weight_scale_shape = {n};
  spec.bias = random_floats(rng, static_cast<size_t>(n), -1.f, 1.f);
  ASSIGN_OR_RETURN(std::shared_ptr<const LayerWeights> weights,
                   build_layer_weights(spec, random_int8(rng, static_cast<size_t>(n * k))));
  const size_t w_bytes = static_cast<size_t>(n * k);
  const int copies =
      static_cast<int>(std::clamp<size_t>((kRotateBytes + w_bytes - 1) / w_bytes, 2, 16));

  // Inputs for the largest M; smaller M use the leading rows.
  const std::vector<uint16_t> x_host = random_bf16(rng, static_cast<size_t>(max_m * k));
  const std::vector<int8_t> xq_host = random_int8(rng, static_cast<size_t>(max_m * k));
  DeviceBuffer x, xq, y, acc, workspace, scratch;
  std::vector<DeviceBuffer> w_copies(copies);
  RETURN_IF_ERROR(x.allocate(x_host.size() * 2, "x"));
  RETURN_IF_CUDA_ERROR(cudaMemcpy(x.get(), x_host.data(), x.size(), cudaMemcpyHostToDevice));
  RETURN_IF_ERROR(xq.allocate(xq_host.size(), "xq"));
  RETURN_IF_CUDA_ERROR(cudaMemcpy(xq.get(), xq_host.data(), xq.size(), cudaMemcpyHostToDevice));
  RETURN_IF_ERROR(y.allocate(static_cast<size_t>(max_m * n) * 2, "y"));
  RETURN_IF_ERROR(acc.allocate(static_cast<size_t>(max_m * n) * 4, "acc"));
  RETURN_IF_ERROR(workspace.allocate(kWorkspaceBytes, "workspace"));
  for (DeviceBuffer& w : w_copies) {
    RETURN_IF_ERROR(w.allocate(w_bytes, "weight copies"));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(w.get(), weights->w.data(), w_bytes, cudaMemcpyHostToDevice));
  }

  // Every CUDA kernel that can run this layer, each prepared `copies` times (one weight copy each).
  struct KernelCopies {
    std::string name;
    std::vector<std::unique_ptr<PreparedKernel>> prepared;
  };
  std::vector<KernelCopies> kernels;
  for (const Kernel* kern : registry.kernels()) {
    if (!absl::StartsWith(kern->name(), "cuda.")) continue;
    if (!registry.usable(*kern, host_info()).ok()) continue;
    const ProblemShape shape{1, n, k, DType::kBF16, DType::kBF16};
    if (!kern->can_implement(weights->config, shape).ok()) continue;
    KernelCopies kc{std::string(kern->name()), {}};
    for (int c = 0; c < copies; ++c) {
      ASSIGN_OR_RETURN(std::unique_ptr<PreparedKernel> p, kern->prepare(*weights));
      if (dynamic_cast<CudaPreparedKernel*>(p.get()) == nullptr) break;
      kc.prepared.push_back(std::move(p));
    }
    if (!kc.prepared.empty()) kernels.push_back(std::move(kc));
  }
  size_t scratch_bytes = 0;
  for (const auto& kc : kernels) {
    scratch_bytes = std::max(
        scratch_bytes,
        static_cast<const CudaPreparedKernel*>(kc.prepared[0].get())->device_scratch_bytes(max_m));
  }
  RETURN_IF_ERROR(scratch.allocate(scratch_bytes, "kernel scratch"));

  const std::string shape_name = absl::StrFormat(
      "%s %s %lldx%lld", sc.model, sc.proj, static_cast<long long>(n), static_cast<long long>(k));
  for (int64_t m : kMs) {
    const int slots = m <= 64 ? copies : 1;
    BareGemm bare;
    RETURN_IF_ERROR(bare.init(lt, m, n, k));
    ASSIGN_OR_RETURN(double gemm_us, median_us(stream, slots, o, [&](int s) {
                       return bare.enqueue(w_copies[s].as<int8_t>(), xq.as<int8_t>(),
                                           acc.as<int32_t>(), workspace.get(), stream);
                     }));
    const double ops = 2.0 * m * n * k;
    for (const auto& kc : kernels) {
      ASSIGN_OR_RETURN(
          double op_us, median_us(stream, std::min<int>(slots, kc.prepared.size()), o, [&](int s) {
            const auto* p = static_cast<const CudaPreparedKernel*>(kc.prepared[s].get());
            DeviceRunArgs a;
            a.x = x.get();
            a.x_dtype = DType::kBF16;
            a.m = m;
            a.y = y.get();
            a.y_dtype = DType::kBF16;
            return p->run_device(a, scratch.get(), stream, nullptr);
          }));
      const double bytes = static_cast<double>(n * k) + 2.0 * m * k + 2.0 * m * n;
      const double floor_s = std::max(bytes / kCopyBytesPerS, ops / kInt8OpsPerS);
      Row r{shape_name,
            m,
            kc.name,
            op_us,
            gemm_us,
            ops / (op_us * 1e-6) / 1e12,
            static_cast<double>(n * k) / (op_us * 1e-6) / 1e12,
            op_us * 1e-6 / floor_s,
            op_us / gemm_us};
      print_row(r);
      rows->push_back(r);
    }
    const double gbytes = static_cast<double>(n * k) + 1.0 * m * k + 4.0 * m * n;
    const double gfloor = std::max(gbytes / kCopyBytesPerS, ops / kInt8OpsPerS);
    Row g{shape_name,
          m,
          "cublasLt-s32",
          gemm_us,
          gemm_us,
          ops / (gemm_us * 1e-6) / 1e12,
          static_cast<double>(n * k) / (gemm_us * 1e-6) / 1e12,
          gemm_us * 1e-6 / gfloor,
          1.0};
    print_row(g);
    rows->push_back(g);
  }
  return absl::OkStatus();
}

// The serving path: host x in, host y out, through `run` (pinned staging, H2D, the op, D2H, one
// synchronisation), timed with a host clock around each call.
absl::Status run_host_path(const Registry& registry, const Options& o) {
  const int64_t n = 4096, k = 4096;
  SplitMix64 rng(77);
  LayerSpec spec;
  spec.n = n;
  spec.k = k;
  spec.weight_scale = random_floats(rng, static_cast<size_t>(n), 0.5e-3f, 2e-3f);
  spec.weight_scale_shape = {n};
  spec.bias = random_floats(rng, static_cast<size_t>(n), -1.f, 1.f);
  ASSIGN_OR_RETURN(std::shared_ptr<const LayerWeights> weights,
                   build_layer_weights(spec, random_int8(rng, static_cast<size_t>(n * k))));
  std::printf(
      "\nserving path (run() on host buffers, copies and one sync included), 8B o %lldx%lld\n",
      static_cast<long long>(n), static_cast<long long>(k));
  std::printf("%-14s %6s %12s %12s %12s %12s\n", "kernel", "M", "median_us", "p90_us",
              "quantize_us", "gemm+ep_us");
  for (const Kernel* kern : registry.kernels()) {
    if (!absl::StartsWith(kern->name(), "cuda.") || !registry.usable(*kern, host_info()).ok()) {
      continue;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<PreparedKernel> p, kern->prepare(*weights));
    for (int64_t m : {int64_t{1}, int64_t{2048}}) {
      const std::vector<uint16_t> xh = random_bf16(rng, static_cast<size_t>(m * k));
      std::vector<uint16_t> yh(static_cast<size_t>(m * n));
      RunArgs a;
      a.x = xh.data();
      a.x_dtype = DType::kBF16;
      a.m = m;
      a.y = yh.data();
      a.y_dtype = DType::kBF16;
      RunTimings t;
      for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(p->run(a, &t));
      std::vector<double> us;
      const int reps = o.quick ? 10 : 50;
      for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        RETURN_IF_ERROR(p->run(a, &t));
        us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      std::sort(us.begin(), us.end());
      std::printf("%-14s %6lld %12.1f %12.1f %12.1f %12.1f\n", std::string(kern->name()).c_str(),
                  static_cast<long long>(m), us[us.size() / 2], us[us.size() * 9 / 10],
                  t.quantize_ns / 1e3, t.gemm_ns / 1e3);
    }
  }
  return absl::OkStatus();
}

int bench_main(int argc, char** argv) {
  Options o;
  ArgParser args("qlinear_gpu_bench [--quick] [--reps=N] [--warmup=N]",
                 "W8A8 op of every CUDA kernel vs a bare cuBLASLt int8 GEMM on Llama-3 shapes.");
  args.add("quick", &o.quick, "Fewer shapes and repetitions");
  args.add("reps", &o.reps, "Timed repetitions per row (median reported)");
  args.add("warmup", &o.warmup, "Untimed repetitions before timing");
  if (absl::Status s = args.parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), args.help().c_str());
    return 2;
  }
  if (args.help_requested()) {
    std::printf("%s", args.help().c_str());
    return 0;
  }
  if (o.quick) {
    o.reps = std::min<int64_t>(o.reps, 20);
    o.warmup = std::min<int64_t>(o.warmup, 3);
  }
  o.reps = std::max<int64_t>(o.reps, 1);

  const HostInfo& host = host_info();
  if (absl::Status s = cuda_device_usable(host); !s.ok()) {
    std::printf("qlinear_gpu_bench: no usable GPU: %s\n", std::string(s.message()).c_str());
    return 0;
  }
  Registry registry;
  register_builtin_kernels(&registry);
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "qlinear_gpu_bench: cannot create a stream or a cuBLASLt handle\n");
    return 1;
  }
  auto copy = measure_copy_tbps(stream);
  std::printf("GPU: %s\n", host.gpu_description().c_str());
  std::printf(
      "ceilings: copy %.2f TB/s measured now (floor uses %.1f), int8 %.0f TOPS datasheet; "
      "reps %lld, median\n",
      copy.ok() ? *copy : 0.0, kCopyBytesPerS / 1e12, kInt8OpsPerS / 1e12,
      static_cast<long long>(o.reps));
  std::printf(
      "op = quantize + GEMM + epilogue, bf16 in/out, per-token x per-channel, bias; "
      "gemm = bare cuBLASLt int8->int32\n\n");
  std::printf("%-20s %5s  %-14s %10s %10s %7s %8s %8s %8s\n", "shape (N x K)", "M", "kernel",
              "op_us", "gemm_us", "op/gemm", "TOPS", "W_TB/s", "x_floor");
  std::vector<Row> rows;
  int failures = 0;
  for (const ShapeCase& sc : kShapes) {
    if (o.quick && !(sc.n == 4096 && sc.k == 4096) && !(sc.n == 28672) &&
        !(sc.n == 8192 && sc.k == 8192)) {
      continue;
    }
    if (absl::Status s = run_shape(sc, registry, o, stream, lt, &rows); !s.ok()) {
      std::printf("%s %s %lldx%lld: %s\n", sc.model, sc.proj, static_cast<long long>(sc.n),
                  static_cast<long long>(sc.k), std::string(s.message()).c_str());
      ++failures;
    }
  }
  if (absl::Status s = run_host_path(registry, o); !s.ok()) {
    std::printf("serving path: %s\n", std::string(s.message()).c_str());
    ++failures;
  }
  cublasLtDestroy(lt);
  cudaStreamDestroy(stream);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace qlinear::gpu

int main(int argc, char** argv) { return qlinear::gpu::bench_main(argc, argv); }
