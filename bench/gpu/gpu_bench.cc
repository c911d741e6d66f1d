// qlinear_gpu_bench: the full W8A8 op (quantize + GEMM + epilogue) of every CUDA kernel on the
// Llama-3 8B and 70B projection shapes, next to a bare cuBLASLt int8 GEMM (int32 out) of the same
// shape measured in the same run, with the roofline of each row.
//
// Why: the bare GEMM is what cuBLASLt reaches without quantization or dequantization, and
// cuda.cublaslt (quantize + cuBLASLt + a separate epilogue kernel) is the op the fused kernels
// replace; "x floor" says how far each is from what the memory system and tensor cores allow.
//
// How it measures: bf16 x in and bf16 y out in device memory (no PCIe in the timing), per-token x
// per-channel scales with bias. Each timed repetition is one CUDA graph replay (the launches of
// one op) between two CUDA events; the median of the repetitions is reported after warm-up. For
// M <= 64, where the op streams its weights, repetitions rotate over enough weight copies (>= 256
// MB together, over 4x the 60 MB L2) that weights come from HBM as they do in a served model;
// from M = 128 the bare GEMM and the ops are timed in turns of ten calls each, so that the
// GPU's power-capped clock weighs on all of them alike (see run_shape).
// Floor = max(bytes / 4.3 TB/s, 2*M*N*K / 1979 TOPS) with bytes = weights + x + y (the GPU's
// measured copy bandwidth and the datasheet's dense int8 peak); an SM copy and an SM read stream
// measured in this run are printed too. Per shape, the fastest of several plain reads of the same
// rotated weight copies ("weights read alone": 16-byte loads, or bulk copies into shared memory
// as the weight-streaming kernels use; launch and events included) is what an op of that shape,
// which reads every weight byte, can only beat by reading faster than all of them: "x read" is
// an op's time over it, and a missed target that asks for less is marked as such.
//
// Sections: (1) cuda.gemv_s8's launch plans swept against its planner's choice, (2)
// cuda.cutlass_sm90's tile configurations (GEMM + fused epilogue, no quantize) against the bare
// cuBLASLt GEMM, (3) every kernel's op per shape and M, (4) the serving path (`run` on host
// buffers) for M = 1 and 2048, and last (5) a summary: per shape and M the kernel the server
// dispatches (its load-time autotune keeps the fastest GPU kernel per M bucket), its time, TOPS,
// weight bandwidth, distance to the floor and (M <= 64) to the weights read alone, and its
// speed-up over the bare GEMM and over cuda.cublaslt, with the issue's targets checked.
//
// Usage: qlinear_gpu_bench [--quick] [--small_m] [--diagnose] [--reps=N] [--warmup=N]
//                          [--sweep=true|false] [--share_tuning=true|false] [--scheduler]
//                          [--stream_prefetch]
//                          [--weights_hint] [--pad_rows] [--swap] [--tail] [--streamk]
//                          [--claim] [--prefill] [--energy] [--reads] [--sm_rate]
//                          [--fixed_cost] [--setup_quant] [--ring_switch]
// (--small_m: every shape at M = 1, 2, 4, 8, 16 and 32 only, with cuda.gemv_s8's plan sweep;
//  --diagnose: only where the time goes: cuda.gemv_s8's and cuda.stream_s8's phases at M = 1
//  and 16, cuda.cutlass_sm90's CTAs at M = 1-256; see diagnose_gemv, diagnose_stream and
//  diagnose_cutlass; --scheduler: only the large-M tiles with each tile-scheduler walk, warm,
//  after an L2 flush and after the quantize kernel, see sweep_scheduler; --stream_prefetch: only
//  cuda.stream_s8's ring depths and L2 prefetches at M = 1 and 16, see compare_stream_prefetch;
//  --weights_hint: only cuda.cutlass_sm90's ops at M = 1-256 with and without the weights'
//  evict-first L2 hint, see compare_weights_hint; --pad_rows: only its 64-token tiles at
//  M = 1-64 with the token block's rows past M zero-filled or read, see compare_weights_hint;
//  --swap: only its ops and GEMMs at M = 1 and 16 on the 64 x 64 tile and on the tiles with
//  their operands swapped, with every stage or a few ahead, see compare_weights_hint; --tail:
//  only its swapped tiles' ops at M = 1 and 16 on the layers whose tiles outnumber the SMs, with
//  and without the last wave's weights prefetched into L2, see compare_weights_hint; --streamk:
//  only the stream-K swapped tile at M = 1 and 16, its shares and where its time goes, see
//  compare_streamk; --claim: only the swapped tiles whose CTAs claim their tiles at run time
//  against the static ones at M = 1 and 16, and their CTAs' timelines, see compare_claim;
//  --prefill:
//  only its large-M ops, the quantize pass's cost beside the GEMM's, see compare_prefill; --energy:
//  only the large-M ops' energy, power and SM clock, see compare_energy; --reads: only the weights
//  read alone in each form, see compare_reads; --sm_rate: only how fast one SM streams weights by
//  itself, see compare_sm_rate; --fixed_cost: only what a swapped tile's launch costs besides its
//  stream, see compare_fixed_cost; --setup_quant: only the quantizing tiles at M = 128 and 256
//  with every row quantized in the GEMM's set-up, against the ops as served, see
//  compare_setup_quant; --ring_switch: only the quantize kernel's warp and ring forms on x of
//  16-192 MB, see compare_ring_switch)
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "bench/gpu/copy_kernel.h"
#include "bench/gpu/gpu_power.h"
#include "bench/gpu/vllm_sm90.h"
#include "common/args.h"
#include "common/random.h"
#include "kernels/core/dtype.h"
#include "kernels/core/host_info.h"
#include "kernels/core/status.h"
#include "kernels/core/tuning_cache.h"
#include "kernels/core/weights.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_host_call.h"
#include "kernels/cuda/cutlass_sm90_device.h"
#include "kernels/cuda/gemv_s8.h"
#include "kernels/cuda/gemv_s8_device.h"
#include "kernels/cuda/l2_flush.h"
#include "kernels/cuda/stream_s8_device.h"
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
  std::vector<int64_t> large_ms;  // prefill sizes measured on this shape besides kSmallMs
};
const ShapeCase kShapes[] = {
    {"8B", "qkv", 6144, 4096, {}},          {"8B", "o", 4096, 4096, {1024, 4096}},
    {"8B", "gate_up", 28672, 4096, {4096}}, {"8B", "down", 4096, 14336, {1024}},
    {"70B", "o", 8192, 8192, {2048, 8192}}, {"70B", "gate_up", 57344, 8192, {}},
    {"70B", "down", 8192, 28672, {}},
};
const int64_t kSmallMs[] = {1, 16, 64, 128, 256};

struct Options {
  bool quick = false;
  bool small_m = false;
  bool diagnose = false;
  bool serving = false;
  bool cuda_graphs = true;
  bool share_tuning = true;
  int64_t direct_output_kb = -1;  // -1: the serving path's default
  bool sweep = true;
  bool scheduler = false;
  bool stream_prefetch = false;
  bool weights_hint = false;
  bool vllm = false;
  bool pad_rows = false;
  bool swap = false;
  bool tail = false;
  bool streamk = false;
  bool claim = false;
  bool prefill = false;
  bool setup_quant = false;
  bool ring_switch = false;
  bool energy = false;
  bool reads = false;
  bool sm_rate = false;
  bool fixed_cost = false;
  // --profile: one cuda.cutlass_sm90 tile's GEMM alone on one shape ("NxK") at one M.
  std::string profile;
  int64_t profile_tile = -1;
  int64_t profile_m = 0;
  int64_t reps = 100;
  int64_t warmup = 10;
};

// Times each of `enqueues` (each queues one repetition's work on `stream`, its slot rotating over
// [0, slots)) as CUDA graph replays, in turns of kTurnReps repetitions of one candidate: the GPU's
// clock, which a sustained load lowers (see run_shape), then weighs on every candidate alike,
// while within a turn a candidate finds the cache as its own previous call left it, as timed
// alone (one turn's first repetition follows another candidate; the median leaves it out).
// Returns each candidate's median in microseconds.
constexpr int64_t kTurnReps = 10;

// What `enqueue` queues on `stream`, captured and instantiated as a graph (the caller destroys it).
absl::StatusOr<cudaGraphExec_t> capture_graph(cudaStream_t stream,
                                              const std::function<absl::Status()>& enqueue) {
  RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  absl::Status status = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream, &graph);
  if (status.ok() && e != cudaSuccess) {
    status = cuda_error_status(e, "cudaStreamEndCapture", __FILE__, __LINE__);
  }
  cudaGraphExec_t exec = nullptr;
  if (status.ok()) {
    const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
    if (ie != cudaSuccess)
      status = cuda_error_status(ie, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  RETURN_IF_ERROR(status);
  return exec;
}

absl::StatusOr<std::vector<double>> medians_in_turns(
    cudaStream_t stream, int slots, const Options& o,
    const std::vector<std::function<absl::Status(int)>>& enqueues) {
  const size_t n = enqueues.size();
  // Eager first: module loading and cuBLASLt's first-call set-up stay out of the capture.
  for (const auto& enqueue : enqueues) {
    for (int s = 0; s < slots; ++s) RETURN_IF_ERROR(enqueue(s));
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  std::vector<cudaGraphExec_t> graphs(n * slots, nullptr);
  absl::Status status = absl::OkStatus();
  for (size_t g = 0; g < graphs.size() && status.ok(); ++g) {
    absl::StatusOr<cudaGraphExec_t> exec =
        capture_graph(stream, [&] { return enqueues[g / slots](static_cast<int>(g % slots)); });
    if (exec.ok()) {
      graphs[g] = *exec;
    } else {
      status = exec.status();
    }
  }
  std::vector<cudaEvent_t> ev(2 * o.reps * n, nullptr);
  for (cudaEvent_t& e : ev) {
    if (status.ok()) {
      const cudaError_t ce = cudaEventCreate(&e);
      if (ce != cudaSuccess) status = cuda_error_status(ce, "cudaEventCreate", __FILE__, __LINE__);
    }
  }
  std::vector<std::vector<float>> ms(n, std::vector<float>(o.reps, 0.f));
  if (status.ok()) {
    auto launch = [&](size_t c, int64_t i) -> absl::Status {
      RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graphs[c * slots + i % slots], stream));
      return absl::OkStatus();
    };
    for (size_t c = 0; c < n && status.ok(); ++c) {
      for (int64_t i = 0; i < o.warmup && status.ok(); ++i) status = launch(c, i);
    }
    for (int64_t i0 = 0; i0 < o.reps && status.ok(); i0 += kTurnReps) {
      for (size_t c = 0; c < n && status.ok(); ++c) {
        for (int64_t i = i0; i < std::min(i0 + kTurnReps, o.reps) && status.ok(); ++i) {
          status = [&]() -> absl::Status {
            RETURN_IF_CUDA_ERROR(cudaEventRecord(ev[2 * (i * n + c)], stream));
            RETURN_IF_ERROR(launch(c, i));
            RETURN_IF_CUDA_ERROR(cudaEventRecord(ev[2 * (i * n + c) + 1], stream));
            return absl::OkStatus();
          }();
        }
      }
    }
    if (status.ok()) {
      const cudaError_t se = cudaStreamSynchronize(stream);
      if (se != cudaSuccess)
        status = cuda_error_status(se, "cudaStreamSynchronize", __FILE__, __LINE__);
    }
    for (int64_t i = 0; i < o.reps && status.ok(); ++i) {
      for (size_t c = 0; c < n && status.ok(); ++c) {
        const cudaError_t ee =
            cudaEventElapsedTime(&ms[c][i], ev[2 * (i * n + c)], ev[2 * (i * n + c) + 1]);
        if (ee != cudaSuccess)
          status = cuda_error_status(ee, "cudaEventElapsedTime", __FILE__, __LINE__);
      }
    }
  }
  for (cudaEvent_t e : ev) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaGraphExec_t g : graphs) {
    if (g != nullptr) cudaGraphExecDestroy(g);
  }
  RETURN_IF_ERROR(status);
  std::vector<double> out;
  for (std::vector<float>& v : ms) {
    std::sort(v.begin(), v.end());
    out.push_back(1e3 * v[v.size() / 2]);
  }
  return out;
}

// The sweeps' repetitions: at most 30 timed and 3 untimed per candidate (they time many).
Options sweep_options(const Options& o) {
  Options so = o;
  so.reps = std::min<int64_t>(o.reps, 30);
  so.warmup = std::min<int64_t>(o.warmup, 3);
  return so;
}

// Times `enqueue(slot)` (which queues one repetition's work on `stream`) as CUDA graph replays,
// slot rotating over [0, slots). Returns the median in microseconds.
absl::StatusOr<double> median_us(cudaStream_t stream, int slots, const Options& o,
                                 const std::function<absl::Status(int)>& enqueue) {
  ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, slots, o, {enqueue}));
  return us[0];
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
  // The heuristic's choice as cuBLASLt's algorithm configuration names it (cublasLt.h, each
  // attribute read at its own width): the algorithm id, the CTA tile and the cluster in cuBLASLt's
  // M x N (channels x tokens: its M is the layer's N), the stages (k-tile bytes x count), the
  // inner-shape id, split-K as cuBLASLt gives it, the reduction scheme and CTA swizzling. Values
  // outside the short tables are printed by id; an attribute cuBLASLt does not answer, as "?".
  std::string describe() const {
    auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto type) -> std::string {
      decltype(type) v{};
      size_t written = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&algo_, attr, &v, sizeof(v), &written) !=
          CUBLAS_STATUS_SUCCESS) {
        return "?";
      }
      return absl::StrCat(v);
    };
    auto named = [](const std::string& id, int first, const std::vector<const char*>& names) {
      int v = 0;
      if (!absl::SimpleAtoi(id, &v) || v < first || v >= first + static_cast<int>(names.size())) {
        return id == "?" ? id : absl::StrCat("#", id);
      }
      return std::string(names[v - first]);
    };
    // cublasLtMatmulTile_t 15..25, cublasLtClusterShape_t 0..51, cublasLtMatmulStages_t 20..24
    // and 34..38.
    const std::string tile = named(get(CUBLASLT_ALGO_CONFIG_TILE_ID, uint32_t{}), 15,
                                   {"64x64", "128x32", "64x128", "128x64", "64x256", "128x128",
                                    "256x64", "64x512", "128x256", "256x128", "512x64"});
    const std::string cluster =
        named(get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, uint16_t{}), 0,
              {"auto", "#1",   "1x1",  "2x1",  "4x1",  "1x2",  "2x2",  "4x2", "1x4", "2x4", "4x4",
               "8x1",  "1x8",  "8x2",  "2x8",  "16x1", "1x16", "3x1",  "5x1", "6x1", "7x1", "9x1",
               "10x1", "11x1", "12x1", "13x1", "14x1", "15x1", "3x2",  "5x2", "6x2", "7x2", "1x3",
               "2x3",  "3x3",  "4x3",  "5x3",  "3x4",  "1x5",  "2x5",  "3x5", "1x6", "2x6", "1x7",
               "2x7",  "1x9",  "1x10", "1x11", "1x12", "1x13", "1x14", "1x15"});
    const std::string stages_id = get(CUBLASLT_ALGO_CONFIG_STAGES_ID, uint32_t{});
    std::string stages = named(stages_id, 20, {"128x2", "128x3", "128x4", "128x5", "128x6"});
    if (absl::StartsWith(stages, "#")) {
      stages = named(stages_id, 34, {"32xauto", "64xauto", "128xauto", "256xauto", "768xauto"});
    }
    return absl::StrCat("cuBLASLt algo ", get(CUBLASLT_ALGO_CONFIG_ID, int32_t{}), ", tile ", tile,
                        ", cluster ", cluster, ", stages ", stages, ", inner #",
                        get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, uint16_t{}), ", splitk ",
                        get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, int32_t{}), ", reduction ",
                        get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, uint32_t{}), ", swizzle ",
                        get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, uint32_t{}));
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

struct Ceilings {
  double copy_tbps = 0, read_tbps = 0;
};

absl::StatusOr<Ceilings> measure_ceilings(cudaStream_t s) {
  const size_t bytes = size_t{1} << 30;
  const int sms = host_info().gpus[0].sm_count;
  DeviceBuffer a, b, sink;
  RETURN_IF_ERROR(a.allocate(bytes, "the copy benchmark"));
  RETURN_IF_ERROR(b.allocate(bytes, "the copy benchmark"));
  RETURN_IF_ERROR(sink.allocate(read_sink_bytes(sms), "the read benchmark"));
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(a.get(), 1, bytes, s));
  Options o;
  o.reps = 10;
  o.warmup = 2;
  Ceilings c;
  ASSIGN_OR_RETURN(double copy_us, median_us(s, 1, o, [&](int) -> absl::Status {
                     RETURN_IF_CUDA_ERROR(launch_copy_16b(a.get(), b.get(), bytes, sms, s));
                     return absl::OkStatus();
                   }));
  ASSIGN_OR_RETURN(double read_us, median_us(s, 1, o, [&](int) -> absl::Status {
                     RETURN_IF_CUDA_ERROR(launch_read_16b(a.get(), bytes, sms, sink.get(), s));
                     return absl::OkStatus();
                   }));
  c.copy_tbps = 2.0 * bytes / (copy_us * 1e-6) / 1e12;
  c.read_tbps = 1.0 * bytes / (read_us * 1e-6) / 1e12;
  return c;
}

// The CUDA kernels to measure: the registry's, plus cuda.gemv_s8, which is built but not in the
// default registry (kernels/cuda/cuda_kernels.cc says why) and is measured all the same.
std::vector<const Kernel*> bench_kernels(const Registry& registry) {
  static const std::unique_ptr<Kernel> gemv = make_gemv_s8_kernel();
  std::vector<const Kernel*> out;
  for (const Kernel* k : registry.kernels()) {
    if (absl::StartsWith(k->name(), "cuda.")) out.push_back(k);
  }
  if (registry.find(gemv->name()) == nullptr) out.insert(out.begin(), gemv.get());
  return out;
}

std::vector<uint16_t> random_bf16(SplitMix64& rng, size_t count) {
  std::vector<uint16_t> v(count);
  for (uint16_t& h : v) h = f32_to_bf16(rng.uniform(-2.f, 2.f));
  return v;
}

// One measured (shape, M): the bare GEMM and each kernel's op.
struct Point {
  std::string shape;
  int64_t n = 0, k = 0, m = 0;
  double gemm_us = 0;
  // Where the weights rotate (M <= 64): the fastest plain read of the same weight bytes over the
  // same number of rotated copies, timed the same way (weights_read_us): what an op of this shape
  // can only beat by reading the weights faster than any of those reads (0 elsewhere).
  double read_us = 0;
  std::map<std::string, double> op_us;  // kernel name -> op time
  std::string dispatched;               // what the server runs at this M (see run_shape)
  // The "vLLM" anchor's op (vllm_sm90.h: the quantize kernel, then vLLM's GEMM for this M and N),
  // timed as the ops are; 0 where it is not compiled in or cannot run the shape.
  double vllm_us = 0;
};

double floor_us(int64_t m, int64_t n, int64_t k) {
  const double bytes = static_cast<double>(n * k) + 2.0 * m * k + 2.0 * m * n;
  const double ops = 2.0 * m * n * k;
  return 1e6 * std::max(bytes / kCopyBytesPerS, ops / kInt8OpsPerS);
}

// Everything one shape needs on the device: weight copies for rotation, inputs for the largest
// M, outputs, and the per-channel vectors the device-level sweeps pass by hand.
struct ShapeBuffers {
  int copies = 1;
  std::vector<DeviceBuffer> w;
  DeviceBuffer x, xq, y, acc, workspace, scratch, sb, bias, sa, azp, adj;
  DeviceBuffer vllm_bias;  // the "vLLM" anchor's bias, in y's type (as vLLM holds it)
  // Zeros for the tiles that sum shared tiles in a workspace (which they leave zeroed).
  DeviceBuffer zero_workspace;
};

// The shape as --profile names it: "NxK".
std::string shape_nxk(const ShapeCase& sc) {
  return absl::StrFormat("%lldx%lld", static_cast<long long>(sc.n), static_cast<long long>(sc.k));
}

std::string shape_name(const ShapeCase& sc) {
  return absl::StrFormat("%s %s %lldx%lld", sc.model, sc.proj, static_cast<long long>(sc.n),
                         static_cast<long long>(sc.k));
}

// A gemv plan as row groups / split_k / clusters / chunks.
std::string plan_name(const GemvS8Plan& p) {
  return absl::StrFormat("%d/%d/%d/%d", p.row_groups, p.split_k, p.clusters, p.chunks);
}

// cuda.gemv_s8's device arguments for M rows of the shape (weights set per launch).
GemvS8Args gemv_args(const ShapeCase& sc, const ShapeBuffers& b, int64_t m) {
  GemvS8Args a;
  a.x = b.x.get();
  a.m = m;
  a.n = sc.n;
  a.k = sc.k;
  a.sb = b.sb.as<float>();
  a.bias = b.bias.as<float>();
  a.y = b.y.get();
  a.sa = b.sa.as<float>();
  return a;
}

// The plan cuda.gemv_s8's prepare picks for a's M group: every plan timed with a cold L2.
absl::StatusOr<GemvS8Plan> prepare_gemv_plan(GemvS8Args a, const ShapeBuffers& b,
                                             cudaStream_t stream) {
  DeviceBuffer flush;
  RETURN_IF_ERROR(flush.allocate(size_t{128} << 20, "an L2 flush buffer"));
  const int m_pad = gemv_m_pad(a.m);
  a.w = b.w[0].as<int8_t>();
  a.m = m_pad;
  GemvS8Plan plan;
  RETURN_IF_CUDA_ERROR(tune_gemv_s8(a, m_pad, flush.get(), flush.size(), 64, stream, &plan));
  return plan;
}

// One gemv launch per repetition, over the rotated weight copies.
absl::StatusOr<double> time_gemv_plan(const GemvS8Args& a, const GemvS8Plan& plan,
                                      const ShapeBuffers& b, const Options& o,
                                      cudaStream_t stream) {
  return median_us(stream, b.copies, o, [&](int s) -> absl::Status {
    GemvS8Args as = a;
    as.w = b.w[s].as<int8_t>();
    RETURN_IF_CUDA_ERROR(launch_gemv_s8(as, plan, stream));
    return absl::OkStatus();
  });
}

// (1) cuda.gemv_s8: every (row groups, split_k) launch plan against the planner's choice, for
// M = 1, 16 and 64, weights rotated.
absl::Status sweep_gemv(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                        cudaStream_t stream) {
  const Options so = sweep_options(o);
  const std::vector<int64_t> sweep_ms =
      o.small_m ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 16, 64};
  for (int64_t m : sweep_ms) {
    const int m_pad = gemv_m_pad(m);
    if (!gemv_s8_fits(sc.k, m_pad)) continue;
    const GemvS8Args a = gemv_args(sc, b, m);
    auto time_plan = [&](const GemvS8Plan& plan) { return time_gemv_plan(a, plan, b, so, stream); };
    ASSIGN_OR_RETURN(const GemvS8Plan chosen, prepare_gemv_plan(a, b, stream));
    ASSIGN_OR_RETURN(const double chosen_us, time_plan(chosen));
    GemvS8Plan best = chosen;
    double best_us = chosen_us;
    std::string all;
    for (int rg : {8, 4, 2, 1}) {
      for (int sk = 1; sk <= 8; ++sk) {
        for (int u : {4, 2}) {
          GemvS8Plan p;
          const cudaError_t e = plan_gemv_s8_fixed(sc.n, sc.k, m_pad, 2, rg, sk, &p, u);
          if (e == cudaErrorNotSupported) continue;
          RETURN_IF_CUDA_ERROR(e);
          ASSIGN_OR_RETURN(const double us, time_plan(p));
          absl::StrAppendFormat(&all, " %s:%.1f", plan_name(p), us);
          if (us < best_us) {
            best_us = us;
            best = p;
          }
        }
      }
    }
    std::printf(
        "gemv-plan %-22s M=%-3lld tuned rg/sk/cl/u %-10s %7.1f us %.2f TB/s (load-time "
        "%5.1f)  best %-10s %7.1f us\n",
        shape_name(sc).c_str(), static_cast<long long>(m), plan_name(chosen).c_str(), chosen_us,
        sc.n * sc.k / (chosen_us * 1e-6) / 1e12, chosen.measured_us, plan_name(best).c_str(),
        best_us);
    std::printf("gemv-plan-all %-22s M=%-3lld%s\n", shape_name(sc).c_str(),
                static_cast<long long>(m), all.c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// The median of v (0 when empty).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The mean of the middle 80% of v (0 when empty).
double trimmed_mean(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t cut = v.size() / 10;
  double sum = 0;
  for (size_t i = cut; i < v.size() - cut; ++i) sum += v[i];
  return sum / static_cast<double>(v.size() - 2 * cut);
}

// A traced launch's %globaltimer stamps, once `stream` has finished writing them.
absl::StatusOr<std::vector<uint64_t>> trace_to_host(const DeviceBuffer& trace,
                                                    cudaStream_t stream) {
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  std::vector<uint64_t> t(trace.size() / sizeof(uint64_t));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpy(t.data(), trace.get(), t.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  return t;
}

// The shape's weights read alone: each plain read form (launch_read_form) over its rotated weight
// copies, timed as the ops are (launch and events included); the fastest stands for the read.
// sink: read_sink_bytes(SM count).
struct WeightsRead {
  double us = 0;      // the fastest form's median
  std::string forms;  // every form's median, "name us" each
};
absl::StatusOr<WeightsRead> weights_read_us(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                                            void* sink, cudaStream_t stream) {
  const int sms = host_info().gpus[0].sm_count;
  const size_t w_bytes = static_cast<size_t>(sc.n * sc.k);
  WeightsRead r;
  for (int form = 0; form < kReadForms; ++form) {
    ASSIGN_OR_RETURN(
        const double us, median_us(stream, b.copies, o, [&](int s) -> absl::Status {
          RETURN_IF_CUDA_ERROR(launch_read_form(form, b.w[s].get(), w_bytes, sms, sink, stream));
          return absl::OkStatus();
        }));
    if (form == 0 || us < r.us) r.us = us;
    absl::StrAppendFormat(&r.forms, " %s %.1f", read_form_name(form), us);
  }
  return r;
}

// The line that names the weights read alone for a shape; returns its time.
absl::StatusOr<double> print_weights_read(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                                          cudaStream_t stream) {
  DeviceBuffer sink;
  RETURN_IF_ERROR(sink.allocate(read_sink_bytes(host_info().gpus[0].sm_count), "the read stream"));
  ASSIGN_OR_RETURN(const WeightsRead r, weights_read_us(sc, b, o, sink.get(), stream));
  const double w_bytes = static_cast<double>(sc.n * sc.k);
  std::printf(
      "%-22s weights read alone (fastest plain read, %d rotated copies) %9.1f us %6.2f TB/s "
      "|%s\n",
      shape_name(sc).c_str(), b.copies, r.us, w_bytes / (r.us * 1e-6) / 1e12, r.forms.c_str());
  std::fflush(stdout);
  return r.us;
}

// Each weight copy's TMA descriptor (stream_s8_weights_map): boxes of `rows` rows x 128 bytes, or
// with chunks > 1 that many of them side by side along K as one 3-D box.
absl::StatusOr<std::vector<StreamTmaMap>> weight_maps(const ShapeCase& sc, const ShapeBuffers& b,
                                                      int rows, int chunks = 1) {
  std::vector<StreamTmaMap> maps(b.copies);
  for (int s = 0; s < b.copies; ++s) {
    RETURN_IF_CUDA_ERROR(
        stream_s8_weights_map(b.w[s].as<int8_t>(), sc.n, sc.k, &maps[s], rows, chunks));
  }
  return maps;
}

// --reads: per shape the weights read alone in every form, and what the timing harness itself
// costs (an empty launch, timed the same way).
absl::Status compare_reads(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                           cudaStream_t stream) {
  ASSIGN_OR_RETURN(const double empty_us, median_us(stream, 1, o, [&](int) -> absl::Status {
                     RETURN_IF_CUDA_ERROR(launch_empty(stream));
                     return absl::OkStatus();
                   }));
  std::printf("%-22s empty launch %.1f us\n", shape_name(sc).c_str(), empty_us);
  RETURN_IF_ERROR(print_weights_read(sc, b, o, stream).status());
  // The same bytes in the order of cuda.cutlass_sm90's swapped 64-channel tiles (TMA boxes, tile
  // after tile, K fastest), each tile's k-loop starting at k-tile 0 or rotated by r k-tiles per
  // tile ("rot r"); with the tiles past the last whole wave cut into s slices of K ("tail s"),
  // and with every block reading an equal share of all the k-tiles ("even", also with 6 and 4
  // k-tiles in flight per SM instead of 10: "even6", "even4"); rot0 and even in boxes of 32 rows
  // (20 k-tiles of 8 KB in flight) and of 128 rows (5 of 32 KB): "rot0-R32", "even-R32",
  // "rot0-R128", "even-R128"; the whole waves and
  // the tail cut into 2 slices as two launches ("2L tail2"), in turns; and in cuda.stream_s8's
  // order with plain loads (R64 D3).
  const int sms = host_info().gpus[0].sm_count;
  DeviceBuffer sink;
  RETURN_IF_ERROR(sink.allocate(read_sink_bytes(sms), "the read stream"));
  // The weights' descriptors per copy, in boxes of 64, 32 and 128 rows.
  constexpr int kBoxRows[] = {64, 32, 128};
  std::vector<StreamTmaMap> maps[std::size(kBoxRows)];
  for (size_t r = 0; r < std::size(kBoxRows); ++r) {
    ASSIGN_OR_RETURN(maps[r], weight_maps(sc, b, kBoxRows[r]));
  }
  struct TileOrder {
    const char* name;
    int rotation, split, stages;
    int box = 0;  // index into kBoxRows
  };
  constexpr TileOrder kOrders[] = {{"rot0", 0, 0, 10},
                                   {"rot1", 1, 0, 10},
                                   {"tail2", 0, 2, 10},
                                   {"tail8", 0, 8, 10},
                                   {"even", 0, kReadEvenSplit, 10},
                                   {"even6", 0, kReadEvenSplit, 6},
                                   {"even4", 0, kReadEvenSplit, 4},
                                   {"rot0-R32", 0, 0, 20, 1},
                                   {"even-R32", 0, kReadEvenSplit, 20, 1},
                                   {"rot0-R128", 0, 0, 5, 2},
                                   {"even-R128", 0, kReadEvenSplit, 5, 2}};
  std::vector<std::function<absl::Status(int)>> cands;
  for (const TileOrder& t : kOrders) {
    cands.push_back([&, t](int s) -> absl::Status {
      RETURN_IF_CUDA_ERROR(launch_read_tiles(maps[t.box][s], sc.n, sc.k, t.rotation, t.split, sms,
                                             sink.get(), stream, 0, t.stages, kBoxRows[t.box]));
      return absl::OkStatus();
    });
  }
  const int64_t whole_tiles = (sc.n + 63) / 64 / sms * sms;
  cands.push_back([&](int s) -> absl::Status {
    if (whole_tiles > 0) {
      RETURN_IF_CUDA_ERROR(
          launch_read_tiles(maps[0][s], whole_tiles * 64, sc.k, 0, 0, sms, sink.get(), stream));
    }
    RETURN_IF_CUDA_ERROR(
        launch_read_tiles(maps[0][s], sc.n, sc.k, 0, 2, sms, sink.get(), stream, whole_tiles));
    return absl::OkStatus();
  });
  cands.push_back([&](int s) -> absl::Status {
    RETURN_IF_CUDA_ERROR(
        launch_read_rows(b.w[s].get(), sc.n, sc.k, 64, 3, sms, sink.get(), stream));
    return absl::OkStatus();
  });
  const double w_bytes = static_cast<double>(sc.n * sc.k);
  for (int round = 0; round < 3; ++round) {
    ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, b.copies, o, cands));
    std::string line = absl::StrFormat("%-22s tile-order reads, round %d |", shape_name(sc), round);
    for (size_t c = 0; c < std::size(kOrders); ++c) {
      absl::StrAppendFormat(&line, " %s %.1f %.2f", kOrders[c].name, us[c],
                            w_bytes / (us[c] * 1e-6) / 1e12);
    }
    absl::StrAppendFormat(&line, " 2L tail2 %.1f", us[std::size(kOrders)]);
    absl::StrAppendFormat(&line, " | R64 D3 %.1f us", us.back());
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// --sm_rate: how fast one SM streams weights by itself, as against all of them at once: the first
// g x rows rows of the shape's weights read by g CTAs (g = 4, 16, 64 and every SM), each one tile
// of `rows` rows x K, in turns over two rounds. In 2-D TMA boxes of 128 bytes, two per k-tile (64
// rows, 10, 6 or 4 k-tiles of 256 bytes in flight: "tma64x10" ...; 32 rows with 20, 128 rows with
// 5: the same 160 KB in flight); as contiguous bulk copies into shared memory (one thread per CTA,
// six of 32 KB or eight of 16 KB in flight: "bulk32Kx6", "bulk16Kx8", launch_read_form); in one
// 3-D load per 64-row k-tile of 256 or 512 bytes (160 KB in flight: "tma3d-256B", "tma3d-512B");
// and by cuda.cutlass_sm90's swapped tiles, the GEMM alone at M = 1 on g CTAs of one tile each
// ("gemm16x64x256" ...). Each form prints its time,
// what one CTA streamed per second (its bytes over the time less the empty launch's) and all of
// them together. Only shapes of at least 128 rows per SM.
[[maybe_unused]] absl::Status quantize_x(const ShapeCase& sc, ShapeBuffers& b, int64_t m,
                                         int8_t* xq, cudaStream_t stream, bool split = true);
#if QLINEAR_HAVE_CUTLASS
CutlassSm90Args tile_args(const ShapeCase& sc, const ShapeBuffers& b, int64_t m);
CutlassSm90Args served_swap_args(const ShapeCase& sc, ShapeBuffers& b, int64_t m, int s,
                                 bool alone);

// A tile's GEMM alone at M = 1 on weight copy s with one tile of `rows` channels per CTA: the
// shape's first ctas x rows channels on `ctas` CTAs, K = k (0: the shape's), the weights
// evict-first (--sm_rate, --fixed_cost).
CutlassSm90Args one_tile_per_cta_args(const ShapeCase& sc, const ShapeBuffers& b, int s, int ctas,
                                      int rows = 64, int64_t k = 0) {
  CutlassSm90Args a = tile_args(sc, b, 1);
  a.w = b.w[s].as<int8_t>();
  a.n = int64_t{ctas} * rows;
  if (k > 0) a.k = k;
  a.sm_count = ctas;
  a.weights_evict_first = true;
  return a;
}
#endif
absl::Status compare_sm_rate(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                             cudaStream_t stream) {
  const int sms = host_info().gpus[0].sm_count;
  if (sc.n < int64_t{128} * sms) return absl::OkStatus();
  ASSIGN_OR_RETURN(const double empty_us, median_us(stream, 1, o, [&](int) -> absl::Status {
                     RETURN_IF_CUDA_ERROR(launch_empty(stream));
                     return absl::OkStatus();
                   }));
  DeviceBuffer sink;
  RETURN_IF_ERROR(sink.allocate(read_sink_bytes(sms), "the read stream"));
  constexpr int kBoxRows[] = {64, 32, 128};
  std::vector<StreamTmaMap> maps[std::size(kBoxRows)];
  for (size_t r = 0; r < std::size(kBoxRows); ++r) {
    ASSIGN_OR_RETURN(maps[r], weight_maps(sc, b, kBoxRows[r]));
  }
  // The same 64-row k-tiles as one 3-D load each: 256 or 512 bytes of K.
  std::vector<StreamTmaMap> maps3d[2];
  for (int c = 0; c < 2; ++c) {
    ASSIGN_OR_RETURN(maps3d[c], weight_maps(sc, b, 64, c == 0 ? 2 : 4));
  }
  struct Form {
    const char* name;
    int box;     // index into kBoxRows; -1: bulk copies; -2: 3-D loads; -3: a swapped tile's GEMM
    int stages;  // TMA: k-tiles in flight; bulk: launch_read_form's form; 3-D: chunks; GEMM: tile
  };
  constexpr Form kForms[] = {
      {"tma64x10", 0, 10},
      {"tma64x6", 0, 6},
      {"tma64x4", 0, 4},
      {"tma32x20", 1, 20},
      {"tma128x5", 2, 5},
      {"bulk32Kx6", -1, 3},
      {"bulk16Kx8", -1, 4},
      {"tma3d-256B", -2, 2},
      {"tma3d-512B", -2, 4},
      {"gemm16x64x256", -3, static_cast<int>(CutlassSm90Tile::k16x64x256PingpongSwap)},
      {"gemm16x64x512", -3, static_cast<int>(CutlassSm90Tile::k16x64x512PingpongSwap)},
      {"gemm16x128x256", -3, static_cast<int>(CutlassSm90Tile::k16x128x256PingpongSwap)}};
  for (const int g : {4, 16, 64, sms}) {
    std::vector<std::function<absl::Status(int)>> cands;
    std::vector<int64_t> cta_bytes;
    for (const Form& f : kForms) {
      const int rows =
          f.box >= 0 ? kBoxRows[f.box]
          : f.box == -3 && f.stages == static_cast<int>(CutlassSm90Tile::k16x128x256PingpongSwap)
              ? 128
              : 64;
      cta_bytes.push_back(int64_t{rows} * sc.k);
      cands.push_back([&, f, rows, g](int s) -> absl::Status {
        if (f.box == -3) {
#if QLINEAR_HAVE_CUTLASS
          // The swapped tile's GEMM alone at M = 1 on the first g x rows channels, g CTAs.
          const cutlass_sm90::TileOps* ops =
              cutlass_sm90::tile_ops(static_cast<CutlassSm90Tile>(f.stages), ElemType::kBF16);
          const CutlassSm90Args a = one_tile_per_cta_args(sc, b, s, g, rows);
          if (!ops->can_implement(a)) return absl::UnimplementedError("tile declines the shape");
          RETURN_IF_CUDA_ERROR(ops->launch(a, nullptr, stream));
#endif
        } else if (f.box == -2) {
          RETURN_IF_CUDA_ERROR(launch_read_tiles_3d(maps3d[f.stages == 2 ? 0 : 1][s], sc.k,
                                                    f.stages, g, sink.get(), stream));
        } else if (f.box == -1) {
          RETURN_IF_CUDA_ERROR(launch_read_form(
              f.stages, b.w[s].get(), static_cast<size_t>(g) * rows * sc.k, g, sink.get(), stream));
        } else {
          RETURN_IF_CUDA_ERROR(launch_read_tiles(maps[f.box][s], int64_t{g} * rows, sc.k, 0, 0, g,
                                                 sink.get(), stream, 0, f.stages, rows));
        }
        return absl::OkStatus();
      });
    }
    for (int round = 0; round < 2; ++round) {
      ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, b.copies, o, cands));
      std::string line =
          absl::StrFormat("sm-rate %-22s %3d CTAs, round %d (empty launch %.1f us) |",
                          shape_name(sc), g, round, empty_us);
      for (size_t f = 0; f < std::size(kForms); ++f) {
        const double per_cta = static_cast<double>(cta_bytes[f]) / ((us[f] - empty_us) * 1e3);
        absl::StrAppendFormat(&line, " %s %.1f us %.0f GB/s/CTA %.2f TB/s |", kForms[f].name, us[f],
                              per_cta, per_cta * g / 1e3);
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
#if QLINEAR_HAVE_CUTLASS
    // Where the swapped 16 x 64 x 256 tile's time goes: its CTAs' stamps (kCutlassTracePoints),
    // medians over traced launches of each CTA's time from the first CTA's producer start.
    {
      const cutlass_sm90::TileOps* ops =
          cutlass_sm90::tile_ops(CutlassSm90Tile::k16x64x256PingpongSwap, ElemType::kBF16);
      const int launches = 4 * b.copies + 4;
      const size_t per_launch = static_cast<size_t>(sms) * kCutlassTracePoints;
      DeviceBuffer trace;
      RETURN_IF_ERROR(trace.allocate(launches * per_launch * sizeof(uint64_t), "trace"));
      RETURN_IF_CUDA_ERROR(cudaMemsetAsync(trace.get(), 0, trace.size(), stream));
      for (int i = 0; i < launches; ++i) {
        CutlassSm90Args a = one_tile_per_cta_args(sc, b, i % b.copies, g);
        a.trace = trace.as<uint64_t>() + i * per_launch;
        RETURN_IF_CUDA_ERROR(ops->launch(a, nullptr, stream));
      }
      ASSIGN_OR_RETURN(const std::vector<uint64_t> t, trace_to_host(trace, stream));
      // Per launch: the start spread, consumers' first multiplies, last loads issued, multiplies
      // done (median and last CTA), us from the first producer start.
      std::vector<double> first_start, spread, consume, loads_med, loads_max, done_med, done_max;
      for (int i = launches / 4; i < launches; ++i) {
        const uint64_t* ti = t.data() + i * per_launch;
        uint64_t t0 = UINT64_MAX;
        for (int c = 0; c < g; ++c) t0 = std::min(t0, ti[c * kCutlassTracePoints]);
        uint64_t born = UINT64_MAX;
        for (int c = 0; c < g; ++c) born = std::min(born, ti[c * kCutlassTracePoints + 6]);
        first_start.push_back((static_cast<double>(t0) - static_cast<double>(born)) * 1e-3);
        std::vector<double> st, co, lo, dn;
        for (int c = 0; c < g; ++c) {
          const uint64_t* p = ti + c * kCutlassTracePoints;
          auto us = [&](uint64_t v) { return (static_cast<double>(v) - t0) * 1e-3; };
          st.push_back(us(p[0]));
          co.push_back(us(p[4]));
          lo.push_back(us(p[2]));
          dn.push_back(us(p[5]));
        }
        spread.push_back(*std::max_element(st.begin(), st.end()));
        consume.push_back(median(co));
        loads_med.push_back(median(lo));
        loads_max.push_back(*std::max_element(lo.begin(), lo.end()));
        done_med.push_back(median(dn));
        done_max.push_back(*std::max_element(dn.begin(), dn.end()));
      }
      std::printf(
          "sm-rate-trace %-22s %3d CTAs gemm16x64x256 | first CTA start to first producer start "
          "%.1f us | us from the first producer start: last start %.1f, consumers' first multiply "
          "%.1f, last loads issued %.1f / %.1f, multiplies done %.1f / %.1f (median / last "
          "CTA)\n",
          shape_name(sc).c_str(), g, median(first_start), median(spread), median(consume),
          median(loads_med), median(loads_max), median(done_med), median(done_max));
      std::fflush(stdout);
    }
#endif
  }
  return absl::OkStatus();
}

// --fixed_cost: what a launch of the swapped 16 x 64 x 256 tile costs besides streaming its
// weights. On 64 CTAs (a 4096 x 4096 layer's tiles) in turns: an empty launch of one block
// ("empty"), 64 empty blocks of 384 threads holding 227 KB of shared memory each as the tile's
// CTAs do ("empty-wide"), and at K = 256, 1024 and the shape's K the tile's GEMM alone at M = 1
// ("gemm"), the same GEMM by tile 14 (the stream-K kernel dealing whole tiles: no tile scheduler,
// its epilogue from registers; "whole") and the 3-D read of the same 64-row tiles ("read",
// launch_read_tiles_3d). A GEMM's excess over the read at K = 256 (one k-tile) is its fixed cost.
// On 4096 x 4096, each launch's timeline (below). Then, on the first shape only,
// how fast an SM runs machine code not yet in its instruction caches (launch_cold_code): 16 and 64
// KB of straight-line code run twice per block, SM cycles of each pass (median over 64 blocks),
// in a launch that follows another kernel and in the launch right after one of its own.
absl::Status compare_fixed_cost(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                                cudaStream_t stream) {
#if QLINEAR_HAVE_CUTLASS
  constexpr int kCtas = 64;
  if (sc.n < 64 * kCtas) return absl::OkStatus();
  DeviceBuffer sink;
  RETURN_IF_ERROR(sink.allocate(read_sink_bytes(kCtas), "the read stream"));
  ASSIGN_OR_RETURN(const std::vector<StreamTmaMap> maps, weight_maps(sc, b, 64, 2));
  const cutlass_sm90::TileOps* ops =
      cutlass_sm90::tile_ops(CutlassSm90Tile::k16x64x256PingpongSwap, ElemType::kBF16);
  const cutlass_sm90::TileOps* whole =
      cutlass_sm90::tile_ops(CutlassSm90Tile::k16x64x256WholeSwap, ElemType::kBF16);
  RETURN_IF_CUDA_ERROR(whole->prepare());
  std::vector<std::string> names = {"empty", "empty-wide"};
  std::vector<std::function<absl::Status(int)>> cands = {
      [&](int) -> absl::Status {
        RETURN_IF_CUDA_ERROR(launch_empty(stream));
        return absl::OkStatus();
      },
      [&](int) -> absl::Status {
        RETURN_IF_CUDA_ERROR(launch_empty_wide(kCtas, stream));
        return absl::OkStatus();
      }};
  for (const int64_t k : {int64_t{256}, int64_t{1024}, sc.k}) {
    // The CUTLASS tile's GEMM ("gemm") and tile 14's ("whole").
    const std::pair<const char*, const cutlass_sm90::TileOps*> gemms[] = {{"gemm", ops},
                                                                          {"whole", whole}};
    for (const auto& [label, tile] : gemms) {
      names.push_back(absl::StrFormat("%s K=%lld", label, static_cast<long long>(k)));
      cands.push_back([&, k, t = tile](int s) -> absl::Status {
        const CutlassSm90Args a = one_tile_per_cta_args(sc, b, s, kCtas, 64, k);
        if (!t->can_implement(a)) return absl::UnimplementedError("tile declines the shape");
        RETURN_IF_CUDA_ERROR(t->launch(a, nullptr, stream));
        return absl::OkStatus();
      });
    }
    names.push_back(absl::StrFormat("read K=%lld", static_cast<long long>(k)));
    cands.push_back([&, k](int s) -> absl::Status {
      RETURN_IF_CUDA_ERROR(launch_read_tiles_3d(maps[s], k, 2, kCtas, sink.get(), stream));
      return absl::OkStatus();
    });
  }
  for (int round = 0; round < 2; ++round) {
    ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, b.copies, o, cands));
    std::string line =
        absl::StrFormat("fixed-cost %-22s %d CTAs, round %d |", shape_name(sc), kCtas, round);
    for (size_t f = 0; f < us.size(); ++f) {
      absl::StrAppendFormat(&line, " %s %.1f us |", names[f], us[f]);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  // The timeline of one launch between two stamp kernels (a graph of three), over 100 launches
  // (the mean of the middle 80%, as %globaltimer moves in steps of a quarter microsecond): us from
  // the first stamp to the CTAs' first start, to the first producer's start (the tile's set-up),
  // past the grid dependency, to its consumers' first multiply (median CTA), to their last
  // multiplies' end (last CTA), and from then to the second stamp (the epilogue, the exit and the
  // next launch); and the set-up in SM cycles (median CTA), from the CTA's start to the mainloop's
  // set-up (its pipelines' barriers made), to its producer's start and to its consumers' first
  // multiply. On 4096 x 4096 only: the GEMM alone on its 64 tiles, with and without its epilogue
  // values (null pointers: the epilogue reads none; a wrong result, timed only), and the op at
  // M = 1 as served, the same two ways; then tile 14's GEMM at K = 256 and the shape's K, and its
  // op at M = 1 with no weights ahead of the wait, with 4 stages, with 4 stages and 64 KB of L2
  // prefetch, and with every stage and 64 KB. (Prefetching the values into L2 or L1 or loading
  // them early in the producer, commit 444fd4f, did not move the launch's end: docs/kernels.md.)
  if (sc.n == 4096 && sc.k == 4096) {
    constexpr int kTimed = 100;
    static_assert(kStreamKTracePoints <= kCutlassTracePoints);
    const size_t per_launch = static_cast<size_t>(kCtas) * kCutlassTracePoints;
    DeviceBuffer trace, marks;
    RETURN_IF_ERROR(trace.allocate(kTimed * per_launch * sizeof(uint64_t), "trace"));
    RETURN_IF_ERROR(marks.allocate(kTimed * 2 * sizeof(uint64_t), "stamps"));
    struct Variant {
      std::string name;
      // 0: empty-wide; 1: the 3-D read; 2: the GEMM; 3: the op at M = 1 as served (the quantize
      // kernel, then the GEMM as its programmatic dependent); 4 and 5: the same two with tile 14
      // (whole tiles of the stream-K kernel), its op with `ahead` stages of weights ahead of the
      // wait (0: every stage, -1: none) and `prefetch_kb` more prefetched into L2 before it.
      int kind;
      int64_t k;
      bool values = true;  // false: none (null pointers)
      int ahead = 4;
      int prefetch_kb = 64;
    };
    const std::string kk = absl::StrFormat("K=%lld", static_cast<long long>(sc.k));
    const std::vector<Variant> variants = {
        {"empty-wide", 0, 0},
        {"read K=256", 1, 256},
        {absl::StrFormat("read K=%lld", static_cast<long long>(sc.k)), 1, sc.k},
        {"gemm K=256", 2, 256},
        {"gemm K=256, no epilogue values", 2, 256, false},
        {"gemm " + kk, 2, sc.k},
        {"gemm " + kk + ", no epilogue values", 2, sc.k, false},
        {"op M=1 as served", 3, sc.k},
        {"op M=1, no epilogue values", 3, sc.k, false},
        {"tile14 gemm K=256", 4, 256},
        {"tile14 gemm " + kk, 4, sc.k},
        {"tile14 op M=1 a0", 5, sc.k, true, -1, 0},
        {"tile14 op M=1 a4", 5, sc.k, true, 4, 0},
        {"tile14 op M=1 a4pf64", 5, sc.k},
        {"tile14 op M=1 a10pf64", 5, sc.k, true, 0}};
    const bool split = cutlass_sm90::split_quantize_rows(1, sc.k, host_info().gpus[0].sm_count);
    for (const Variant& v : variants) {
      RETURN_IF_CUDA_ERROR(cudaMemsetAsync(trace.get(), 0, trace.size(), stream));
      for (int i = 0; i < kTimed; ++i) {
        const int s = i % b.copies;
        uint64_t* mark = marks.as<uint64_t>() + 2 * i;
        ASSIGN_OR_RETURN(
            cudaGraphExec_t g, capture_graph(stream, [&]() -> absl::Status {
              RETURN_IF_CUDA_ERROR(launch_stamp(mark, stream));
              if (v.kind == 0) {
                RETURN_IF_CUDA_ERROR(launch_empty_wide(kCtas, stream));
              } else if (v.kind == 1) {
                RETURN_IF_CUDA_ERROR(
                    launch_read_tiles_3d(maps[s], v.k, 2, kCtas, sink.get(), stream));
              } else {
                const bool op = v.kind == 3 || v.kind == 5;
                if (op) RETURN_IF_ERROR(quantize_x(sc, b, 1, b.xq.as<int8_t>(), stream, split));
                CutlassSm90Args a = op ? served_swap_args(sc, b, 1, s, false)
                                       : one_tile_per_cta_args(sc, b, s, kCtas, 64, v.k);
                if (v.kind == 5) {
                  a.weights_ahead = v.ahead >= 0;
                  a.weights_ahead_stages = v.ahead;
                  a.weight_prefetch_bytes = int64_t{v.prefetch_kb} << 10;
                }
                a.trace = trace.as<uint64_t>() + i * per_launch;
                if (!v.values) {
                  a.sa = nullptr;
                  a.azp = nullptr;
                  a.sb = nullptr;
                  a.adj = nullptr;
                  a.bias_v = nullptr;
                }
                RETURN_IF_CUDA_ERROR((v.kind >= 4 ? whole : ops)->launch(a, nullptr, stream));
              }
              RETURN_IF_CUDA_ERROR(launch_stamp(mark + 1, stream));
              return absl::OkStatus();
            }));
        const cudaError_t e = cudaGraphLaunch(g, stream);
        cudaGraphExecDestroy(g);
        RETURN_IF_CUDA_ERROR(e);
      }
      ASSIGN_OR_RETURN(const std::vector<uint64_t> t, trace_to_host(trace, stream));
      std::vector<uint64_t> m(kTimed * 2);
      RETURN_IF_CUDA_ERROR(
          cudaMemcpy(m.data(), marks.get(), m.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
      std::vector<double> total, start, setup, waited, first_mma, mma_end, tail, c_init, c_prod,
          c_cons;
      // Tile 14 (kStreamKTracePoints): from the first CTA's start, past the grid dependency
      // (first CTA; its producer's start in stream order), the first k-tile's arrival (median CTA),
      // the last multiplies' end and the last epilogue's end (last CTA), then to the stamp.
      std::vector<double> w_dep, w_first, w_mma, w_epi, w_tail;
      for (int i = kTimed / 4; i < kTimed; ++i) {
        const double a = static_cast<double>(m[2 * i]), z = static_cast<double>(m[2 * i + 1]);
        total.push_back((z - a) * 1e-3);
        if (v.kind < 2) continue;
        if (v.kind >= 4) {
          const uint64_t* ti = t.data() + i * per_launch;
          uint64_t born = UINT64_MAX, dep = UINT64_MAX, mma = 0, epi = 0;
          std::vector<double> first;
          for (int c = 0; c < kCtas; ++c) {
            const uint64_t* p = ti + c * kStreamKTracePoints;
            born = std::min(born, p[0]);
            dep = std::min(dep, p[1]);
            mma = std::max(mma, p[4]);
            epi = std::max(epi, p[5]);
            first.push_back(static_cast<double>(p[3]));
          }
          const double b0 = static_cast<double>(born);
          start.push_back((b0 - a) * 1e-3);
          w_dep.push_back((static_cast<double>(dep) - b0) * 1e-3);
          w_first.push_back((median(first) - b0) * 1e-3);
          w_mma.push_back((static_cast<double>(mma) - b0) * 1e-3);
          w_epi.push_back((static_cast<double>(epi) - static_cast<double>(mma)) * 1e-3);
          w_tail.push_back((z - static_cast<double>(epi)) * 1e-3);
          continue;
        }
        const uint64_t* ti = t.data() + i * per_launch;
        uint64_t born = UINT64_MAX, t0 = UINT64_MAX, t1 = UINT64_MAX, done = 0;
        std::vector<double> co, ci, cp, cc;
        for (int c = 0; c < kCtas; ++c) {
          const uint64_t* p = ti + c * kCutlassTracePoints;
          ci.push_back(static_cast<double>(p[8]) - static_cast<double>(p[7]));
          cp.push_back(static_cast<double>(p[9]) - static_cast<double>(p[7]));
          cc.push_back(static_cast<double>(p[10]) - static_cast<double>(p[7]));
          born = std::min(born, p[6]);
          t0 = std::min(t0, p[0]);
          t1 = std::min(t1, p[1]);
          done = std::max(done, p[5]);
          co.push_back(static_cast<double>(p[4]));
        }
        start.push_back((static_cast<double>(born) - a) * 1e-3);
        setup.push_back((static_cast<double>(t0) - static_cast<double>(born)) * 1e-3);
        waited.push_back((static_cast<double>(t1) - static_cast<double>(t0)) * 1e-3);
        first_mma.push_back((median(co) - static_cast<double>(t0)) * 1e-3);
        mma_end.push_back((static_cast<double>(done) - median(co)) * 1e-3);
        tail.push_back((z - static_cast<double>(done)) * 1e-3);
        c_init.push_back(median(ci));
        c_prod.push_back(median(cp));
        c_cons.push_back(median(cc));
      }
      std::string line = absl::StrFormat("fixed-cost-timeline %-22s %-34s | stamp to stamp %.2f us",
                                         shape_name(sc), v.name, trimmed_mean(total));
      if (v.kind >= 4) {
        absl::StrAppendFormat(
            &line,
            " | to CTA start %.2f, then us: past the grid dependency %.2f, first "
            "k-tile %.2f, last multiplies done %.2f, then the epilogue %.2f, then "
            "to the stamp %.2f",
            trimmed_mean(start), trimmed_mean(w_dep), trimmed_mean(w_first), trimmed_mean(w_mma),
            trimmed_mean(w_epi), trimmed_mean(w_tail));
      } else if (v.kind >= 2) {
        absl::StrAppendFormat(
            &line,
            " | to CTA start %.2f, set-up %.2f (past the grid dependency %.2f later), to first "
            "multiply %.2f, to last multiply's end %.2f, then to the stamp %.2f | set-up cycles: "
            "to the mainloop's set-up %.0f, to the producer %.0f, to the consumers %.0f",
            trimmed_mean(start), trimmed_mean(setup), trimmed_mean(waited), trimmed_mean(first_mma),
            trimmed_mean(mma_end), trimmed_mean(tail), trimmed_mean(c_init), trimmed_mean(c_prod),
            trimmed_mean(c_cons));
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }
  static bool cold_done = false;
  if (cold_done) return absl::OkStatus();
  cold_done = true;
  constexpr int kLaunches = 8;
  DeviceBuffer out;
  RETURN_IF_ERROR(out.allocate(kLaunches * kCtas * 2 * sizeof(uint64_t), "cold-code stamps"));
  for (const int kb : {16, 64}) {
    // Another kernel first, then kLaunches of this one back to back.
    RETURN_IF_CUDA_ERROR(launch_read_tiles_3d(maps[0], 1024, 2, kCtas, sink.get(), stream));
    for (int i = 0; i < kLaunches; ++i) {
      RETURN_IF_CUDA_ERROR(launch_cold_code(kb, kCtas, out.as<uint64_t>() + i * kCtas * 2, stream));
    }
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
    std::vector<uint64_t> t(kLaunches * kCtas * 2);
    RETURN_IF_CUDA_ERROR(
        cudaMemcpy(t.data(), out.get(), t.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    auto pass = [&](int launch, int p) {
      std::vector<double> v;
      for (int c = 0; c < kCtas; ++c)
        v.push_back(static_cast<double>(t[(launch * kCtas + c) * 2 + p]));
      return median(v);
    };
    std::vector<double> later0, later1;
    for (int i = 1; i < kLaunches; ++i) {
      later0.push_back(pass(i, 0));
      later1.push_back(pass(i, 1));
    }
    std::printf(
        "cold-code %2d KB of straight-line code, %d blocks of 128 threads | SM cycles, first / "
        "second pass: after another kernel %.0f / %.0f | after itself %.0f / %.0f (median of %d "
        "launches)\n",
        kb, kCtas, pass(0, 0), pass(0, 1), median(later0), median(later1), kLaunches - 1);
    std::fflush(stdout);
  }
#else
  (void)sc, (void)b, (void)o, (void)stream;
#endif
  return absl::OkStatus();
}

// --diagnose: where cuda.gemv_s8's time goes at M = 1 and 16. Next to the op's time it prints
// what the harness itself costs (an empty launch), how fast the weights alone can be read (an SM
// read stream over the same rotated copies), the bare cuBLASLt GEMM, and the phases of the tuned
// plan from the kernel's own %globaltimer stamps (medians over traced launches): the spread of
// block start times, per-block statistics / cluster merge / quantization time, when the last
// tile's weights were multiplied and when the last block exited, relative to the first start.
absl::Status diagnose_gemv(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                           cudaStream_t stream, cublasLtHandle_t lt) {
  const int sms = host_info().gpus[0].sm_count;
  DeviceBuffer sink;
  RETURN_IF_ERROR(sink.allocate(read_sink_bytes(sms), "the read stream"));
  ASSIGN_OR_RETURN(const double empty_us, median_us(stream, 1, o, [&](int) -> absl::Status {
                     RETURN_IF_CUDA_ERROR(launch_empty(stream));
                     return absl::OkStatus();
                   }));
  const size_t w_bytes = static_cast<size_t>(sc.n * sc.k);
  ASSIGN_OR_RETURN(const WeightsRead weights_read, weights_read_us(sc, b, o, sink.get(), stream));
  const double read_us = weights_read.us;
  // The same bytes read in cuda.stream_s8's order (units of R rows, one range per SM, D units of
  // 32 KB in flight): what the order itself costs against the read stream above; and in units of
  // 64 rows dealt out in turn ("I64", block b reading units b, b + SMs, ...), which tells the
  // contiguous ranges' cost from the units' own.
  {
    std::string line;
    for (int rows : {64, 16, -64}) {
      for (int depth : {2, 3, 4}) {
        const bool interleaved = rows < 0;
        ASSIGN_OR_RETURN(
            const double us, median_us(stream, b.copies, o, [&](int s) -> absl::Status {
              RETURN_IF_CUDA_ERROR(launch_read_rows(b.w[s].get(), sc.n, sc.k,
                                                    interleaved ? -rows : rows, depth, sms,
                                                    sink.get(), stream, interleaved));
              return absl::OkStatus();
            }));
        line +=
            absl::StrFormat(" | %s%d D%d %5.1f %4.2f", interleaved ? "I" : "R",
                            interleaved ? -rows : rows, depth, us, w_bytes / (us * 1e-6) / 1e12);
      }
    }
    std::printf("diagnose-read %-22s read %5.1f us %4.2f TB/s%s\n", shape_name(sc).c_str(), read_us,
                w_bytes / (read_us * 1e-6) / 1e12, line.c_str());
    std::fflush(stdout);
  }
  for (int64_t m : {int64_t{1}, int64_t{16}}) {
    const int m_pad = gemv_m_pad(m);
    if (!gemv_s8_fits(sc.k, m_pad)) continue;
    BareGemm bare;
    RETURN_IF_ERROR(bare.init(lt, m, sc.n, sc.k));
    ASSIGN_OR_RETURN(const double gemm_us, median_us(stream, b.copies, o, [&](int s) {
                       return bare.enqueue(b.w[s].as<int8_t>(), b.xq.as<int8_t>(),
                                           b.acc.as<int32_t>(), b.workspace.get(), stream);
                     }));
    const GemvS8Args a = gemv_args(sc, b, m);
    ASSIGN_OR_RETURN(const GemvS8Plan plan, prepare_gemv_plan(a, b, stream));
    ASSIGN_OR_RETURN(const double op_us, time_gemv_plan(a, plan, b, o, stream));
    // Traced launches, back to back over the rotated copies as in the timing above.
    const int blocks = plan.clusters * plan.split_k;
    const int launches = 4 * b.copies;
    DeviceBuffer trace;
    RETURN_IF_ERROR(trace.allocate(
        static_cast<size_t>(launches) * blocks * kGemvTracePoints * sizeof(uint64_t), "trace"));
    for (int i = 0; i < launches; ++i) {
      GemvS8Args as = a;
      as.w = b.w[i % b.copies].as<int8_t>();
      as.trace = trace.as<uint64_t>() + static_cast<size_t>(i) * blocks * kGemvTracePoints;
      RETURN_IF_CUDA_ERROR(launch_gemv_s8(as, plan, stream));
    }
    ASSIGN_OR_RETURN(const std::vector<uint64_t> t, trace_to_host(trace, stream));
    // Per launch: start spread, median block phases, last multiply and last exit (us).
    std::vector<double> spread, stats, merge, quant, mult_end, exit_end;
    for (int i = launches / 4; i < launches; ++i) {  // the first round warms up
      const uint64_t* ti = t.data() + static_cast<size_t>(i) * blocks * kGemvTracePoints;
      uint64_t t0 = UINT64_MAX, t0_max = 0, t4 = 0, t5 = 0;
      std::vector<double> s1, s2, s3;
      for (int blk = 0; blk < blocks; ++blk) {
        const uint64_t* p = ti + blk * kGemvTracePoints;
        t0 = std::min(t0, p[0]);
        t0_max = std::max(t0_max, p[0]);
        t4 = std::max(t4, p[4]);
        t5 = std::max(t5, p[5]);
        s1.push_back((p[1] - p[0]) * 1e-3);
        s2.push_back((p[2] - p[1]) * 1e-3);
        s3.push_back((p[3] - p[2]) * 1e-3);
      }
      spread.push_back((t0_max - t0) * 1e-3);
      stats.push_back(median(s1));
      merge.push_back(median(s2));
      quant.push_back(median(s3));
      mult_end.push_back((t4 - t0) * 1e-3);
      exit_end.push_back((t5 - t0) * 1e-3);
    }
    const double span = median(exit_end);
    std::printf(
        "diagnose %-22s M=%-3lld empty %5.1f us | read %6.1f us %5.2f TB/s | bare-gemm %6.1f us "
        "| gemv %-10s %6.1f us %5.2f TB/s: start spread %4.1f, stats %4.1f, merge %4.1f, "
        "quant %4.1f, multiplied %6.1f, exit %6.1f, outside the kernel %5.1f\n",
        shape_name(sc).c_str(), static_cast<long long>(m), empty_us, read_us,
        w_bytes / (read_us * 1e-6) / 1e12, gemm_us, plan_name(plan).c_str(), op_us,
        w_bytes / (op_us * 1e-6) / 1e12, median(spread), median(stats), median(merge),
        median(quant), median(mult_end), span, op_us - span);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// cuda.stream_s8's launches on a shape's rotated weight copies at M tokens, as the stream modes
// make them, with the buffers a call needs: the quantize kernel first (this kernel as its
// programmatic dependent, or not) or the rows quantized inside the launch (fused).
class StreamS8Calls {
 public:
  // What one call varies (StreamS8Args's fields of the same names).
  struct Knobs {
    bool fuse = false;
    bool pdl = true;
    int stages = 0;
    int prefetch = 0;
    int l2_prefetch = 0;
    uint64_t* trace = nullptr;
    int range_shift = 0;
    void* y = nullptr;  // null: the shape's y
  };

  static absl::StatusOr<std::unique_ptr<StreamS8Calls>> create(const ShapeCase& sc, ShapeBuffers& b,
                                                               int64_t m, cudaStream_t stream) {
    std::unique_ptr<StreamS8Calls> c(new StreamS8Calls(sc, b, m));
    RETURN_IF_CUDA_ERROR(stream_s8_grid(sc.n, sc.k, &c->grid_));
    c->maps_.resize(b.copies);
    for (int s = 0; s < b.copies; ++s) {
      RETURN_IF_CUDA_ERROR(stream_s8_weights_map(b.w[s].as<int8_t>(), sc.n, sc.k, &c->maps_[s]));
    }
    RETURN_IF_ERROR(c->xq_.allocate(stream_xq_bytes(m, sc.k), "blocked xq"));
    RETURN_IF_ERROR(
        c->counters_.allocate(static_cast<size_t>(stream_s8_counters(sc.n)) * 4, "counters"));
    RETURN_IF_ERROR(c->partials_.allocate(stream_s8_partials_bytes(c->grid_, m), "partials"));
    RETURN_IF_ERROR(c->azp_.allocate(static_cast<size_t>(m) * 4, "azp"));
    RETURN_IF_ERROR(c->flags_.allocate(stream_s8_flags_bytes(c->grid_), "flags"));
    RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(c->flags_.get(), 0, stream_s8_flags_bytes(c->grid_), stream));
    return c;
  }

  int grid() const { return grid_; }
  // Whether the layer's calls at this M quantize inside the launch (what the layer runs).
  bool served_fuse() const { return stream_s8_can_fuse(m_, sc_.k, ElemType::kBF16, b_.x.get()); }

  // One call on weight copy s.
  absl::Status enqueue(int s, const Knobs& k, cudaStream_t stream) {
    QuantizeParams qp;
    if (!k.fuse) {
      const XqLayout layout = stream_xq_layout(m_);
      RETURN_IF_CUDA_ERROR(launch_quantize_s8(
          b_.x.get(), ElemType::kBF16, m_, sc_.k, qp, xq_.as<int8_t>(), b_.sa.as<float>(),
          azp_.as<int32_t>(), stream, counters_.as<int32_t>(), stream_s8_counters(sc_.n), &layout));
    }
    StreamS8Args a;
    a.w_map = maps_[s];
    a.xq = xq_.as<int8_t>();
    a.sa = b_.sa.as<float>();
    a.azp = azp_.as<int32_t>();
    a.m = m_;
    a.n = sc_.n;
    a.k = sc_.k;
    a.w = b_.w[s].as<int8_t>();
    a.sb = b_.sb.as<float>();
    a.bias = b_.bias.as<float>();
    a.y = k.y != nullptr ? k.y : b_.y.get();
    a.counters = counters_.as<int32_t>();
    a.partials = partials_.as<int32_t>();
    a.grid = grid_;
    a.pdl = k.pdl && !k.fuse;
    a.stages = k.stages;
    a.prefetch = k.prefetch;
    a.l2_prefetch = k.l2_prefetch;
    a.trace = k.trace;
    a.range_shift = k.range_shift;
    if (k.fuse) {
      a.fuse = true;
      a.x = b_.x.get();
      a.x_type = ElemType::kBF16;
      a.qp = qp;
      a.sa_out = b_.sa.as<float>();
      a.azp_out = azp_.as<int32_t>();
      a.flags = flags_.as<uint64_t>();
      a.token = 0x9e3779b97f4a7c15ull;
    }
    RETURN_IF_CUDA_ERROR(launch_stream_s8(a, stream));
    return absl::OkStatus();
  }

 private:
  StreamS8Calls(const ShapeCase& sc, ShapeBuffers& b, int64_t m) : sc_(sc), b_(b), m_(m) {}
  const ShapeCase& sc_;
  ShapeBuffers& b_;
  const int64_t m_;
  int grid_ = 0;
  std::vector<StreamTmaMap> maps_;
  DeviceBuffer xq_, counters_, partials_, azp_, flags_;
};

// --diagnose, cuda.stream_s8 at M = 1 and 16: the op as served (quantizing inside the kernel
// where it can, "fused"; otherwise the quantize kernel then the GEMM as its programmatic
// dependent), the quantize kernel first (with and without the programmatic launch), the served
// form with other ring depths, and the quantize kernel first with one or no slot filled before
// the grid dependency, next to the phases of the served launch from the kernel's %globaltimer
// stamps (medians over traced launches, us from the first block's start): the spread of block
// starts, when the producers got past the grid dependency (the quantize kernel's end; fused: at
// once), when the first ring slot was full, when the blocks finished (first, median, last, and the
// last four's start and end), and the time outside the kernel.
absl::Status diagnose_stream(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                             cudaStream_t stream) {
  const size_t w_bytes = static_cast<size_t>(sc.n * sc.k);
  for (int64_t m : {int64_t{1}, int64_t{16}}) {
    ASSIGN_OR_RETURN(std::unique_ptr<StreamS8Calls> calls, StreamS8Calls::create(sc, b, m, stream));
    const int grid = calls->grid();
    // What the layer runs: quantizing inside the kernel where it can.
    const bool served_fuse = calls->served_fuse();
    int shift = 0;  // StreamS8Args::range_shift of the traced launches
    auto op = [&](int s, bool pdl, int stages, uint64_t* trace, int prefetch = 0,
                  bool fuse = false) -> absl::Status {
      StreamS8Calls::Knobs k;
      k.fuse = fuse;
      k.pdl = pdl;
      k.stages = stages;
      k.prefetch = prefetch;
      k.trace = trace;
      k.range_shift = trace != nullptr ? shift : 0;
      return calls->enqueue(s, k, stream);
    };
    ASSIGN_OR_RETURN(const double served_us, median_us(stream, b.copies, o, [&](int s) {
                       return op(s, true, 0, nullptr, 0, served_fuse);
                     }));
    ASSIGN_OR_RETURN(const double quant_first_us, median_us(stream, b.copies, o, [&](int s) {
                       return op(s, true, 0, nullptr);
                     }));
    ASSIGN_OR_RETURN(const double no_pdl_us, median_us(stream, b.copies, o, [&](int s) {
                       return op(s, false, 0, nullptr);
                     }));
    ASSIGN_OR_RETURN(const double ring2_us, median_us(stream, b.copies, o, [&](int s) {
                       return op(s, true, 2, nullptr, 0, served_fuse);
                     }));
    ASSIGN_OR_RETURN(const double ring4_us, median_us(stream, b.copies, o, [&](int s) {
                       return op(s, true, 4, nullptr, 0, served_fuse);
                     }));
    ASSIGN_OR_RETURN(const double ring8_us, median_us(stream, b.copies, o, [&](int s) {
                       return op(s, true, 8, nullptr, 0, served_fuse);
                     }));
    ASSIGN_OR_RETURN(const double pre1_us, median_us(stream, b.copies, o, [&](int s) {
                       return op(s, true, 0, nullptr, 1);
                     }));
    ASSIGN_OR_RETURN(const double pre0_us, median_us(stream, b.copies, o, [&](int s) {
                       return op(s, true, 0, nullptr, -1);
                     }));
    const int launches = 4 * b.copies;
    DeviceBuffer trace;
    RETURN_IF_ERROR(trace.allocate(
        static_cast<size_t>(launches) * grid * kStreamTracePoints * sizeof(uint64_t), "trace"));
    // Odd launches take the ranges half the grid away: whether a late block is late for its SM
    // or for its range.
    for (int i = 0; i < launches; ++i) {
      shift = i % 2 == 0 ? 0 : grid / 2;
      RETURN_IF_ERROR(op(i % b.copies, true, 0,
                         trace.as<uint64_t>() + static_cast<size_t>(i) * grid * kStreamTracePoints,
                         0, served_fuse));
    }
    ASSIGN_OR_RETURN(const std::vector<uint64_t> t, trace_to_host(trace, stream));
    std::vector<double> spread, waited, first_full, done_min, done_med, done_max, x_in, stats,
        quantized, quantized_max;
    std::string slowest;  // the last traced launch's four last blocks, start:done (us)
    // Per SM and per range, how much later than its launch's median block it finished, over even
    // and odd launches apart (odd launches shift the ranges by half the grid).
    std::map<int, std::pair<double, int>> late[2], late_range[2];
    for (int i = launches / 4; i < launches; ++i) {
      const uint64_t* ti = t.data() + static_cast<size_t>(i) * grid * kStreamTracePoints;
      uint64_t t0 = UINT64_MAX, t0_max = 0, w = 0, f = 0, d_min = UINT64_MAX, d_max = 0;
      for (int blk = 0; blk < grid; ++blk) {
        const uint64_t* p = ti + blk * kStreamTracePoints;
        t0 = std::min(t0, p[0]);
        t0_max = std::max(t0_max, p[0]);
        w = std::max(w, p[1]);
        f = std::max(f, p[2]);
        d_min = std::min(d_min, p[3]);
        d_max = std::max(d_max, p[3]);
      }
      std::vector<double> done(grid);
      for (int blk = 0; blk < grid; ++blk)
        done[blk] = (ti[blk * kStreamTracePoints + 3] - t0) * 1e-3;
      const double med = median(done);
      done_med.push_back(med);
      std::vector<double> xi(grid), st(grid), qd(grid);
      for (int blk = 0; blk < grid; ++blk) {
        const uint64_t* p = ti + blk * kStreamTracePoints;
        xi[blk] = (p[4] - t0) * 1e-3;
        st[blk] = (p[7] - t0) * 1e-3;
        qd[blk] = (p[5] - t0) * 1e-3;
        auto& e = late[i % 2][static_cast<int>(p[6])];
        e.first += done[blk] - med;
        e.second += 1;
        auto& er = late_range[i % 2][(blk + (i % 2 == 0 ? 0 : grid / 2)) % grid];
        er.first += done[blk] - med;
        er.second += 1;
      }
      if (served_fuse) {
        x_in.push_back(median(xi));
        stats.push_back(median(st));
        quantized.push_back(median(qd));
        quantized_max.push_back(*std::max_element(qd.begin(), qd.end()));
      }
      if (i == launches - 1) {
        std::vector<int> order(grid);
        for (int blk = 0; blk < grid; ++blk) order[blk] = blk;
        std::sort(order.begin(), order.end(), [&](int x, int y) { return done[x] > done[y]; });
        for (int j = 0; j < std::min(grid, 4); ++j) {
          absl::StrAppendFormat(&slowest, " %.1f:%.1f",
                                (ti[order[j] * kStreamTracePoints] - t0) * 1e-3, done[order[j]]);
        }
      }
      spread.push_back((t0_max - t0) * 1e-3);
      waited.push_back((w - t0) * 1e-3);
      first_full.push_back((f - t0) * 1e-3);
      done_min.push_back((d_min - t0) * 1e-3);
      done_max.push_back((d_max - t0) * 1e-3);
    }
    // Per-SM lateness: the six latest and earliest SMs, and the correlation of the two halves,
    // per SM and per range.
    auto correlation = [](const std::map<int, std::pair<double, int>>(&halves)[2],
                          std::vector<std::pair<double, int>>* mean) {
      std::vector<double> ev, od;
      for (const auto& [key, e] : halves[0]) {
        const auto it = halves[1].find(key);
        if (it == halves[1].end()) continue;
        ev.push_back(e.first / e.second);
        od.push_back(it->second.first / it->second.second);
        if (mean != nullptr) {
          mean->push_back({(e.first + it->second.first) / (e.second + it->second.second), key});
        }
      }
      if (ev.size() < 3) return 0.0;
      double me = 0, mo = 0;
      for (size_t j = 0; j < ev.size(); ++j) me += ev[j], mo += od[j];
      me /= ev.size();
      mo /= od.size();
      double se = 0, so = 0, sx = 0;
      for (size_t j = 0; j < ev.size(); ++j) {
        se += (ev[j] - me) * (ev[j] - me);
        so += (od[j] - mo) * (od[j] - mo);
        sx += (ev[j] - me) * (od[j] - mo);
      }
      return se > 0 && so > 0 ? sx / std::sqrt(se * so) : 0.0;
    };
    std::vector<std::pair<double, int>> per_sm, per_range;
    const double r = correlation(late, &per_sm);
    const double r_range = correlation(late_range, &per_range);
    // The latest ranges and what they hold (as the kernel's RangeOrder splits a range): units
    // [u0, u1) of kStreamRows rows x kStreamChunk bytes, t: the tail (a row block a later block
    // owns, taken first), w: whole row blocks, h: the head (its own row block begun earlier,
    // taken last), e: the row blocks it ends (each an epilogue).
    std::sort(per_range.begin(), per_range.end());
    std::string range_note;
    {
      const int64_t chunks = (sc.k + kStreamChunk - 1) / kStreamChunk;
      const int64_t units = (sc.n + kStreamRows - 1) / kStreamRows * chunks;
      for (size_t j = 0; j < std::min<size_t>(6, per_range.size()); ++j) {
        const auto& e = per_range[per_range.size() - 1 - j];
        const int64_t c = e.second;
        const int64_t u0 = units * c / grid, u1 = units * (c + 1) / grid;
        const int64_t rb_t = (u1 - 1) / chunks, rb_h = u0 / chunks;
        const int64_t t0 =
            u1 < (rb_t + 1) * chunks ? (u0 > rb_t * chunks ? u0 : rb_t * chunks) : u1;
        const int64_t h1 =
            u0 > rb_h * chunks ? ((rb_h + 1) * chunks < t0 ? (rb_h + 1) * chunks : t0) : u0;
        int64_t ends = 0;
        for (int64_t u = u0; u < u1; ++u) ends += (u % chunks == chunks - 1);
        absl::StrAppendFormat(&range_note, " %lld[%lld,%lld) t%lld w%lld h%lld e%lld:%+.1f",
                              static_cast<long long>(c), static_cast<long long>(u0),
                              static_cast<long long>(u1), static_cast<long long>(u1 - t0),
                              static_cast<long long>(t0 - h1), static_cast<long long>(h1 - u0),
                              static_cast<long long>(ends), e.first);
      }
    }
    std::sort(per_sm.begin(), per_sm.end());
    std::string sm_note;
    for (size_t j = 0; j < std::min<size_t>(6, per_sm.size()); ++j) {
      const auto& e = per_sm[per_sm.size() - 1 - j];
      absl::StrAppendFormat(&sm_note, " %d:%+.1f", e.second, e.first);
    }
    sm_note += " | earliest";
    for (size_t j = 0; j < std::min<size_t>(6, per_sm.size()); ++j) {
      absl::StrAppendFormat(&sm_note, " %d:%+.1f", per_sm[j].second, per_sm[j].first);
    }
    const std::string fused_note =
        served_fuse ? absl::StrFormat(
                          " | rows in %.1f, statistics %.1f, quantized %.1f (last block "
                          "%.1f)",
                          median(x_in), median(stats), median(quantized), median(quantized_max))
                    : "";
    std::printf(
        "diagnose-stream %-22s M=%-3lld grid %d | served%s %6.1f us %5.2f TB/s | quantize kernel "
        "first %6.1f, no PDL %6.1f | ring of 2 %6.1f, %d %6.1f, all %6.1f | %s 1 %6.1f, none "
        "%6.1f | start spread "
        "%4.1f, past the dependency %5.1f%s, first slot %5.1f, "
        "blocks done first %6.1f, median %6.1f, last %6.1f (last four start:done%s), outside "
        "the kernel %5.1f\n",
        shape_name(sc).c_str(), static_cast<long long>(m), grid, served_fuse ? " (fused)" : "",
        served_us, w_bytes / (served_us * 1e-6) / 1e12, quant_first_us, no_pdl_us, ring2_us, 4,
        ring4_us, ring8_us, "quantize kernel first, slots before the dependency:", pre1_us, pre0_us,
        median(spread), median(waited), fused_note.c_str(), median(first_full), median(done_min),
        median(done_med), median(done_max), slowest.c_str(), served_us - median(done_max));
    std::printf(
        "diagnose-stream %-22s M=%-3lld late SMs (us after their launch's median block)%s | "
        "correlation of even and odd launches (odd ranges shifted by half the grid): per SM "
        "%.2f, per range %.2f | latest ranges%s\n",
        shape_name(sc).c_str(), static_cast<long long>(m), sm_note.c_str(), r, r_range,
        range_note.c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// A prepared layer's op as served on the shape's first m rows of x (bf16 in, bf16 y into b.y).
absl::Status run_served_op(const CudaPreparedKernel& p, ShapeBuffers& b, int64_t m, void* scratch,
                           cudaStream_t stream) {
  DeviceRunArgs a;
  a.x = b.x.get();
  a.x_dtype = DType::kBF16;
  a.m = m;
  a.y = b.y.get();
  a.y_dtype = DType::kBF16;
  return p.run_device(a, scratch, stream, nullptr);
}

// A cuda.cutlass_sm90 call's arguments on the shape's buffers at M = m (bf16 y, xq from b.xq);
// the weights, the launch mode and the rest are the caller's.
CutlassSm90Args tile_args(const ShapeCase& sc, const ShapeBuffers& b, int64_t m) {
  CutlassSm90Args g;
  g.xq = b.xq.as<int8_t>();
  g.m = m;
  g.n = sc.n;
  g.k = sc.k;
  g.sa = b.sa.as<float>();
  g.azp = b.azp.as<int32_t>();
  g.sb = b.sb.as<float>();
  g.adj = nullptr;  // as served on the benchmark's symmetric layer: no zero-point term
  g.bias_v = b.bias.as<float>();
  g.y = b.y.get();
  g.y_type = ElemType::kBF16;
  g.sm_count = host_info().gpus[0].sm_count;
  g.xq_rows = cutlass_sm90::xq_rows_for(m);  // as served (b.xq holds that many rows)
  return g;
}

// The quantize kernel on the shape's first m rows of x (bf16, dynamic symmetric, as the op
// sections run) into xq, with the shape's sa and azp; `split` as launch_quantize_s8's.
absl::Status quantize_x(const ShapeCase& sc, ShapeBuffers& b, int64_t m, int8_t* xq,
                        cudaStream_t stream, bool split) {
  RETURN_IF_CUDA_ERROR(launch_quantize_s8(b.x.get(), ElemType::kBF16, m, sc.k, QuantizeParams{}, xq,
                                          b.sa.as<float>(), b.azp.as<int32_t>(), stream, nullptr, 0,
                                          nullptr, split));
  return absl::OkStatus();
}

#if QLINEAR_HAVE_CUTLASS
// The swapped tiles' GEMM at up to 16 tokens as served, on weight copy s (--streamk, --claim): the
// quantize kernel's programmatic dependent unless `alone`, its weights evict-first, 4 stages of
// them issued before the wait, 64 KB more prefetched into L2, and the last wave's 4 MB.
CutlassSm90Args served_swap_args(const ShapeCase& sc, ShapeBuffers& b, int64_t m, int s,
                                 bool alone) {
  CutlassSm90Args g = tile_args(sc, b, m);
  g.w = b.w[s].as<int8_t>();
  g.pdl = !alone;
  g.weights_evict_first = true;
  g.weights_ahead = true;
  g.weights_ahead_stages = 4;
  g.weight_prefetch_bytes = int64_t{64} << 10;
  g.tail_prefetch_bytes = int64_t{4} << 20;
  return g;
}
#endif

// Named candidates for medians_in_turns and the like, each queueing one call (--prefill,
// --energy).
struct Candidates {
  std::vector<std::string> names;
  std::vector<std::function<absl::Status(int)>> enqueues;
  void add(std::string name, std::function<absl::Status(int)> enqueue) {
    names.push_back(std::move(name));
    enqueues.push_back(std::move(enqueue));
  }
};

// The tiles the large-M comparisons run (--prefill, --energy).
[[maybe_unused]] constexpr CutlassSm90Tile kLargeMTiles[] = {CutlassSm90Tile::k128x128x128Pingpong,
                                                             CutlassSm90Tile::k64x256x128Pingpong,
                                                             CutlassSm90Tile::k128x256x128Coop};

// The counters the quantizing tiles' launches need for the shape's largest M (--prefill,
// --energy).
[[maybe_unused]] absl::Status allocate_quantizing_counters(const ShapeCase& sc,
                                                           DeviceBuffer* counters) {
  const int64_t max_m =
      sc.large_ms.empty() ? 1 : *std::max_element(sc.large_ms.begin(), sc.large_ms.end());
  return counters->allocate(static_cast<size_t>(quantizing_tile_counters(max_m)) * 4, "counters");
}

// A quantizing tile's arguments: the shape's bf16 x and the counters, the first weight copy.
[[maybe_unused]] CutlassSm90Args quantizing_tile_args(const ShapeCase& sc, const ShapeBuffers& b,
                                                      int64_t m, const DeviceBuffer& counters) {
  CutlassSm90Args g = tile_args(sc, b, m);
  g.w = b.w[0].as<int8_t>();
  g.x = b.x.get();
  g.x_type = ElemType::kBF16;
  g.counters = counters.as<int32_t>();
  return g;
}

// Tile t (bf16 y) prepared, or null where it cannot run g (--prefill, --energy, --profile).
[[maybe_unused]] absl::StatusOr<const cutlass_sm90::TileOps*> prepared_tile(
    CutlassSm90Tile t, const CutlassSm90Args& g) {
  const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(t, ElemType::kBF16);
  RETURN_IF_CUDA_ERROR(ops->prepare());
  return ops->can_implement(g) ? ops : nullptr;
}

// A candidate that queues `before` (if any), then the tile's launch with g on b's workspace.
[[maybe_unused]] std::function<absl::Status(int)> tile_call(
    const cutlass_sm90::TileOps* ops, const CutlassSm90Args& g, ShapeBuffers& b,
    cudaStream_t stream, std::function<absl::Status()> before = nullptr) {
  return [ops, g, &b, stream, before = std::move(before)](int) -> absl::Status {
    if (before) RETURN_IF_ERROR(before());
    RETURN_IF_CUDA_ERROR(ops->launch(g, b.workspace.get(), stream));
    return absl::OkStatus();
  };
}

// A read of 256 MB, several times the L2, queued ahead of a timed call so that the L2 holds none
// of its operands ("flush" in the large-M sweeps).
class L2FlushRead {
 public:
  absl::Status init() {
    RETURN_IF_ERROR(buf_.allocate(kBytes, "L2 flush buffer"));
    RETURN_IF_CUDA_ERROR(cudaMemset(buf_.get(), 0, kBytes));
    return sink_.allocate(4, "L2 flush sink");
  }
  absl::Status enqueue(cudaStream_t stream) const {
    RETURN_IF_CUDA_ERROR(launch_l2_flush_read(buf_.get(), kBytes, sink_.as<uint32_t>(), stream));
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kBytes = size_t{256} << 20;
  DeviceBuffer buf_, sink_;
};

// Times `count` candidates with a layer's load timer (CallTimer, one weight copy), after its L2
// flush each and back to back; unlike cuda.cutlass_sm90's tile tuning, without the untimed call
// that brings a candidate's code and activations back into L2 after the flush (kPrimeChannels),
// so cold here means code, x and weights all from memory; then after the L2 flush with each of
// `primes` (a name and the candidate's untimed call) between the flush and the timing. Each way
// in two forms: 15 calls per timing, in turns over `rounds` rounds (as a layer's first timing of
// each tile, but in turns), and one call per timing, in turns over 15 rounds (as its finalists'
// rounds: each call then follows another candidate's, so the SMs' instruction caches hold that
// one's code). Prints each form's medians on a line:
// "<label> <shape> M=<m> as at load, <how>[, then <prime>][, one call each] | <name> <us> ...".
absl::Status print_as_at_load(
    const char* label, const ShapeCase& sc, int64_t m, size_t count, int rounds,
    const std::function<std::string(size_t)>& name,
    const std::function<absl::Status(size_t, cudaStream_t)>& call,
    const std::vector<std::pair<std::string, std::function<absl::Status(size_t, cudaStream_t)>>>&
        primes) {
  ASSIGN_OR_RETURN(std::unique_ptr<CallTimer> timer, CallTimer::create());
  // Cold and back to back, then cold with each of `primes` run untimed after the L2 read.
  for (int mode = 0; mode < 2 + static_cast<int>(primes.size()); ++mode) {
    const bool cold = mode != 1;
    for (int per_timing : {15, 1}) {
      std::vector<std::vector<double>> us(count);
      for (int round = 0; round < (per_timing == 1 ? 15 : rounds); ++round) {
        for (size_t c = 0; c < count; ++c) {
          auto timed = [&](cudaStream_t ts) { return call(c, ts); };
          auto primed = [&](cudaStream_t ts) {
            return mode >= 2 ? primes[mode - 2].second(c, ts) : absl::OkStatus();
          };
          ASSIGN_OR_RETURN(const double t, timer->median_us(per_timing, cold, timed, primed));
          us[c].push_back(t);
        }
      }
      std::string line =
          absl::StrFormat("%s %-22s M=%-3lld as at load, %s%s%s |", label, shape_name(sc).c_str(),
                          static_cast<long long>(m), cold ? "L2 flushed" : "back to back",
                          mode >= 2 ? ", then " + primes[mode - 2].first : std::string(),
                          per_timing == 1 ? ", one call each" : "");
      for (size_t c = 0; c < count; ++c) {
        absl::StrAppendFormat(&line, " %s %6.1f", name(c), median_of(us[c]));
      }
      std::printf("%s us\n", line.c_str());
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

// --stream_prefetch: cuda.stream_s8 as served at M = 1 and 16 with 0, 2, 4 and 8 units past the
// ring's first fill prefetched into L2 at each block's start (StreamS8Args::l2_prefetch), timed in
// turns, the outputs compared with the first's; at M = 1 also as a layer's load times the fused
// ring, and in the two-launch form (M = 16) the starts that the load times (see below).
absl::Status compare_stream_prefetch(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                                     cudaStream_t stream) {
  const size_t w_bytes = static_cast<size_t>(sc.n * sc.k);
  const int kAhead[] = {0, 2, 4, 8};
  for (int64_t m : {int64_t{1}, int64_t{16}}) {
    ASSIGN_OR_RETURN(std::unique_ptr<StreamS8Calls> calls, StreamS8Calls::create(sc, b, m, stream));
    DeviceBuffer y2;
    RETURN_IF_ERROR(y2.allocate(static_cast<size_t>(m * sc.n) * 2, "y"));
    const bool fuse = calls->served_fuse();
    auto op = [&](int s, int ahead, int stages, void* y, cudaStream_t on) -> absl::Status {
      StreamS8Calls::Knobs k;
      k.fuse = fuse;
      k.stages = stages;
      k.l2_prefetch = ahead;
      k.y = y;
      return calls->enqueue(s, k, on);
    };
    // Every variant's output against the first's, bit for bit.
    const size_t y_bytes = static_cast<size_t>(m * sc.n) * 2;
    std::vector<uint8_t> y_first(y_bytes), y_other(y_bytes);
    bool same = true;
    for (int stages : {2, 3}) {
      for (int ahead : kAhead) {
        RETURN_IF_ERROR(op(0, ahead, stages, y2.get(), stream));
        RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
        std::vector<uint8_t>& dst = stages == 2 && ahead == 0 ? y_first : y_other;
        RETURN_IF_CUDA_ERROR(cudaMemcpy(dst.data(), y2.get(), y_bytes, cudaMemcpyDeviceToHost));
        if (&dst == &y_other && y_other != y_first) same = false;
      }
    }
    std::vector<std::function<absl::Status(int)>> cands;
    for (int stages : {2, 3}) {
      for (int ahead : kAhead) {
        cands.push_back(
            [&, ahead, stages](int s) { return op(s, ahead, stages, b.y.get(), stream); });
      }
    }
    for (int round = 0; round < 3; ++round) {
      ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, b.copies, o, cands));
      std::string line =
          absl::StrFormat("stream-prefetch %-22s M=%-3lld %s round %d |", shape_name(sc).c_str(),
                          static_cast<long long>(m), fuse ? "fused" : "2 launches", round);
      for (size_t c = 0; c < cands.size(); ++c) {
        absl::StrAppendFormat(&line, " S%d+%d %6.1f", c < 4 ? 2 : 3, kAhead[c % 4], us[c]);
      }
      absl::StrAppendFormat(&line, " us | best %.2f TB/s | y %s",
                            w_bytes / (*std::min_element(us.begin(), us.end()) * 1e-6) / 1e12,
                            same ? "identical" : "DIFFERENT");
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    // As a layer's load times them, over five rounds.
    if (m == 1 && fuse) {
      RETURN_IF_ERROR(print_as_at_load(
          "stream-prefetch", sc, m, cands.size(), 5,
          [&](size_t c) { return absl::StrFormat("S%d+%d", c < 4 ? 2 : 3, kAhead[c % 4]); },
          [&](size_t c, cudaStream_t ts) {
            return op(0, kAhead[c % 4], c < 4 ? 2 : 3, b.y.get(), ts);
          },
          {}));
    }
    // The two-launch form's starts that a layer larger than the L2 times at load (3 slots; the
    // whole ring and no units, as smaller layers start, then 1 slot or none before the grid
    // dependency and 4 units prefetched into L2): in turns over the rotated weights, then as the
    // load times them (CallTimer, one copy, 15 calls per timing, in turns over nine rounds) after
    // an L2 flush each and back to back; y compared with the first variant's.
    if (!fuse) {
      struct StartCand {
        int slots, ahead;
        const char* name;
      };
      const StartCand kStarts[] = {{0, 0, "whole+0"}, {1, 4, "1+4"}, {-1, 4, "none+4"}};
      auto start_op = [&](int s, const StartCand& c, void* y, cudaStream_t on) -> absl::Status {
        StreamS8Calls::Knobs k;
        k.stages = 3;
        k.prefetch = c.slots;
        k.l2_prefetch = c.ahead;
        k.y = y;
        return calls->enqueue(s, k, on);
      };
      for (const StartCand& c : kStarts) {
        RETURN_IF_ERROR(start_op(0, c, y2.get(), stream));
        RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
        RETURN_IF_CUDA_ERROR(cudaMemcpy(y_other.data(), y2.get(), y_bytes, cudaMemcpyDeviceToHost));
        if (y_other != y_first) same = false;
      }
      std::vector<std::function<absl::Status(int)>> starts;
      for (const StartCand& c : kStarts) {
        starts.push_back([&, c](int s) { return start_op(s, c, b.y.get(), stream); });
      }
      for (int round = 0; round < 3; ++round) {
        ASSIGN_OR_RETURN(const std::vector<double> us,
                         medians_in_turns(stream, b.copies, o, starts));
        std::string line =
            absl::StrFormat("stream-start %-22s M=%-3lld in turns, round %d |",
                            shape_name(sc).c_str(), static_cast<long long>(m), round);
        for (size_t c = 0; c < starts.size(); ++c) {
          absl::StrAppendFormat(&line, " %s %6.1f", kStarts[c].name, us[c]);
        }
        absl::StrAppendFormat(&line, " us | y %s", same ? "identical" : "DIFFERENT");
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      }
      RETURN_IF_ERROR(print_as_at_load(
          "stream-start", sc, m, std::size(kStarts), 9,
          [&](size_t c) { return std::string(kStarts[c].name); },
          [&](size_t c, cudaStream_t ts) { return start_op(0, kStarts[c], b.y.get(), ts); }, {}));
    }
  }
  return absl::OkStatus();
}

// The fewest CTAs of a persistent grid that stream `tiles` tiles in as many waves as sm_count CTAs
// would: fewer than sm_count only where the tiles outnumber the SMs without filling their last
// wave (448 tiles on 132 SMs: 112 CTAs of 4 instead of 132 of 3 or 4). --tail's "bal".
[[maybe_unused]] int balanced_grid(int64_t tiles, int sm_count) {
  if (sm_count < 1 || tiles <= sm_count) return sm_count;
  const int64_t waves = (tiles + sm_count - 1) / sm_count;
  return static_cast<int>((tiles + waves - 1) / waves);
}

#if QLINEAR_HAVE_CUTLASS
// A vLLM GEMM's op with `args` (vllm_sm90.h) on weight copy s: the quantize kernel on args.m rows,
// splitting rows as `split` says, then `run`.
std::function<absl::Status(int)> vllm_call(const ShapeCase& sc, ShapeBuffers& b, bool split,
                                           cudaStream_t stream, const vllm_sm90::Args& args,
                                           cudaError_t (*run)(const vllm_sm90::Args&, void*,
                                                              cudaStream_t)) {
  return [&sc, &b, split, stream, args, run](int s) -> absl::Status {
    vllm_sm90::Args a = args;
    a.w = b.w[s].as<int8_t>();
    RETURN_IF_ERROR(quantize_x(sc, b, a.m, b.xq.as<int8_t>(), stream, split));
    RETURN_IF_CUDA_ERROR(run(a, b.workspace.get(), stream));
    return absl::OkStatus();
  };
}

// The "vLLM" anchor (vllm_sm90.h) at m tokens, writing y: its arguments, and its call on weight
// copy s (vllm_call with vLLM's configuration for the shape), empty where it cannot run the shape.
struct VllmAnchor {
  vllm_sm90::Args args;
  std::function<absl::Status(int)> call;
};
VllmAnchor vllm_anchor(const ShapeCase& sc, ShapeBuffers& b, int64_t m, void* y, bool split,
                       cudaStream_t stream) {
  VllmAnchor v;
  v.args.xq = b.xq.as<int8_t>();
  v.args.sa = b.sa.as<float>();
  v.args.sb = b.sb.as<float>();
  v.args.bias = b.vllm_bias.as<uint16_t>();
  v.args.y = static_cast<uint16_t*>(y);
  v.args.m = static_cast<int>(m);
  v.args.n = static_cast<int>(sc.n);
  v.args.k = static_cast<int>(sc.k);
  v.args.sm_count = host_info().gpus[0].sm_count;
  if (sc.k % 16 != 0 || sc.n % 16 != 0 || vllm_sm90::workspace_bytes(v.args) > b.workspace.size()) {
    return v;
  }
  v.call = vllm_call(sc, b, split, stream, v.args, vllm_sm90::run);
  return v;
}
#endif

// --weights_hint: cuda.cutlass_sm90's op (the quantize kernel, then the GEMM launched as served:
// the programmatic dependent up to M = 64, and with a cluster up to 128 or while the tile's token
// blocks fit in one cluster, the tiles without one then issuing their first stages' weights and
// prefetching 64 KB into L2 before the wait; stream order otherwise) at M = 1-256 on the tiles
// served there, without and with the weights' evict-first L2 hint (CutlassSm90Args::
// weights_evict_first, where each weight tile is read once), and from M = 128 the tiles with a
// cluster also with the hint and the launch that is not served ("ef flip": stream order <-> the
// dependent, see served_with_pdl); timed in turns over three rounds, the outputs compared bit for
// bit. With --pad_rows instead: the tiles of 64 tokens without a cluster at M = 1-64, the op as
// served, with the token block's rows past M zero-filled by the TMA ("zf"; served: read from
// xq, CutlassSm90Args::xq_rows), with the quantize kernel keeping every row in one block
// ("whole"; otherwise it splits rows as served, split_quantize_rows), and the GEMM alone both
// ways. With --swap instead: at M = 1 and 16, the 64 x 64 tile and the tiles with their operands
// swapped (TileConfig::kSwapAB, and the stream-K swapped tile of our own, "tile11", on a workspace
// of zeros that it leaves zeroed), the GEMM alone and the op as the quantize kernel's dependent
// with every stage's weights issued before the wait ("op") or 4 or 2 stages' ("a4", "a2";
// CutlassSm90Args::weights_ahead_stages), each with 64 KB of L2 prefetch per CTA but "pf0" (none)
// and "a4pf256" (256 KB). With --tail instead: at M = 1 and 16, on the layers whose 64-channel
// tiles outnumber the SMs, the swapped tiles' op (4 stages ahead) with the CTAs that own no tile
// of the last, partial wave prefetching the first k-tiles of that wave's tiles into L2 at their
// start, up to 0, 2, 4, 8 or 16 MB over all of them ("t0" ... "t16"; CutlassSm90Args::
// tail_prefetch_bytes; served: "t4"), and with no prefetch but the grid cut to as few CTAs as keep
// the same number of waves, so that every CTA streams as many tiles ("bal": CutlassSm90Args::
// sm_count lowered); the GEMM alone with 0 and 4 MB and with the cut grid. With --vllm instead: at
// M = 64, 128 and 256, the two tiles that are vLLM's configurations there (64 x 128 x 128 in a 2 x
// 1 cluster, 128 x 128 x 128 in one), the op as served and with one of its parts changed at a
// time: its epilogue with the zero-point term read (zeros: "zp"; a symmetric layer's has none),
// the launch that is not served and without the evict-first hint ("flip noef", and "flip noef zp"),
// the served launch without the hint ("noef"), and as served on a weight copy no other candidate
// reads ("served w1"); beside them the op as the summary's sweep times it ("op": the layer
// prepared, its tile timed at load, run_device on its own weight copy and scratch), the "vLLM"
// anchor (vllm_sm90.h), the anchor on the copy of its own ("vLLM w1"), and at M = 128 vLLM's GEMM
// with our epilogue in place of its own ("vLLM ourepi", and "vLLM ourepi zp" with the zero-point
// term read), which sets the epilogues' cost apart from the mainloops'. Every y is compared with
// the first one's; a line names the candidates whose y differs.
absl::Status compare_weights_hint(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                                  cudaStream_t stream, const Registry& registry,
                                  const LayerWeights& weights) {
#if QLINEAR_HAVE_CUTLASS
  const int sms = host_info().gpus[0].sm_count;
  // With --vllm: cuda.cutlass_sm90 prepared on the layer (its tiles timed at load), whose op the
  // summary's sweep times (run_device, on its own device copy of the weights and its scratch).
  std::unique_ptr<PreparedKernel> served;
  DeviceBuffer served_scratch;
  if (o.vllm) {
    if (const Kernel* kern = registry.find("cuda.cutlass_sm90");
        kern != nullptr && registry.usable(*kern, host_info()).ok()) {
      ASSIGN_OR_RETURN(served, kern->prepare_with_tuning(weights, PrepareContext{nullptr}));
      const auto* p = dynamic_cast<const CudaPreparedKernel*>(served.get());
      if (p == nullptr) {
        served.reset();
      } else {
        RETURN_IF_ERROR(served_scratch.allocate(p->device_scratch_bytes(256), "op scratch"));
      }
    }
  }
  const size_t w_bytes = static_cast<size_t>(sc.n * sc.k);
  struct Hint {
    const char* name;
    bool read_once;
    bool flip_pdl = false;    // the launch that is not served: stream order <-> the dependent
    bool zero_fill = false;   // the token block's rows past m zero-filled, not read from xq
    bool alone = false;       // the GEMM alone, without the quantize kernel before it
    bool whole_rows = false;  // the quantize kernel never splitting a row between blocks
    int ahead_stages = 0;     // CutlassSm90Args::weights_ahead_stages (0: every stage)
    int prefetch_kb = 64;     // CutlassSm90Args::weight_prefetch_bytes / 1024
    int tail_mb = 0;          // CutlassSm90Args::tail_prefetch_bytes / 2^20
    bool balanced = false;    // the grid cut to as few CTAs as keep the waves (sm_count)
    bool no_ahead = false;    // no weights issued before the wait (CutlassSm90Args::weights_ahead)
    int copy = -1;            // the weight copy read (-1: the rotation's; see ShapeBuffers::w)
    bool zp_terms = false;    // the epilogue's zero-point term read (zeros; served: none)
  };
  // Times `hints` on `tiles` at m tokens and prints one line per round.
  // (rotate: every call reads the next weight copy from M = 128 on too, as up to M = 64.)
  auto compare = [&](int64_t m, std::initializer_list<CutlassSm90Tile> tiles,
                     std::initializer_list<Hint> hints, int rounds, const Options& to,
                     bool rotate = false) -> absl::Status {
    const int slots = m <= 64 || rotate ? b.copies : 1;
    const size_t y_bytes = static_cast<size_t>(m * sc.n) * 2;
    std::vector<std::function<absl::Status(int)>> cands;
    std::vector<std::string> names;
    // Every candidate's y against the first one's: the candidates that differ, and in how many of
    // its values the first that differs does.
    std::vector<uint8_t> y_ref;
    std::vector<std::string> differ;
    int64_t differ_values = 0;
    auto check_y = [&](const std::string& name) -> absl::Status {
      std::vector<uint8_t> y(y_bytes);
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
      RETURN_IF_CUDA_ERROR(cudaMemcpy(y.data(), b.y.get(), y_bytes, cudaMemcpyDeviceToHost));
      if (y_ref.empty()) {
        y_ref = std::move(y);
      } else if (y != y_ref) {
        if (differ.empty()) {
          for (size_t i = 0; i + 1 < y_bytes; i += 2) {
            differ_values += std::memcmp(&y[i], &y_ref[i], 2) != 0;
          }
        }
        differ.push_back(name);
      }
      return absl::OkStatus();
    };
    for (CutlassSm90Tile tile : tiles) {
      const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(tile, ElemType::kBF16);
      RETURN_IF_CUDA_ERROR(ops->prepare());
      CutlassSm90Args g = tile_args(sc, b, m);
      const int64_t read_rows = g.xq_rows;
      const bool served_pdl = cutlass_sm90::served_with_pdl(m, *ops);
      g.weight_prefetch_bytes = 64 << 10;
      g.weights_ahead = true;
      if (!ops->can_implement(g)) continue;
      void* workspace = b.workspace.get();
      if (const size_t bytes = ops->workspace_bytes(g); bytes > 0) {
        if (b.zero_workspace.size() < bytes) {
          RETURN_IF_ERROR(b.zero_workspace.reserve(bytes, "zeroed workspace"));
          RETURN_IF_CUDA_ERROR(cudaMemset(b.zero_workspace.get(), 0, b.zero_workspace.size()));
        }
        workspace = b.zero_workspace.get();
      }
      for (const Hint& h : hints) {
        if (h.flip_pdl && (m <= 64 || ops->cluster_ctas == 1)) continue;  // (tiles with a cluster)
        g.pdl = (served_pdl != h.flip_pdl) && !h.alone;
        g.weights_evict_first = h.read_once;
        g.weights_ahead = !h.no_ahead;
        g.weights_ahead_stages = h.ahead_stages;
        g.weight_prefetch_bytes = int64_t{h.prefetch_kb} << 10;
        g.tail_prefetch_bytes = int64_t{h.tail_mb} << 20;
        g.sm_count = h.balanced ? balanced_grid(cutlass_sm90::tile_count(m, sc.n, *ops), sms) : sms;
        g.xq_rows = h.zero_fill ? 0 : read_rows;
        g.adj = h.zp_terms ? b.adj.as<int32_t>() : nullptr;
        const bool alone = h.alone,
                   split = !h.whole_rows && cutlass_sm90::split_quantize_rows(m, sc.k, sms);
        if (h.copy >= static_cast<int>(b.w.size()) || (h.copy >= 0 && slots > 1)) continue;
        const int copy = h.copy;
        auto op = [&, g, ops, alone, split, workspace, copy](int s) -> absl::Status {
          if (!alone) RETURN_IF_ERROR(quantize_x(sc, b, m, b.xq.as<int8_t>(), stream, split));
          CutlassSm90Args gs = g;
          gs.w = b.w[copy >= 0 ? copy : s].as<int8_t>();
          RETURN_IF_CUDA_ERROR(ops->launch(gs, workspace, stream));
          return absl::OkStatus();
        };
        names.push_back(absl::StrFormat("tile%d%s", static_cast<int>(tile), h.name));
        RETURN_IF_ERROR(op(0));
        RETURN_IF_ERROR(check_y(names.back()));
        cands.push_back(op);
      }
    }
    if (served != nullptr && !cands.empty() && !rotate) {
      // The op as the summary's sweep times it ("op": the tile the load chose, on the layer's
      // own weight copy; not where the others rotate theirs from M = 128).
      const auto* p = static_cast<const CudaPreparedKernel*>(served.get());
      auto op = [&, p, m](int) { return run_served_op(*p, b, m, served_scratch.get(), stream); };
      names.push_back("op");
      RETURN_IF_ERROR(op(0));
      RETURN_IF_ERROR(check_y(names.back()));
      cands.push_back(op);
    }
    if (o.vllm && !cands.empty()) {
      // The "vLLM" anchor, writing the same y; beside it where the rotation has a second weight
      // copy (M > 64 reads the first), the anchor on that copy ("w1"), which no other candidate
      // reads.
      const bool split = cutlass_sm90::split_quantize_rows(m, sc.k, sms);
      const VllmAnchor v = vllm_anchor(sc, b, m, b.y.get(), split, stream);
      if (v.call) {
        names.push_back(absl::StrFormat("vLLM(%s)", vllm_sm90::config_name(v.args)));
        RETURN_IF_ERROR(v.call(0));
        RETURN_IF_ERROR(check_y(names.back()));
        cands.push_back(v.call);
        if (slots == 1 && b.w.size() > 1) {
          cands.push_back([call = v.call](int) { return call(1); });
          names.push_back("vLLM w1");
        }
      }
      // Where vLLM runs configuration M128 (M = 65-128): the same GEMM with our epilogue, with
      // the zero-point term read ("vLLM ourepi zp") and without it, as served ("vLLM ourepi").
      if (v.call && m > 64 && m <= 128) {
        for (const bool zp : {false, true}) {
          vllm_sm90::Args a = v.args;
          a.azp = b.azp.as<int32_t>();
          a.adj = zp ? b.adj.as<int32_t>() : nullptr;
          a.bias_f = b.bias.as<float>();
          auto call = vllm_call(sc, b, split, stream, a, vllm_sm90::run_m128_our_epilogue);
          names.push_back(zp ? "vLLM ourepi zp" : "vLLM ourepi");
          RETURN_IF_ERROR(call(0));
          RETURN_IF_ERROR(check_y(names.back()));
          cands.push_back(call);
        }
      }
    }
    if (cands.empty()) return absl::OkStatus();
    for (int round = 0; round < rounds; ++round) {
      ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, slots, to, cands));
      std::string line =
          absl::StrFormat("weights-hint %-22s M=%-5lld round %d%s |", shape_name(sc).c_str(),
                          static_cast<long long>(m), round, rotate ? " rotated" : "");
      for (size_t c = 0; c < cands.size(); ++c) {
        absl::StrAppendFormat(&line, " %s %7.1f", names[c], us[c]);
      }
      absl::StrAppendFormat(
          &line, " us | best %.2f TB/s | y %s",
          w_bytes / (*std::min_element(us.begin(), us.end()) * 1e-6) / 1e12,
          differ.empty()
              ? "identical"
              : absl::StrCat("DIFFERENT from ", names.front(), "'s: ", absl::StrJoin(differ, ", "),
                             " (the first in ", differ_values, " values)"));
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    return absl::OkStatus();
  };
  if (o.tail) {  // (run_shape skips the layers whose 64-channel tiles do not outnumber the SMs)
    for (int64_t m : {int64_t{1}, int64_t{16}}) {
      RETURN_IF_ERROR(
          compare(m,
                  {CutlassSm90Tile::k16x64x256PingpongSwap, CutlassSm90Tile::k16x64x512PingpongSwap,
                   CutlassSm90Tile::k16x128x256PingpongSwap},
                  {{" t0", true, false, false, false, false, 4, 64, 0},
                   {" t2", true, false, false, false, false, 4, 64, 2},
                   {" t4", true, false, false, false, false, 4, 64, 4},
                   {" t8", true, false, false, false, false, 4, 64, 8},
                   {" t16", true, false, false, false, false, 4, 64, 16},
                   {" bal", true, false, false, false, false, 4, 64, 0, true},
                   {" alone t0", true, false, false, true, false, 0, 64, 0},
                   {" alone t4", true, false, false, true, false, 0, 64, 4},
                   {" alone bal", true, false, false, true, false, 0, 64, 0, true}},
                  3, o));
    }
    return absl::OkStatus();
  }
  if (o.swap) {
    // The op as served on the 64-token tiles and on the tiles with their operands swapped (16
    // tokens per tile, the weights on the MMA's M side), in turns; the GEMM alone as well.
    for (int64_t m : {int64_t{1}, int64_t{16}}) {
      RETURN_IF_ERROR(compare(
          m,
          {CutlassSm90Tile::k64x64x128Pingpong, CutlassSm90Tile::k16x64x256PingpongSwap,
           CutlassSm90Tile::k16x64x512PingpongSwap, CutlassSm90Tile::k16x128x256PingpongSwap,
           CutlassSm90Tile::k16x64x256StreamKSwap},
          {{" op", true},
           {" a4", true, false, false, false, false, 4},
           {" a2", true, false, false, false, false, 2},
           {" pf0", true, false, false, false, false, 0, 0},
           {" a4pf0", true, false, false, false, false, 4, 0},
           {" a4pf256", true, false, false, false, false, 4, 256},
           {" alone", true, false, false, true}},
          3, o));
    }
    return absl::OkStatus();
  }
  if (o.pad_rows) {
    for (int64_t m : {int64_t{1}, int64_t{16}, int64_t{32}, int64_t{64}}) {
      RETURN_IF_ERROR(
          compare(m,
                  {CutlassSm90Tile::k64x64x128Pingpong, CutlassSm90Tile::k64x128x128Pingpong,
                   CutlassSm90Tile::k64x256x128Pingpong},
                  {{" ef zf", true, false, true},
                   {" ef", true},
                   {" ef whole", true, false, false, false, true},
                   {" alone zf", true, false, true, true},
                   {" alone", true, false, false, true}},
                  3, o));
    }
    return absl::OkStatus();
  }
  if (o.vllm) {
    for (int64_t m : {int64_t{64}, int64_t{128}, int64_t{256}}) {
      RETURN_IF_ERROR(compare(
          m, {CutlassSm90Tile::k64x128x128PingpongC2, CutlassSm90Tile::k128x128x128Pingpong},
          {{" served", true},
           {" zp", true, false, false, false, false, 0, 64, 0, false, false, -1, true},
           {" flip noef", false, true},
           {" flip noef zp", false, true, false, false, false, 0, 64, 0, false, false, -1, true},
           {" noef", false},
           {" served w1", true, false, false, false, false, 0, 64, 0, false, false, 1}},
          3, o));
      if (m > 64) {
        // The same with the weights rotated past the L2, as a layer finds them between two calls
        // of a model's step (its other layers read in between): without it, a candidate whose
        // weights stay in the L2 from its previous call (the anchor's, read without a hint) is
        // timed against one whose weights the evict-first hint lets go (the op's).
        RETURN_IF_ERROR(compare(
            m, {CutlassSm90Tile::k64x128x128PingpongC2, CutlassSm90Tile::k128x128x128Pingpong},
            {{" served", true}, {" noef", false}}, 3, o, true));
      }
    }
    return absl::OkStatus();
  }
  for (int64_t m : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{128}, int64_t{256}}) {
    RETURN_IF_ERROR(
        compare(m,
                {CutlassSm90Tile::k64x64x128Pingpong, CutlassSm90Tile::k64x128x128Pingpong,
                 CutlassSm90Tile::k64x256x128Pingpong, CutlassSm90Tile::k64x128x128PingpongC2,
                 CutlassSm90Tile::k128x128x128Pingpong, CutlassSm90Tile::k128x256x128Coop},
                {{"", false}, {" ef", true}, {" ef flip", true, true}}, 3, o));
  }
#else
  (void)sc, (void)b, (void)o, (void)stream;
#endif
  return absl::OkStatus();
}

// A workspace of at least `bytes` zeros (b.zero_workspace, zeroed once; the tiles that take one
// leave it zeroed).
absl::StatusOr<void*> zeroed_workspace(ShapeBuffers& b, size_t bytes) {
  if (b.zero_workspace.size() < bytes) {
    RETURN_IF_ERROR(b.zero_workspace.reserve(bytes, "zeroed workspace"));
    RETURN_IF_CUDA_ERROR(cudaMemset(b.zero_workspace.get(), 0, b.zero_workspace.size()));
  }
  return b.zero_workspace.get();
}

// Runs each of a cuda.cutlass_sm90 comparison's forms once on weight copy 0 (its tile prepared
// first), comparing y bit for bit with the first form's, then times them in turns over three
// rounds (medians_in_turns), a line per round: "<label> <shape> M=<m> round <r> | <name> <us> ...
// us | best <weights TB/s> | y identical" (or DIFFERENT). op(form, slot) enqueues one form's op on
// weight copy `slot`.
absl::Status time_forms_in_turns(const char* label, const ShapeCase& sc, ShapeBuffers& b, int64_t m,
                                 const std::vector<std::string>& names,
                                 const std::vector<CutlassSm90Tile>& tiles,
                                 const std::function<absl::Status(size_t, int)>& op,
                                 const Options& o, cudaStream_t stream) {
  const size_t w_bytes = static_cast<size_t>(sc.n * sc.k);
  const size_t y_bytes = static_cast<size_t>(m * sc.n) * 2;
  std::vector<uint8_t> y_first(y_bytes), y_other(y_bytes);
  bool same = true;
  std::vector<std::function<absl::Status(int)>> cands;
  for (size_t f = 0; f < names.size(); ++f) {
    RETURN_IF_CUDA_ERROR(cutlass_sm90::tile_ops(tiles[f], ElemType::kBF16)->prepare());
    RETURN_IF_ERROR(op(f, 0));
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
    RETURN_IF_CUDA_ERROR(cudaMemcpy((f == 0 ? y_first : y_other).data(), b.y.get(), y_bytes,
                                    cudaMemcpyDeviceToHost));
    if (f > 0 && y_other != y_first) same = false;
    cands.push_back([&op, f](int s) { return op(f, s); });
  }
  for (int round = 0; round < 3; ++round) {
    ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, b.copies, o, cands));
    std::string line = absl::StrFormat("%s %-22s M=%-3lld round %d |", label, shape_name(sc),
                                       static_cast<long long>(m), round);
    for (size_t c = 0; c < cands.size(); ++c) {
      absl::StrAppendFormat(&line, " %s %6.1f", names[c], us[c]);
    }
    absl::StrAppendFormat(&line, " us | best %.2f TB/s | y %s",
                          w_bytes / (*std::min_element(us.begin(), us.end()) * 1e-6) / 1e12,
                          same ? "identical" : "DIFFERENT");
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// --streamk: the stream-K swapped tile (tile 11) and the same kernel dealing whole tiles (tile 14)
// at M = 1 and 16 against the CUTLASS 16 x 64 x 256 swapped tile (tile 8), in turns over three
// rounds, the outputs compared bit for bit: the op as served for tile 8 (the quantize kernel, then
// the GEMM as its programmatic dependent with 4 stages of weights issued before the wait, 64 KB of
// L2 prefetch per CTA and the last wave's 4 MB), the GEMM alone, tile 11's GEMM alone, and tile
// 14's GEMM alone and its op: in stream order ("serial"), and as the dependent with no weights
// ahead of the wait ("a0"), 4 stages ("a4"), 4 stages and 64 KB of L2 prefetch ("a4pf64") and every
// stage and 64 KB ("a10pf64"); and tile 15's op (one launch quantizing the activations itself)
// where it takes the shape; where it does and the layer's channels are dealt in halves of 32
// (cutlass_sm90::whole_tiles_in_halves), also tile 14's GEMM alone and tile 15's op dealing whole
// tiles of 64 only ("tile14 whole", "tile15 whole"). Then where tiles 14 and 15 spend the time
// (alone, a0, a4pf64; tile 15's op), from their CTAs' %globaltimer stamps (kStreamKTracePoints;
// medians over traced launches, us from the first CTA's start): the spread of CTA starts, how many
// started over 1 us after the first (and the lowest such CTA index), when the producers got past
// the grid dependency (tile 15: had quantized the rows; median; alone, when they started), each
// CTA's wait for its first k-tile (median), when the last loads were issued, when the last
// multiplies and the last epilogue were done (median / max over CTAs), and the last traced launch's
// 4 slowest CTAs (index@SM:start-end); tile 15's again with each launch after an L2 read and tile
// 8's op (its code then out of L2 and the SMs' instruction caches). Last, "streamk-cold": tile 8's
// op and GEMM alone, tile 14's GEMM alone and tile 15's op timed by a layer's load timer
// (print_as_at_load): after its L2 read, back to back, and after its L2 read with an untimed prime
// (the same form on zero weights: 256 channels of K, as a layer's load primes; or 64 channels per
// SM of one k-tile).
absl::Status compare_streamk(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                             cudaStream_t stream) {
#if QLINEAR_HAVE_CUTLASS
  const int sms = host_info().gpus[0].sm_count;
  for (int64_t m : {int64_t{1}, int64_t{16}}) {
    const int slots = b.copies;
    const bool split = cutlass_sm90::split_quantize_rows(m, sc.k, sms);
    struct Form {
      std::string name;
      CutlassSm90Tile tile;
      bool alone;
      int ahead = 4;         // CutlassSm90Args::weights_ahead_stages (0: every stage, -1: none)
      int prefetch_kb = 64;  // CutlassSm90Args::weight_prefetch_bytes / 1024
      bool pdl = true;       // false: the op in stream order
      bool halves = true;    // CutlassSm90Args::half_tiles (tiles 14 and 15)
    };
    const CutlassSm90Tile cutlass = CutlassSm90Tile::k16x64x256PingpongSwap;
    const CutlassSm90Tile streamk = CutlassSm90Tile::k16x64x256StreamKSwap;
    const CutlassSm90Tile whole = CutlassSm90Tile::k16x64x256WholeSwap;
    const CutlassSm90Tile fused = CutlassSm90Tile::k16x64x256WholeSwapQ;
    std::vector<Form> forms = {
        {"tile8 op", cutlass, false},       {"tile8 alone", cutlass, true},
        {"tile11 alone", streamk, true},    {"tile14 alone", whole, true},
        {"tile14 a0", whole, false, -1, 0}, {"tile14 serial", whole, false, 4, 0, false},
        {"tile14 a4", whole, false, 4, 0},  {"tile14 a4pf64", whole, false},
        {"tile14 a10pf64", whole, false, 0}};
    // Tile 15 (the whole op in one launch) where its shared memory takes the rows.
    auto quantizing_args = [&](CutlassSm90Args g) {
      g.x = b.x.get();
      g.x_type = ElemType::kBF16;
      g.qp = QuantizeParams{};  // as quantize_x
      return g;
    };
    if (cutlass_sm90::tile_ops(fused, ElemType::kBF16)
            ->can_implement(quantizing_args(served_swap_args(sc, b, m, 0, false)))) {
      forms.push_back({"tile15 op", fused, false});
      // The same dealing whole tiles of 64 channels only, where the halves change the deal.
      if (cutlass_sm90::whole_tiles_in_halves(served_swap_args(sc, b, m, 0, true))) {
        Form whole_only{"tile15 whole", fused, false};
        whole_only.halves = false;
        forms.insert(forms.end() - 1, whole_only);  // (tile 15's op stays last)
        whole_only = {"tile14 whole", whole, true};
        whole_only.halves = false;
        forms.insert(forms.begin() + 4, whole_only);  // after tile 14's GEMM alone
      }
    }
    // The primes of the cold timings below: the form's call on zero weights, 256 channels of the
    // layer's K (as a layer's load primed each timing before kPrimeSmChannels), or 64 channels per
    // SM of one k-tile (as many CTAs as the timed call, up to every SM).
    DeviceBuffer prime_w;
    const int64_t prime_n1 = std::min<int64_t>(sc.n, 256);
    const int64_t prime_n2 = std::min<int64_t>(sc.n, int64_t{64} * sms);
    const int64_t prime_k2 = std::min<int64_t>(sc.k, 256);
    RETURN_IF_ERROR(prime_w.allocate(
        static_cast<size_t>(std::max(prime_n1 * sc.k, prime_n2 * prime_k2)), "prime weights"));
    RETURN_IF_CUDA_ERROR(cudaMemset(prime_w.get(), 0, prime_w.size()));
    // The form's op on weight copy s (prime 1 or 2: the prime above instead), its CTAs' stamps into
    // `trace` when set, on stream `on`.
    auto op = [&](const Form& f, int s, uint64_t* trace, cudaStream_t on,
                  int prime = 0) -> absl::Status {
      const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(f.tile, ElemType::kBF16);
      const bool quantizes = tile_quantizes(f.tile);
      if (!f.alone && !quantizes) {
        RETURN_IF_ERROR(quantize_x(sc, b, m, b.xq.as<int8_t>(), on, split));
      }
      CutlassSm90Args g = served_swap_args(sc, b, m, s, f.alone);
      if (quantizes) g = quantizing_args(g);
      if (prime != 0) {
        g.w = prime_w.as<int8_t>();
        g.n = prime == 1 ? prime_n1 : prime_n2;
        if (prime == 2) g.k = prime_k2;
      }
      g.pdl = g.pdl && f.pdl;
      g.half_tiles = f.halves;
      g.weights_ahead = f.ahead >= 0;
      g.weights_ahead_stages = f.ahead;
      g.weight_prefetch_bytes = int64_t{f.prefetch_kb} << 10;
      g.tail_prefetch_bytes = f.tile == cutlass ? int64_t{4} << 20 : 0;
      g.trace = trace;
      void* workspace = b.workspace.get();
      if (const size_t bytes = ops->workspace_bytes(g); bytes > 0) {
        ASSIGN_OR_RETURN(workspace, zeroed_workspace(b, bytes));
      }
      if (!ops->can_implement(g)) return absl::UnimplementedError("tile declines the shape");
      RETURN_IF_CUDA_ERROR(ops->launch(g, workspace, on));
      return absl::OkStatus();
    };
    std::vector<std::string> names;
    std::vector<CutlassSm90Tile> tiles;
    for (const Form& f : forms) {
      names.push_back(f.name);
      tiles.push_back(f.tile);
    }
    RETURN_IF_ERROR(time_forms_in_turns(
        "streamk", sc, b, m, names, tiles,
        [&](size_t f, int s) { return op(forms[f], s, nullptr, stream); }, o, stream));
    // The CTAs' stamps of launches [from, launches) in t (sms CTAs each), summarised.
    auto summarize = [&](const std::vector<uint64_t>& t, int from, int launches) {
      const size_t per_launch = static_cast<size_t>(sms) * kStreamKTracePoints;
      std::vector<double> spread, late, first_late, dep_med, wait_first, issued, mma_med, mma_max,
          end_med, end_max;
      std::string slowest;
      int ctas = 0;
      for (int i = from; i < launches; ++i) {
        const uint64_t* ti = t.data() + i * per_launch;
        uint64_t t0 = UINT64_MAX, t0_max = 0, last_issue = 0;
        ctas = 0;
        for (int c = 0; c < sms; ++c) {
          const uint64_t* p = ti + c * kStreamKTracePoints;
          if (p[0] == 0) continue;
          ++ctas;
          t0 = std::min(t0, p[0]);
          t0_max = std::max(t0_max, p[0]);
          last_issue = std::max(last_issue, p[2]);
        }
        if (ctas == 0) continue;
        int n_late = 0, lowest_late = -1;
        std::vector<double> dep, wait, mma, end;
        std::vector<std::pair<double, std::string>> by_end;
        for (int c = 0; c < sms; ++c) {
          const uint64_t* p = ti + c * kStreamKTracePoints;
          if (p[0] == 0) continue;
          if (p[0] > t0 + 1000) {
            ++n_late;
            if (lowest_late < 0) lowest_late = c;
          }
          dep.push_back((p[1] - t0) * 1e-3);
          wait.push_back((p[3] - p[0]) * 1e-3);
          mma.push_back((p[4] - t0) * 1e-3);
          end.push_back((p[5] - t0) * 1e-3);
          by_end.push_back({(p[5] - t0) * 1e-3,
                            absl::StrFormat("%d@%u:%.1f-%.1f", c, static_cast<uint32_t>(p[6]),
                                            (p[0] - t0) * 1e-3, (p[5] - t0) * 1e-3)});
        }
        std::sort(by_end.begin(), by_end.end());
        slowest.clear();
        for (size_t j = by_end.size() > 4 ? by_end.size() - 4 : 0; j < by_end.size(); ++j) {
          absl::StrAppendFormat(&slowest, " %s", by_end[j].second);
        }
        spread.push_back((t0_max - t0) * 1e-3);
        late.push_back(n_late);
        first_late.push_back(lowest_late);
        dep_med.push_back(median(dep));
        wait_first.push_back(median(wait));
        issued.push_back((last_issue - t0) * 1e-3);
        mma_med.push_back(median(mma));
        mma_max.push_back(*std::max_element(mma.begin(), mma.end()));
        end_med.push_back(median(end));
        end_max.push_back(*std::max_element(end.begin(), end.end()));
      }
      return absl::StrFormat(
          "%3d CTAs, start spread %4.1f, %3.0f late from CTA %3.0f | past the dependency %4.1f | "
          "first k-tile after %4.1f | loads issued %6.1f | multiplies done %6.1f / %6.1f | "
          "epilogue done %6.1f / %6.1f (median/max) | slowest%s",
          ctas, median(spread), median(late), median(first_late), median(dep_med),
          median(wait_first), median(issued), median(mma_med), median(mma_max), median(end_med),
          median(end_max), slowest.c_str());
    };
    const size_t per_launch = static_cast<size_t>(sms) * kStreamKTracePoints;
    // Tile 14's timelines.
    for (size_t f = 2; f < forms.size(); ++f) {
      if (forms[f].name != "tile14 alone" && forms[f].name != "tile14 a0" &&
          forms[f].name != "tile14 a4pf64" && forms[f].name != "tile15 op" &&
          forms[f].name != "tile15 whole") {
        continue;
      }
      const int launches = 4 * slots + 4;
      DeviceBuffer trace;
      RETURN_IF_ERROR(trace.allocate(launches * per_launch * sizeof(uint64_t), "trace"));
      RETURN_IF_CUDA_ERROR(cudaMemsetAsync(trace.get(), 0, trace.size(), stream));
      for (int i = 0; i < launches; ++i) {
        RETURN_IF_ERROR(op(forms[f], i % slots, trace.as<uint64_t>() + i * per_launch, stream));
      }
      ASSIGN_OR_RETURN(const std::vector<uint64_t> t, trace_to_host(trace, stream));
      ASSIGN_OR_RETURN(const double us, median_us(stream, slots, o, [&](int s) {
                         return op(forms[f], s, nullptr, stream);
                       }));
      std::printf("streamk-trace %-22s M=%-3lld %-12s | %6.1f us | %s\n", shape_name(sc).c_str(),
                  static_cast<long long>(m), forms[f].name.c_str(), us,
                  summarize(t, launches / 4, launches).c_str());
      std::fflush(stdout);
    }
    // Tile 15's op as a layer's load's rounds find it: after an L2 read and tile 8's op (its
    // code in the SMs' instruction caches), each after another L2 read (weight copy 0).
    if (forms.back().name == "tile15 op") {
      L2FlushRead flush;
      RETURN_IF_ERROR(flush.init());
      constexpr int kLaunches = 9;
      DeviceBuffer trace;
      RETURN_IF_ERROR(trace.allocate(kLaunches * per_launch * sizeof(uint64_t), "trace"));
      RETURN_IF_CUDA_ERROR(cudaMemsetAsync(trace.get(), 0, trace.size(), stream));
      for (int i = 0; i < kLaunches; ++i) {
        RETURN_IF_ERROR(flush.enqueue(stream));
        RETURN_IF_ERROR(op(forms[0], 0, nullptr, stream));
        RETURN_IF_ERROR(flush.enqueue(stream));
        RETURN_IF_ERROR(op(forms.back(), 0, trace.as<uint64_t>() + i * per_launch, stream));
      }
      ASSIGN_OR_RETURN(const std::vector<uint64_t> t, trace_to_host(trace, stream));
      std::printf("streamk-trace %-22s M=%-3lld %-12s | after an L2 read and tile 8's op | %s\n",
                  shape_name(sc).c_str(), static_cast<long long>(m), forms.back().name.c_str(),
                  summarize(t, 1, kLaunches).c_str());
      std::fflush(stdout);
    }
    // Cold starts: tile 8's op and GEMM alone, tile 14's GEMM alone and tile 15's op with a layer's
    // load timer (after its L2 read: code, x and weights from memory; the tile tuning's untimed
    // call before each timing is not made here), over three rounds. (The in-turn timings above
    // keep the code and x in the L2, the weights not.)
    std::vector<size_t> picked;
    for (size_t f = 0; f < forms.size(); ++f) {
      const std::string& n = forms[f].name;
      if (n == "tile8 op" || n == "tile8 alone" || n == "tile14 alone" || n == "tile15 op" ||
          n == "tile15 whole") {
        picked.push_back(f);
      }
    }
    RETURN_IF_ERROR(print_as_at_load(
        "streamk-cold", sc, m, picked.size(), 3, [&](size_t c) { return forms[picked[c]].name; },
        [&](size_t c, cudaStream_t ts) { return op(forms[picked[c]], 0, nullptr, ts); },
        {{"256 channels of K primed",
          [&](size_t c, cudaStream_t ts) { return op(forms[picked[c]], 0, nullptr, ts, 1); }},
         {"every SM primed on one k-tile",
          [&](size_t c, cudaStream_t ts) { return op(forms[picked[c]], 0, nullptr, ts, 2); }}}));
  }
#else
  (void)sc, (void)b, (void)o, (void)stream;
#endif
  return absl::OkStatus();
}

// --claim: the swapped tiles whose CTAs claim their tiles at run time (tiles 12 and 13,
// cutlass_sm90_claiming_scheduler.cuh) against the same tiles on the static deal (tiles 8 and 9) at
// M = 1 and 16, in turns over three rounds, the outputs compared bit for bit. Each form is the op
// as served (the quantize kernel, then the GEMM as its programmatic dependent with 4 stages of
// weights issued before the wait, 64 KB of L2 prefetch per CTA, the last wave's 4 MB, evict-first
// weights): tile 8 and 9 ("t8", "t9"), tile 12 on the static deal through the claiming kernel (no
// counter: "c8 st"), tiles 12 and 13 drawing the next tile as the current one's loads start
// ("c8 l0", as served) or 1-4 k-tiles before they end ("c8 l1" ...); and the GEMM alone for tiles
// 8 and 12. Then the CTAs' timelines for t8, c8 l0 and c9 l0 (the producers' stamps,
// kCutlassTracePoints; medians
// over traced launches): when the last CTA got past the grid dependency, each CTA's time from then
// to its last loads issued (min / median / max), and the tiles per CTA (min / max).
absl::Status compare_claim(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                           cudaStream_t stream) {
#if QLINEAR_HAVE_CUTLASS
  const int sms = host_info().gpus[0].sm_count;
  const CutlassSm90Tile t8 = CutlassSm90Tile::k16x64x256PingpongSwap,
                        t9 = CutlassSm90Tile::k16x64x512PingpongSwap,
                        c8 = CutlassSm90Tile::k16x64x256ClaimSwap,
                        c9 = CutlassSm90Tile::k16x64x512ClaimSwap;
  struct Form {
    std::string name;
    CutlassSm90Tile tile;
    int lead = -1;  // CutlassSm90Args::claim_lead; -1: no counter (the static deal)
    bool alone = false;
  };
  const std::vector<Form> forms = {{"t8", t8},
                                   {"t9", t9},
                                   {"c8 st", c8},
                                   {"c8 l0", c8, 0},
                                   {"c8 l1", c8, 1},
                                   {"c8 l4", c8, 4},
                                   {"c9 l0", c9, 0},
                                   {"c9 l2", c9, 2},
                                   {"t8 alone", t8, -1, true},
                                   {"c8 l0 alone", c8, 0, true}};
  for (int64_t m : {int64_t{1}, int64_t{16}}) {
    const int slots = b.copies;
    const bool split = cutlass_sm90::split_quantize_rows(m, sc.k, sms);
    auto op = [&](const Form& f, int s, uint64_t* trace) -> absl::Status {
      const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(f.tile, ElemType::kBF16);
      if (!f.alone) RETURN_IF_ERROR(quantize_x(sc, b, m, b.xq.as<int8_t>(), stream, split));
      CutlassSm90Args g = served_swap_args(sc, b, m, s, f.alone);
      g.claim_lead = f.lead < 0 ? 0 : f.lead;
      g.trace = trace;
      void* workspace = nullptr;
      if (const size_t bytes = ops->workspace_bytes(g); bytes > 0 && f.lead >= 0) {
        ASSIGN_OR_RETURN(workspace, zeroed_workspace(b, bytes));
      }
      if (!ops->can_implement(g)) return absl::UnimplementedError("tile declines the shape");
      RETURN_IF_CUDA_ERROR(ops->launch(g, workspace, stream));
      return absl::OkStatus();
    };
    std::vector<std::string> names;
    std::vector<CutlassSm90Tile> tiles;
    for (const Form& f : forms) {
      names.push_back(f.name);
      tiles.push_back(f.tile);
    }
    RETURN_IF_ERROR(time_forms_in_turns(
        "claim", sc, b, m, names, tiles, [&](size_t f, int s) { return op(forms[f], s, nullptr); },
        o, stream));
    for (const size_t f : {size_t{0}, size_t{3}, size_t{6}}) {  // t8, c8 l0, c9 l0
      const int launches = 4 * slots + 4;
      const size_t per_launch = static_cast<size_t>(sms) * kCutlassTracePoints;
      DeviceBuffer trace;
      RETURN_IF_ERROR(trace.allocate(launches * per_launch * sizeof(uint64_t), "trace"));
      RETURN_IF_CUDA_ERROR(cudaMemsetAsync(trace.get(), 0, trace.size(), stream));
      for (int i = 0; i < launches; ++i) {
        RETURN_IF_ERROR(op(forms[f], i % slots, trace.as<uint64_t>() + i * per_launch));
      }
      ASSIGN_OR_RETURN(const std::vector<uint64_t> t, trace_to_host(trace, stream));
      std::vector<double> released, d_min, d_med, d_max, tiles_min, tiles_max;
      for (int i = launches / 4; i < launches; ++i) {
        const uint64_t* ti = t.data() + i * per_launch;
        uint64_t t0 = UINT64_MAX, rel = 0;
        for (int c = 0; c < sms; ++c) {
          const uint64_t* p = ti + c * kCutlassTracePoints;
          if (p[0] == 0) continue;
          t0 = std::min(t0, p[0]);
          rel = std::max(rel, p[1]);
        }
        if (t0 == UINT64_MAX) continue;
        std::vector<double> d;
        double lo = 1e9, hi = 0;
        for (int c = 0; c < sms; ++c) {
          const uint64_t* p = ti + c * kCutlassTracePoints;
          if (p[0] == 0) continue;
          d.push_back((static_cast<double>(p[2]) - static_cast<double>(rel)) * 1e-3);
          const double tiles = static_cast<double>(p[3] >> 32);
          lo = std::min(lo, tiles);
          hi = std::max(hi, tiles);
        }
        released.push_back((rel - t0) * 1e-3);
        d_min.push_back(*std::min_element(d.begin(), d.end()));
        d_med.push_back(median(d));
        d_max.push_back(*std::max_element(d.begin(), d.end()));
        tiles_min.push_back(lo);
        tiles_max.push_back(hi);
      }
      std::printf(
          "claim-trace %-22s M=%-3lld %-6s | dependency released %4.1f | loads done after it "
          "%6.1f / %6.1f / %6.1f (min/median/max) | tiles per CTA %2.0f-%2.0f\n",
          shape_name(sc).c_str(), static_cast<long long>(m), forms[f].name.c_str(),
          median(released), median(d_min), median(d_med), median(d_max), median(tiles_min),
          median(tiles_max));
      std::fflush(stdout);
    }
  }
#else
  (void)sc, (void)b, (void)o, (void)stream;
#endif
  return absl::OkStatus();
}

// --diagnose, cuda.cutlass_sm90 at M = 1 and 16 (the 64 x 64 tile and the swapped tiles, with
// the weights' evict-first hint and 64 KB of L2 prefetch per CTA, the quantize kernel splitting
// rows, as served, but every stage's weights ahead in "pdl ahead", see kSwapWeightsAheadStages) and
// at M = 64, 128 and 256: the quantize kernel then the 64 x 128 and 64 x 256 tiles (from M = 128
// also the tiles with a cluster, 64 x 128 and 128 x 128) in stream order, as its programmatic
// dependent ("pdl") and as that issuing its first stages' weights before the wait
// ("pdl ahead", tiles without a cluster), with the producers' %globaltimer stamps (medians over
// traced launches, us from the first CTA's start): the spread of CTA starts, when the last producer
// got past the grid dependency, how many CTAs started only after it, and the fastest, median and
// slowest CTA's time from then to its last loads issued; with the SMs the CTAs ran on (distinct
// SMs, most CTAs on one SM) and, for the last launch, the SMs of the 6 slowest CTAs with their
// times.
absl::Status diagnose_cutlass(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                              cudaStream_t stream) {
#if QLINEAR_HAVE_CUTLASS
  const int sms = host_info().gpus[0].sm_count;
  QuantizeParams qp;
  for (int64_t m : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{128}, int64_t{256}}) {
    const int slots = m <= 64 ? b.copies : 1;
    const bool decode = m <= 16;
    const std::vector<CutlassSm90Tile> tiles =
        decode ? std::vector<CutlassSm90Tile>{CutlassSm90Tile::k64x64x128Pingpong,
                                              CutlassSm90Tile::k16x64x256PingpongSwap,
                                              CutlassSm90Tile::k16x64x512PingpongSwap,
                                              CutlassSm90Tile::k16x128x256PingpongSwap}
               : std::vector<CutlassSm90Tile>{
                     CutlassSm90Tile::k64x128x128Pingpong, CutlassSm90Tile::k64x256x128Pingpong,
                     CutlassSm90Tile::k64x128x128PingpongC2, CutlassSm90Tile::k128x128x128Pingpong};
    const bool split = cutlass_sm90::split_quantize_rows(m, sc.k, sms);
    for (CutlassSm90Tile tile : tiles) {
      const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(tile, ElemType::kBF16);
      if (ops->cluster_ctas > 1 && m < 128) continue;
      RETURN_IF_CUDA_ERROR(ops->prepare());
      for (int form : {0, 1, 2}) {  // stream order; dependent; dependent, weights ahead
        if (form == 2 && ops->cluster_ctas > 1) continue;  // (no such form with a cluster)
        if (decode && form == 1) continue;
        const bool pdl = form > 0;
        auto op = [&](int s, uint64_t* trace) -> absl::Status {
          RETURN_IF_CUDA_ERROR(launch_quantize_s8(
              b.x.get(), ElemType::kBF16, m, sc.k, qp, b.xq.as<int8_t>(), b.sa.as<float>(),
              b.azp.as<int32_t>(), stream, nullptr, 0, nullptr, !decode || split));
          CutlassSm90Args g = tile_args(sc, b, m);
          g.w = b.w[s].as<int8_t>();
          g.pdl = pdl;
          g.weights_ahead = form == 2;
          if (decode) {
            g.weights_evict_first = true;
            g.weight_prefetch_bytes = pdl ? 64 << 10 : 0;
          }
          g.trace = trace;
          if (!ops->can_implement(g)) return absl::UnimplementedError("tile declines the shape");
          RETURN_IF_CUDA_ERROR(ops->launch(g, b.workspace.get(), stream));
          return absl::OkStatus();
        };
        ASSIGN_OR_RETURN(const double us,
                         median_us(stream, slots, o, [&](int s) { return op(s, nullptr); }));
        const int launches = 4 * slots + 4;
        const size_t per_launch = static_cast<size_t>(sms) * kCutlassTracePoints;
        DeviceBuffer trace;
        RETURN_IF_ERROR(trace.allocate(launches * per_launch * sizeof(uint64_t), "trace"));
        RETURN_IF_CUDA_ERROR(cudaMemsetAsync(trace.get(), 0, trace.size(), stream));
        for (int i = 0; i < launches; ++i) {
          RETURN_IF_ERROR(op(i % slots, trace.as<uint64_t>() + i * per_launch));
        }
        ASSIGN_OR_RETURN(const std::vector<uint64_t> t, trace_to_host(trace, stream));
        std::vector<double> spread, released, late, n_sms, most, d_min, d_med, d_max;
        std::string slowest;  // of the last traced launch: the SMs of its 6 slowest CTAs
        int ctas = 0;
        for (int i = launches / 4; i < launches; ++i) {
          const uint64_t* ti = t.data() + i * per_launch;
          uint64_t t0 = UINT64_MAX, t0_max = 0, rel = 0;
          std::map<uint32_t, int> per_sm;
          ctas = 0;
          for (int c = 0; c < sms; ++c) {
            const uint64_t* p = ti + c * kCutlassTracePoints;
            if (p[0] == 0) continue;
            ++ctas;
            t0 = std::min(t0, p[0]);
            t0_max = std::max(t0_max, p[0]);
            rel = std::max(rel, p[1]);
            ++per_sm[static_cast<uint32_t>(p[3])];
          }
          if (ctas == 0) continue;
          int started_late = 0, most_on_one = 0;
          for (int c = 0; c < sms; ++c) {
            const uint64_t* p = ti + c * kCutlassTracePoints;
            if (p[0] != 0 && p[0] >= rel) ++started_late;
          }
          for (const auto& [sm, count] : per_sm) most_on_one = std::max(most_on_one, count);
          // Each CTA's time from the grid dependency's release to its last loads issued.
          std::vector<std::pair<double, uint32_t>> d;
          for (int c = 0; c < sms; ++c) {
            const uint64_t* p = ti + c * kCutlassTracePoints;
            if (p[0] != 0) d.push_back({(p[2] - rel) * 1e-3, static_cast<uint32_t>(p[3])});
          }
          std::sort(d.begin(), d.end());
          d_min.push_back(d.front().first);
          d_med.push_back(d[d.size() / 2].first);
          d_max.push_back(d.back().first);
          slowest.clear();
          for (size_t j = d.size() > 6 ? d.size() - 6 : 0; j < d.size(); ++j) {
            absl::StrAppendFormat(&slowest, " %u:%.0f", d[j].second, d[j].first);
          }
          spread.push_back((t0_max - t0) * 1e-3);
          released.push_back((rel - t0) * 1e-3);
          late.push_back(started_late);
          n_sms.push_back(static_cast<double>(per_sm.size()));
          most.push_back(most_on_one);
        }
        std::printf(
            "diagnose-cutlass %-22s M=%-3lld tile%d %-9s | op %6.1f us | %3d CTAs on %3.0f SMs, "
            "at most %.0f on one | start spread %5.1f, past the dependency %5.1f, started after "
            "it %3.0f | loads done after it %6.1f / %6.1f / %6.1f (min/median/max), slowest "
            "SM:us%s\n",
            shape_name(sc).c_str(), static_cast<long long>(m), static_cast<int>(tile),
            form == 2 ? "pdl ahead"
            : pdl     ? "pdl"
                      : "",
            us, ctas, median(n_sms), median(most), median(spread), median(released), median(late),
            median(d_min), median(d_med), median(d_max), slowest.c_str());
        std::fflush(stdout);
      }
    }
  }
#else
  (void)sc, (void)b, (void)o, (void)stream;
#endif
  return absl::OkStatus();
}

// (2) cuda.cutlass_sm90: each tile configuration's fused GEMM (no quantize) against the bare
// cuBLASLt GEMM of the same M, and the quantize kernel alone ("quant"). From M = 512 on also the
// quantizing tiles' whole ops (marked "op", quantization included: compare with plain tile +
// quant); from M = 1024 on the 128 x 128 quantizing tile with every row quantized before the
// GEMM ("all-before": its cost without the auxiliary warps' work), and the plain 128 x 128 and
// 128 x 256 tiles' whole ops ("quant+", the quantize kernel then the GEMM, in stream order or
// with the GEMM as its programmatic dependent, "pdl"). Up to M = 256 also the whole ops of the
// tiles without a cluster: in stream order, as the programmatic dependent, and as that with each
// CTA prefetching its first weights into L2 before it waits ("pf" and the bytes per CTA), and
// as that issuing its first stages' weights into shared memory before it waits too ("ahead"),
// and from M = 128 the 64 x 128 tile with a cluster in stream order and as the dependent. From
// M = 1024, what a GEMM loses after another kernel: the plain 128 x 128 tile after a read of
// 256 MB ("flush+", the read alone is "flush"; "flush+bare" the bare cuBLASLt GEMM after it) and
// after the quantize kernel writing another xq buffer than the GEMM reads ("quant'+").
absl::Status sweep_cutlass(const ShapeCase& sc, ShapeBuffers& b, const std::vector<int64_t>& ms,
                           const Options& o, cudaStream_t stream, cublasLtHandle_t lt) {
#if QLINEAR_HAVE_CUTLASS
  const Options so = sweep_options(o);
  L2FlushRead flush;
  DeviceBuffer other_xq;
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  if (max_m >= 1024) {
    RETURN_IF_ERROR(flush.init());
    RETURN_IF_ERROR(other_xq.allocate(static_cast<size_t>(max_m * sc.k), "second xq"));
  }
  DeviceBuffer counters;
  RETURN_IF_ERROR(
      counters.allocate(static_cast<size_t>(quantizing_tile_counters(max_m)) * 4, "counters"));
  QuantizeParams qp;  // dynamic symmetric, as the op sections run
  auto flush_l2 = [&] { return flush.enqueue(stream); };
  for (int64_t m : ms) {
    // The quantize kernel on this M's activations, into `xq`.
    auto quantize_into = [&](int8_t* xq) { return quantize_x(sc, b, m, xq, stream); };
    const int slots = m <= 64 ? b.copies : 1;
    BareGemm bare;
    RETURN_IF_ERROR(bare.init(lt, m, sc.n, sc.k));
    auto bare_gemm = [&](int s) {
      return bare.enqueue(b.w[s].as<int8_t>(), b.xq.as<int8_t>(), b.acc.as<int32_t>(),
                          b.workspace.get(), stream);
    };
    ASSIGN_OR_RETURN(const double gemm_us, median_us(stream, slots, so, bare_gemm));
    std::string line =
        absl::StrFormat("cutlass-tile %-22s M=%-5lld bare %8.1f us (%s) |", shape_name(sc),
                        static_cast<long long>(m), gemm_us, bare.describe());
    const bool large = m >= 512;
    ASSIGN_OR_RETURN(const double quant_us, median_us(stream, 1, so, [&](int) {
                       return quantize_into(b.xq.as<int8_t>());
                     }));
    absl::StrAppendFormat(&line, " quant %7.1f us |", quant_us);
    if (m >= 1024) {
      ASSIGN_OR_RETURN(const double flush_us,
                       median_us(stream, 1, so, [&](int) { return flush_l2(); }));
      ASSIGN_OR_RETURN(const double flush_bare_us,
                       median_us(stream, 1, so, [&](int) -> absl::Status {
                         RETURN_IF_ERROR(flush_l2());
                         return bare_gemm(0);
                       }));
      absl::StrAppendFormat(&line, " flush %7.1f us | flush+bare %7.1f us |", flush_us,
                            flush_bare_us);
    }
    struct Variant {
      int tile;
      int64_t prefix = -1;      // quantizing tiles: rows quantized first (-1: the tile's choice)
      bool with_quant = false;  // the quantize kernel, then this GEMM: the plain tile's op
      bool pdl = false;         // ... the GEMM as the quantize kernel's programmatic dependent
      int64_t prefetch = 0;     // ... prefetching this many bytes of weights per CTA first
      int before = 0;           // 1: the L2 flush read first; 2: the quantize kernel, other xq
      bool ahead = false;       // ... issuing the first stages' weights before the wait too
    };
    std::vector<Variant> variants;
    for (int t = 0; t < kCutlassSm90Tiles; ++t) {
      const auto tile = static_cast<CutlassSm90Tile>(t);
      // 16 tokens per tile: small M only.
      if (cutlass_sm90::tile_ops(tile, ElemType::kBF16)->swaps_operands && m > 64) continue;
      if (large || !tile_quantizes(tile)) variants.push_back({t});
    }
    if (m <= 256) {
      for (CutlassSm90Tile t :
           {CutlassSm90Tile::k64x128x128Pingpong, CutlassSm90Tile::k64x64x128Pingpong,
            CutlassSm90Tile::k64x256x128Pingpong, CutlassSm90Tile::k16x64x256PingpongSwap}) {
        if (cutlass_sm90::tile_ops(t, ElemType::kBF16)->swaps_operands && m > 64) continue;
        variants.push_back({static_cast<int>(t), -1, true, false});
        for (int64_t pf : {0, 64 << 10, 128 << 10}) {
          variants.push_back({static_cast<int>(t), -1, true, true, pf});
        }
        for (int64_t pf : {0, 64 << 10}) {
          variants.push_back({static_cast<int>(t), -1, true, true, pf, 0, true});
        }
      }
      if (m >= 128) {
        // The clustered 64 x 128 tile (no prefetch: its weights are multicast).
        const int c2 = static_cast<int>(CutlassSm90Tile::k64x128x128PingpongC2);
        variants.push_back({c2, -1, true, false});
        variants.push_back({c2, -1, true, true});
      }
    }
    if (m >= 1024) {
      // All rows quantized before the GEMM: the quantizing tile's cost without its auxiliary
      // warps' work (one stage fewer, the programmatic launch, the scheduler along N).
      variants.push_back({static_cast<int>(CutlassSm90Tile::k128x128x128PingpongQ), m});
      for (CutlassSm90Tile t :
           {CutlassSm90Tile::k128x128x128Pingpong, CutlassSm90Tile::k128x256x128Coop}) {
        variants.push_back({static_cast<int>(t), -1, true, false});
        variants.push_back({static_cast<int>(t), -1, true, true});
      }
      for (int before : {1, 2}) {
        variants.push_back(
            {static_cast<int>(CutlassSm90Tile::k128x128x128Pingpong), -1, false, false, 0, before});
      }
    }
    for (const Variant& v : variants) {
      const int t = v.tile;
      const bool quantizes = tile_quantizes(static_cast<CutlassSm90Tile>(t));
      CutlassSm90Args g = tile_args(sc, b, m);
      g.pdl = v.pdl;
      g.weight_prefetch_bytes = v.prefetch;
      g.weights_ahead = v.ahead;
      if (quantizes) {
        g.x = b.x.get();
        g.x_type = ElemType::kBF16;
        g.qp = qp;
        g.counters = counters.as<int32_t>();
        g.prefix = v.prefix;
      }
      const cutlass_sm90::TileOps* ops =
          cutlass_sm90::tile_ops(static_cast<CutlassSm90Tile>(t), ElemType::kBF16);
      RETURN_IF_CUDA_ERROR(ops->prepare());
      if (!ops->can_implement(g)) {
        absl::StrAppendFormat(&line, " tile%d%s -- |", t, quantizes ? " op" : "");
        continue;
      }
      ASSIGN_OR_RETURN(const double us, median_us(stream, slots, so, [&](int s) -> absl::Status {
                         CutlassSm90Args gs = g;
                         gs.w = b.w[s].as<int8_t>();
                         if (v.with_quant) RETURN_IF_ERROR(quantize_into(b.xq.as<int8_t>()));
                         if (v.before == 1) RETURN_IF_ERROR(flush_l2());
                         if (v.before == 2) RETURN_IF_ERROR(quantize_into(other_xq.as<int8_t>()));
                         RETURN_IF_CUDA_ERROR(ops->launch(gs, b.workspace.get(), stream));
                         return absl::OkStatus();
                       }));
      absl::StrAppendFormat(&line, " %s%stile%d%s%s%s%s%s %8.1f us %6.0f TOPS x%.2f |",
                            v.with_quant ? "quant+" : "",
                            v.before == 1   ? "flush+"
                            : v.before == 2 ? "quant'+"
                                            : "",
                            t, v.pdl ? " pdl" : "", v.ahead ? " ahead" : "",
                            v.prefetch > 0 ? absl::StrFormat(" pf%lldK", v.prefetch >> 10) : "",
                            quantizes ? " op" : "", v.prefix == m ? " all-before" : "", us,
                            2.0 * m * sc.n * sc.k / (us * 1e-6) / 1e12, gemm_us / us);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
#else
  (void)sc, (void)b, (void)ms, (void)o, (void)stream, (void)lt;
#endif
  return absl::OkStatus();
}

// --scheduler: cuda.cutlass_sm90's large-M tiles (128 x 128 pingpong with a 2 x 1 cluster, and
// 128 x 256 cooperative) with each tile-scheduler walk (raster: r0 CUTLASS's choice, r1 along M,
// r2 along N; sN: the swizzle) in three settings: back to back ("warm", the cache as the previous
// call left it), after a read of 256 MB ("flush", that read's time taken off), and after the
// quantize kernel ("op", quantize + GEMM, as served), with the bare cuBLASLt GEMM warm and after
// the flush. All candidates of one M are timed in turns, so the GPU's power-capped clock weighs
// on each alike.
absl::Status sweep_scheduler(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                             cudaStream_t stream, cublasLtHandle_t lt) {
#if QLINEAR_HAVE_CUTLASS
  const Options so = sweep_options(o);
  L2FlushRead flush;
  RETURN_IF_ERROR(flush.init());
  auto flush_l2 = [&] { return flush.enqueue(stream); };
  for (int64_t m : sc.large_ms) {
    auto quantize = [&] { return quantize_x(sc, b, m, b.xq.as<int8_t>(), stream); };
    BareGemm bare;
    RETURN_IF_ERROR(bare.init(lt, m, sc.n, sc.k));
    auto bare_gemm = [&]() {
      return bare.enqueue(b.w[0].as<int8_t>(), b.xq.as<int8_t>(), b.acc.as<int32_t>(),
                          b.workspace.get(), stream);
    };
    std::vector<std::string> names;
    std::vector<std::function<absl::Status(int)>> cands;
    names.push_back("flush");
    cands.push_back([&](int) { return flush_l2(); });
    names.push_back("bare warm");
    cands.push_back([&](int) { return bare_gemm(); });
    names.push_back("bare flush");
    cands.push_back([&](int) -> absl::Status {
      RETURN_IF_ERROR(flush_l2());
      return bare_gemm();
    });
    names.push_back("quant");
    cands.push_back([&](int) { return quantize(); });
    struct Config {
      CutlassSm90Tile tile;
      int raster, swizzle;
    };
    std::vector<Config> configs;
    for (int r = 0; r < 3; ++r) {
      for (int sw : {1, 2, 4, 8}) configs.push_back({CutlassSm90Tile::k128x128x128Pingpong, r, sw});
      for (int sw : {1, 4}) configs.push_back({CutlassSm90Tile::k128x256x128Coop, r, sw});
    }
    for (const Config& cfg : configs) {
      const cutlass_sm90::TileOps* ops = cutlass_sm90::tile_ops(cfg.tile, ElemType::kBF16);
      RETURN_IF_CUDA_ERROR(ops->prepare());
      CutlassSm90Args g = tile_args(sc, b, m);
      g.w = b.w[0].as<int8_t>();
      g.raster = cfg.raster;
      g.swizzle = cfg.swizzle;
      if (!ops->can_implement(g)) continue;
      const std::string name = absl::StrFormat(
          "%s r%d s%d", cfg.tile == CutlassSm90Tile::k128x128x128Pingpong ? "128x128" : "128x256",
          cfg.raster, cfg.swizzle);
      for (int setting = 0; setting < 3; ++setting) {
        names.push_back(absl::StrCat(name, setting == 0   ? " warm"
                                           : setting == 1 ? " flush"
                                                          : " op"));
        cands.push_back([&, g, ops, setting](int) -> absl::Status {
          if (setting == 1) RETURN_IF_ERROR(flush_l2());
          if (setting == 2) RETURN_IF_ERROR(quantize());
          RETURN_IF_CUDA_ERROR(ops->launch(g, b.workspace.get(), stream));
          return absl::OkStatus();
        });
      }
    }
    ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, 1, so, cands));
    const double flush_us = us[0];
    std::printf(
        "scheduler %-22s M=%-5lld flush %.1f us; bare warm %.1f, after the flush %.1f; "
        "quant %.1f\n",
        shape_name(sc).c_str(), static_cast<long long>(m), flush_us, us[1], us[2] - flush_us,
        us[3]);
    for (size_t i = 4; i + 2 < us.size(); i += 3) {
      const std::string cfg = names[i].substr(0, names[i].size() - 5);
      std::printf(
          "scheduler %-22s M=%-5lld %-14s warm %7.1f  after the flush %7.1f  op %7.1f us"
          "  (%.0f TOPS op)\n",
          shape_name(sc).c_str(), static_cast<long long>(m), cfg.c_str(), us[i],
          us[i + 1] - flush_us, us[i + 2], 2.0 * m * sc.n * sc.k / (us[i + 2] * 1e-6) / 1e12);
    }
    std::fflush(stdout);
  }
#else
  (void)sc, (void)b, (void)o, (void)stream, (void)lt;
#endif
  return absl::OkStatus();
}

// --setup_quant: at M = 128 and 256, where every tile lies in the grid's first wave, the
// quantizing tiles with every row quantized in the GEMM's set-up (prefix 0, after a kernel that
// only zeroes the counters; cutlass_sm90_quantizing_mainloop.cuh) against the quantize kernel then
// the plain tile of the same GEMM launched as served (served_with_pdl), the GEMM alone, the
// quantize kernel alone, and the quantizing tile after the quantize kernel did every row
// ("all-before"), in turns, three rounds; y of the set-up form against the served op's, bit for
// bit.
absl::Status compare_setup_quant(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                                 cudaStream_t stream) {
#if QLINEAR_HAVE_CUTLASS
  const Options so = sweep_options(o);
  DeviceBuffer counters, y2;
  RETURN_IF_ERROR(
      counters.allocate(static_cast<size_t>(quantizing_tile_counters(256)) * 4, "counters"));
  RETURN_IF_ERROR(y2.allocate(static_cast<size_t>(256 * sc.n) * 2, "y"));
  const std::pair<CutlassSm90Tile, CutlassSm90Tile> kPairs[] = {
      {CutlassSm90Tile::k128x128x128Pingpong, CutlassSm90Tile::k128x128x128PingpongQ},
      {CutlassSm90Tile::k64x256x128Pingpong, CutlassSm90Tile::k64x256x128PingpongQ}};
  for (int64_t m : {int64_t{128}, int64_t{256}}) {
    auto quantize = [&] { return quantize_x(sc, b, m, b.xq.as<int8_t>(), stream); };
    Candidates cands;
    cands.add("quant", [&](int) { return quantize(); });
    std::string same;
    for (const auto& [plain, quantizing] : kPairs) {
      CutlassSm90Args g = tile_args(sc, b, m);
      g.w = b.w[0].as<int8_t>();
      ASSIGN_OR_RETURN(const cutlass_sm90::TileOps* ops, prepared_tile(plain, g));
      CutlassSm90Args gq = quantizing_tile_args(sc, b, m, counters);
      gq.prefix = 0;
      ASSIGN_OR_RETURN(const cutlass_sm90::TileOps* qops, prepared_tile(quantizing, gq));
      if (ops == nullptr || qops == nullptr) continue;
      const std::string tn = ops->name();
      cands.add(absl::StrCat(tn, " GEMM"), tile_call(ops, g, b, stream));
      CutlassSm90Args gs = g;
      gs.pdl = cutlass_sm90::served_with_pdl(m, *ops);
      cands.add(absl::StrCat("q+", tn, gs.pdl ? " pdl" : ""),
                tile_call(ops, gs, b, stream, quantize));
      cands.add(absl::StrCat(qops->name(), " set-up"), tile_call(qops, gq, b, stream));
      CutlassSm90Args ga = gq;
      ga.prefix = m;
      if (qops->can_implement(ga)) {
        cands.add(absl::StrCat(qops->name(), " all-before"), tile_call(qops, ga, b, stream));
      }
      // y of the set-up form against the served op's.
      const size_t y_bytes = static_cast<size_t>(m * sc.n) * 2;
      std::vector<uint8_t> y_served(y_bytes), y_setup(y_bytes);
      RETURN_IF_ERROR(quantize());
      RETURN_IF_CUDA_ERROR(ops->launch(gs, b.workspace.get(), stream));
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
      RETURN_IF_CUDA_ERROR(cudaMemcpy(y_served.data(), g.y, y_bytes, cudaMemcpyDeviceToHost));
      CutlassSm90Args gy = gq;
      gy.y = y2.get();
      // (xq and sa as garbage first: the set-up form's own stores must make y.)
      RETURN_IF_CUDA_ERROR(
          cudaMemsetAsync(b.xq.get(), 0x81, static_cast<size_t>(m * sc.k), stream));
      RETURN_IF_CUDA_ERROR(cudaMemsetAsync(b.sa.get(), 0xA5, static_cast<size_t>(m) * 4, stream));
      RETURN_IF_CUDA_ERROR(qops->launch(gy, b.workspace.get(), stream));
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
      RETURN_IF_CUDA_ERROR(cudaMemcpy(y_setup.data(), y2.get(), y_bytes, cudaMemcpyDeviceToHost));
      absl::StrAppend(&same, same.empty() ? "" : ", ", tn, ": y ",
                      y_served == y_setup ? "identical" : "DIFFERENT");
    }
    for (int round = 0; round < 3; ++round) {
      ASSIGN_OR_RETURN(const std::vector<double> us,
                       medians_in_turns(stream, 1, so, cands.enqueues));
      for (size_t i = 0; i < us.size(); ++i) {
        std::printf("setup-quant %-22s M=%-4lld round %d %-52s %8.1f us\n", shape_name(sc).c_str(),
                    static_cast<long long>(m), round, cands.names[i].c_str(), us[i]);
      }
    }
    std::printf("setup-quant %-22s M=%-4lld %s\n", shape_name(sc).c_str(),
                static_cast<long long>(m), same.c_str());
    // The 128 x 128 quantizing tile's CTAs in the set-up form (kCutlassTracePoints, from the
    // first CTA's start, medians over 6 launches of the median and the latest CTA): the set-up's
    // end (a consumer warpgroup entering the mainloop, to wait for its first k-tile), its
    // producer past the wait for its m-block's rows, and its last multiplies.
    {
      const int sms = host_info().gpus[0].sm_count;
      CutlassSm90Args gq = quantizing_tile_args(sc, b, m, counters);
      gq.prefix = 0;
      ASSIGN_OR_RETURN(const cutlass_sm90::TileOps* qops,
                       prepared_tile(CutlassSm90Tile::k128x128x128PingpongQ, gq));
      if (qops != nullptr) {
        const int launches = 8;
        const size_t per_launch = static_cast<size_t>(sms) * kCutlassTracePoints;
        DeviceBuffer trace;
        RETURN_IF_ERROR(trace.allocate(launches * per_launch * sizeof(uint64_t), "trace"));
        RETURN_IF_CUDA_ERROR(cudaMemsetAsync(trace.get(), 0, trace.size(), stream));
        for (int i = 0; i < launches; ++i) {
          CutlassSm90Args gt = gq;
          gt.trace = trace.as<uint64_t>() + i * per_launch;
          RETURN_IF_CUDA_ERROR(qops->launch(gt, b.workspace.get(), stream));
        }
        ASSIGN_OR_RETURN(const std::vector<uint64_t> t, trace_to_host(trace, stream));
        const int kPoints[] = {4, 0, 5};
        std::vector<double> med[3], late[3];
        for (int i = 2; i < launches; ++i) {
          const uint64_t* ti = t.data() + i * per_launch;
          uint64_t t0 = UINT64_MAX;
          for (int c = 0; c < sms; ++c) {
            const uint64_t* p = ti + c * kCutlassTracePoints;
            if (p[6] != 0) t0 = std::min(t0, p[6]);
          }
          if (t0 == UINT64_MAX) continue;
          for (int j = 0; j < 3; ++j) {
            std::vector<double> d;
            for (int c = 0; c < sms; ++c) {
              const uint64_t v = ti[c * kCutlassTracePoints + kPoints[j]];
              if (v != 0) d.push_back((static_cast<double>(v) - static_cast<double>(t0)) * 1e-3);
            }
            if (d.empty()) continue;
            med[j].push_back(median(d));
            late[j].push_back(*std::max_element(d.begin(), d.end()));
          }
        }
        std::string line =
            absl::StrFormat("setup-quant-trace %-22s M=%-4lld us from the first start",
                            shape_name(sc).c_str(), static_cast<long long>(m));
        const char* kNames[] = {"set-up done", "rows in", "last mma"};
        for (int j = 0; j < 3; ++j) {
          if (med[j].empty()) continue;
          absl::StrAppendFormat(&line, " | %s %.1f / %.1f", kNames[j], median(med[j]),
                                median(late[j]));
        }
        std::printf("%s (median / latest CTA)\n", line.c_str());
      }
    }
    std::fflush(stdout);
  }
#else
  (void)sc, (void)b, (void)o, (void)stream;
#endif
  return absl::OkStatus();
}

// --ring_switch: the quantize kernel's two forms for 16-bit rows of 1024 tokens and more, the warp
// form (each row read twice, the second time from L2) and the ring (read once, through shared
// memory), in turns on the same x, from 16 to 192 MB of it and K = 4096, 8192 and 14336: where
// the ring starts to win, which launch_quantize_s8's rule follows (its table; the rule overridden
// here with set_quantize_ring_min_bytes).
absl::Status compare_ring_switch(const Options& o, cudaStream_t stream) {
  const Options so = sweep_options(o);
  constexpr int64_t kMb = int64_t{1} << 20;
  constexpr int64_t kSizesMb[] = {16, 24, 32, 40, 48, 56, 64, 80, 96, 128, 192};
  constexpr int64_t kMaxBytes = 192 * kMb;
  DeviceBuffer x, xq, sa;
  RETURN_IF_ERROR(x.allocate(kMaxBytes, "x"));
  RETURN_IF_ERROR(xq.allocate(kMaxBytes / 2, "xq"));
  RETURN_IF_ERROR(sa.allocate(kMaxBytes / 2 / 4096 * sizeof(float), "sa"));
  RETURN_IF_CUDA_ERROR(cudaMemset(x.get(), 0x3c, kMaxBytes));  // bf16 0.0115 everywhere
  int l2 = 0, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
  std::printf(
      "ring-switch: the quantize kernel alone, bf16 x, in turns (L2 %d MB; served: the ring "
      "past 3/4 of it for K >= 8192, past twice it for shorter rows)\n%-12s %6s %7s %10s %10s "
      "%10s %10s\n",
      l2 >> 20, "", "K", "M", "warp us", "ring us", "ring/warp", "served us");
  absl::Status status = absl::OkStatus();
  for (int64_t k : {4096, 8192, 14336}) {
    for (int64_t mb : kSizesMb) {
      const int64_t m = mb * kMb / (2 * k);
      if (m < 1024) continue;  // other forms below 1024 tokens
      Candidates cands;
      // warp, ring, and the rule's choice (-1).
      for (int64_t min_bytes : {std::numeric_limits<int64_t>::max(), int64_t{0}, int64_t{-1}}) {
        cands.add(absl::StrCat(min_bytes), [&, min_bytes, m, k](int) {
          set_quantize_ring_min_bytes(min_bytes);
          RETURN_IF_CUDA_ERROR(launch_quantize_s8(x.get(), ElemType::kBF16, m, k, QuantizeParams{},
                                                  xq.as<int8_t>(), sa.as<float>(), nullptr,
                                                  stream));
          return absl::OkStatus();
        });
      }
      absl::StatusOr<std::vector<double>> us = medians_in_turns(stream, 1, so, cands.enqueues);
      if (!us.ok()) {
        status = us.status();
        break;
      }
      std::printf("ring-switch  %6lld %7lld %10.1f %10.1f %10.2f %10.1f   (x %lld MB)\n",
                  static_cast<long long>(k), static_cast<long long>(m), (*us)[0], (*us)[1],
                  (*us)[1] / (*us)[0], (*us)[2], static_cast<long long>(mb));
    }
    if (!status.ok()) break;
  }
  set_quantize_ring_min_bytes(-1);
  std::fflush(stdout);
  return status;
}

// --prefill: where cuda.cutlass_sm90's op loses to its GEMM alone at M >= 1024, in turns: the
// bare cuBLASLt GEMM, the quantize kernel alone, and for the large-M tiles the GEMM alone (back
// to back), the quantize kernel then the GEMM in stream order ("q+", as served at these M) and as
// its programmatic dependent ("q+ pdl"; the served launch is marked "(served)", see
// served_with_pdl), and the quantize kernel, a read of 256 MB, then the GEMM ("q+flush+", printed
// with the read's own time taken off: the GEMM finding the quantize kernel's output in HBM rather
// than in L2); then the quantizing tiles' ops, and the 128 x 128 quantizing tile with every row
// quantized first ("all-before"). Measured on the H200 with the quantize kernel's xq stores
// carrying an evict-first L2 policy or st.global.cs: the quantize kernel alone 17.7 -> 14.5 / 14.1
// us on 4096 x 4096 at M = 4096, but the op no faster on any large-M layer (within +-1% with the
// 128 x 128 tile), so its stores carry no hint. Then whether the quantize kernel can run beside
// the GEMM rather than before it: the 128 x 128 and 128 x 256 tiles' GEMM alone on a grid of
// sms - 12 and sms - 24 CTAs ("smN"), and each of those (and the whole grid) with the quantize
// kernel of the same M launched beside it on a second stream into other buffers ("|| q'"), both
// forked from and joined back into the timed stream: at the power cap, fewer SMs may cost the
// GEMM little while the freed ones quantize the next call's rows.
absl::Status compare_prefill(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                             cudaStream_t stream, cublasLtHandle_t lt) {
#if QLINEAR_HAVE_CUTLASS
  const Options so = sweep_options(o);
  L2FlushRead flush;
  RETURN_IF_ERROR(flush.init());
  DeviceBuffer counters;
  RETURN_IF_ERROR(allocate_quantizing_counters(sc, &counters));
  // The overlapped quantize kernel's own outputs and stream, and the fork and join events.
  const int64_t max_m = *std::max_element(sc.large_ms.begin(), sc.large_ms.end());
  DeviceBuffer side_xq, side_sa, side_azp;
  RETURN_IF_ERROR(side_xq.allocate(static_cast<size_t>(max_m * sc.k), "second xq"));
  RETURN_IF_ERROR(side_sa.allocate(static_cast<size_t>(max_m) * 4, "second sa"));
  RETURN_IF_ERROR(side_azp.allocate(static_cast<size_t>(max_m) * 4, "second azp"));
  struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    ~SideStream() {
      if (fork) cudaEventDestroy(fork);
      if (join) cudaEventDestroy(join);
      if (stream) cudaStreamDestroy(stream);
    }
  } side;
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking));
  RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&side.fork, cudaEventDisableTiming));
  RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&side.join, cudaEventDisableTiming));
  const int sms = host_info().gpus[0].sm_count;
  for (int64_t m : sc.large_ms) {
    auto quantize = [&] { return quantize_x(sc, b, m, b.xq.as<int8_t>(), stream); };
    BareGemm bare;
    RETURN_IF_ERROR(bare.init(lt, m, sc.n, sc.k));
    Candidates cands;
    cands.add("bare", [&](int) {
      return bare.enqueue(b.w[0].as<int8_t>(), b.xq.as<int8_t>(), b.acc.as<int32_t>(),
                          b.workspace.get(), stream);
    });
    cands.add("flush", [&](int) { return flush.enqueue(stream); });
    cands.add("quant", [&](int) { return quantize(); });
    for (CutlassSm90Tile t : kLargeMTiles) {
      CutlassSm90Args g = tile_args(sc, b, m);
      g.w = b.w[0].as<int8_t>();
      ASSIGN_OR_RETURN(const cutlass_sm90::TileOps* ops, prepared_tile(t, g));
      if (ops == nullptr) continue;
      const std::string tn = ops->name();
      cands.add(tn, tile_call(ops, g, b, stream));
      // The quantize kernel, then the GEMM in stream order and as its programmatic dependent
      // (served from M = 1024 in stream order: served_with_pdl).
      for (bool pdl : {false, true}) {
        CutlassSm90Args gp = g;
        gp.pdl = pdl;
        cands.add(absl::StrCat("q+", tn, pdl ? " pdl" : "",
                               pdl == cutlass_sm90::served_with_pdl(m, *ops) ? " (served)" : ""),
                  tile_call(ops, gp, b, stream, quantize));
      }
      cands.add(absl::StrCat("q+flush+", tn), tile_call(ops, g, b, stream, [&] {
                  RETURN_IF_ERROR(quantize());
                  return flush.enqueue(stream);
                }));
      if (t == CutlassSm90Tile::k64x256x128Pingpong) continue;
      for (const int grid : {sms, sms - 12, sms - 24}) {
        CutlassSm90Args gs = g;
        gs.sm_count = grid;
        const std::string gn = grid == sms ? tn : absl::StrCat(tn, " sm", grid);
        if (grid != sms) cands.add(gn, tile_call(ops, gs, b, stream));
        cands.add(absl::StrCat(gn, " || q'"), [&, ops, gs, m](int) -> absl::Status {
          RETURN_IF_CUDA_ERROR(cudaEventRecord(side.fork, stream));
          RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(side.stream, side.fork, 0));
          RETURN_IF_CUDA_ERROR(ops->launch(gs, b.workspace.get(), stream));
          RETURN_IF_CUDA_ERROR(launch_quantize_s8(
              b.x.get(), ElemType::kBF16, m, sc.k, QuantizeParams{}, side_xq.as<int8_t>(),
              side_sa.as<float>(), side_azp.as<int32_t>(), side.stream));
          RETURN_IF_CUDA_ERROR(cudaEventRecord(side.join, side.stream));
          RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(stream, side.join, 0));
          return absl::OkStatus();
        });
      }
    }
    for (CutlassSm90Tile t :
         {CutlassSm90Tile::k128x128x128PingpongQ, CutlassSm90Tile::k64x256x128PingpongQ}) {
      const CutlassSm90Args g = quantizing_tile_args(sc, b, m, counters);
      ASSIGN_OR_RETURN(const cutlass_sm90::TileOps* ops, prepared_tile(t, g));
      if (ops == nullptr) continue;
      for (bool all_before : {false, true}) {
        if (all_before && t != CutlassSm90Tile::k128x128x128PingpongQ) continue;
        CutlassSm90Args gq = g;
        gq.prefix = all_before ? m : -1;
        cands.add(absl::StrCat(ops->name(), all_before ? " all-before" : ""),
                  tile_call(ops, gq, b, stream));
      }
    }
    ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, 1, so, cands.enqueues));
    const std::vector<std::string>& names = cands.names;
    const double flush_us = us[1];
    for (size_t i = 0; i < us.size(); ++i) {
      const bool flushed = absl::StartsWith(names[i], "q+flush+");
      std::printf(
          "prefill %-22s M=%-5lld %-44s %8.1f us%s\n", shape_name(sc).c_str(),
          static_cast<long long>(m), names[i].c_str(), us[i],
          flushed ? absl::StrFormat("  (%.1f without the read)", us[i] - flush_us).c_str() : "");
    }
    std::fflush(stdout);
  }
#else
  (void)sc, (void)b, (void)o, (void)stream, (void)lt;
#endif
  return absl::OkStatus();
}

// --energy: whether the GPU's power cap bounds the large-M ops. Each candidate (the bare
// cuBLASLt GEMM, the quantize kernel, cuda.cutlass_sm90's GEMM alone and its op as served with
// the 128 x 128, 64 x 256 and 128 x 256 tiles, and the 128 x 128 quantizing tile's op) runs back to
// back for kEnergyWarmS, so that the clock settles where the load holds it, then for
// kEnergyMeasureS while the GPU's energy counter and SM clock are read (NVML, gpu_power.h): its
// time and energy per call, the mean power, the median SM clock, how long after its start the
// clock came within 2% of that median (the first candidate after a second's idle), the
// clock-event reasons seen and how often the energy counter moved, in two rounds, the candidates
// in turns. Per tile it then sets the op against two models: the
// GEMM's time plus the quantize kernel's (nothing overlapped), and the two kernels' energy at the
// GEMM's power (overlapped perfectly, but bound by the power the GEMM alone already draws).
constexpr double kEnergyWarmS = 0.3;
constexpr double kEnergyMeasureS = 0.6;
constexpr double kEnergyReplayUs = 5000;  // calls captured per graph: about this long

struct EnergyRun {
  double us = 0, mj = 0, watts = 0, mhz = 0;
  uint64_t reasons = 0;
  double settle_ms = -1;        // the clock within 2% of mhz, from the start of the warm-up
  double counter_step_ms = -1;  // the energy counter's mean interval between changes
};

// Replays `graph` (`calls` calls each) for warm_s, then for measure_s while reading `power`.
absl::StatusOr<EnergyRun> replay_for_energy(const GpuPower& power, cudaStream_t stream,
                                            cudaGraphExec_t graph, int64_t calls,
                                            double replay_us) {
  using Clock = std::chrono::steady_clock;
  // Replays in batches of about 50 ms, waiting for each, until `seconds` have passed.
  const int64_t batch = std::max<int64_t>(1, static_cast<int64_t>(50e3 / replay_us));
  auto replay_for = [&](double seconds, int64_t* replays) -> absl::Status {
    const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(seconds));
    *replays = 0;
    while (Clock::now() < end) {
      for (int64_t i = 0; i < batch; ++i) RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graph, stream));
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
      *replays += batch;
    }
    return absl::OkStatus();
  };
  // The sampler reads the energy counter with its time, the SM clock and the clock-event reasons
  // every 2 ms through both phases; the power is the slope of a least-squares line through the
  // measured phase's energy samples (the counter advances in steps, so that two readings alone,
  // 0.6 s apart, varied by +-10%).
  struct Sample {
    double t;  // s since the warm-up began
    double mj;
    unsigned mhz;
    uint64_t reasons;
  };
  std::vector<Sample> samples;
  std::atomic<bool> stop{false};
  absl::Status sample_status = absl::OkStatus();
  const Clock::time_point t0 = Clock::now();
  std::thread sampler([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      absl::StatusOr<uint64_t> e = power.energy_mj();
      absl::StatusOr<unsigned> c = power.sm_clock_mhz();
      absl::StatusOr<uint64_t> r = power.clock_event_reasons();
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      for (const absl::Status& st : {e.status(), c.status(), r.status()}) {
        if (!st.ok()) {
          sample_status = st;
          return;
        }
      }
      samples.push_back({t, static_cast<double>(*e), *c, *r});
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  int64_t replays = 0;
  absl::Status status = replay_for(kEnergyWarmS, &replays);
  const double t_measure = std::chrono::duration<double>(Clock::now() - t0).count();
  cudaEvent_t ev[2] = {nullptr, nullptr};
  for (cudaEvent_t& e : ev) {
    if (status.ok() && cudaEventCreate(&e) != cudaSuccess) {
      status = absl::InternalError("cudaEventCreate failed");
    }
  }
  if (status.ok() && cudaEventRecord(ev[0], stream) != cudaSuccess) {
    status = absl::InternalError("cudaEventRecord failed");
  }
  if (status.ok()) status = replay_for(kEnergyMeasureS, &replays);
  if (status.ok() && cudaEventRecord(ev[1], stream) != cudaSuccess) {
    status = absl::InternalError("cudaEventRecord failed");
  }
  if (status.ok() && cudaEventSynchronize(ev[1]) != cudaSuccess) {
    status = absl::InternalError("cudaEventSynchronize failed");
  }
  stop = true;
  sampler.join();
  float ms = 0;
  if (status.ok() && cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess) {
    status = absl::InternalError("cudaEventElapsedTime failed");
  }
  for (cudaEvent_t e : ev) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(sample_status);
  std::vector<Sample> measured;
  for (const Sample& x : samples) {
    if (x.t >= t_measure) measured.push_back(x);
  }
  if (measured.size() < 10) return absl::InternalError("too few energy samples");
  double st = 0, se = 0;
  for (const Sample& x : measured) st += x.t, se += x.mj;
  st /= measured.size();
  se /= measured.size();
  double stt = 0, ste = 0;
  int steps = 0;
  std::vector<unsigned> clocks;
  EnergyRun r;
  for (size_t i = 0; i < measured.size(); ++i) {
    const Sample& x = measured[i];
    stt += (x.t - st) * (x.t - st);
    ste += (x.t - st) * (x.mj - se);
    steps += i > 0 && x.mj != measured[i - 1].mj;
    clocks.push_back(x.mhz);
    r.reasons |= x.reasons;
  }
  // A slope needs the counter to have moved; a driver that updates it more rarely than this window
  // gives no power to report.
  if (steps < 2) {
    return absl::UnavailableError(
        absl::StrFormat("NVML's energy counter moved %d times in %.1f s; no power to report", steps,
                        kEnergyMeasureS));
  }
  r.us = 1e3 * ms / static_cast<double>(replays * calls);
  r.watts = ste / stt / 1e3;     // mJ/s -> W
  r.mj = r.watts * r.us * 1e-3;  // W x us = uJ
  std::sort(clocks.begin(), clocks.end());
  r.mhz = clocks[clocks.size() / 2];
  // When the clock first came within 2% of the measured phase's median, and how often the energy
  // counter moved.
  for (const Sample& x : samples) {
    if (std::abs(x.mhz - r.mhz) <= 0.02 * r.mhz) {
      r.settle_ms = 1e3 * x.t;
      break;
    }
  }
  r.counter_step_ms = 1e3 * (measured.back().t - measured.front().t) / steps;
  return r;
}

// --profile: the GEMM alone of tile o.profile_tile at M = o.profile_m, one untimed launch then
// three timed, over the rotated weight copies, for a profiler to take one launch: e.g.
// ncu --launch-skip 1 --launch-count 1 -k regex:device_kernel.
absl::Status profile_tile(const ShapeCase& sc, ShapeBuffers& b, const Options& o,
                          cudaStream_t stream) {
#if QLINEAR_HAVE_CUTLASS
  if (o.profile_tile < 0 || o.profile_tile >= kCutlassSm90Tiles) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--profile_tile must be 0..%d", kCutlassSm90Tiles - 1));
  }
  if (o.profile_m < 1 || o.profile_m > 256) {
    return absl::InvalidArgumentError("--profile_m must be 1..256");
  }
  const auto tile = static_cast<CutlassSm90Tile>(o.profile_tile);
  if (tile_quantizes(tile)) {
    return absl::InvalidArgumentError(
        "--profile_tile: a quantizing tile takes x; pick a plain one");
  }
  CutlassSm90Args g = tile_args(sc, b, o.profile_m);
  g.w = b.w[0].as<int8_t>();
  ASSIGN_OR_RETURN(const cutlass_sm90::TileOps* ops, prepared_tile(tile, g));
  if (ops == nullptr) return absl::InvalidArgumentError("the tile cannot run this shape");
  Options once = o;
  once.warmup = 1;
  once.reps = 3;
  ASSIGN_OR_RETURN(const double us,
                   median_us(stream, b.copies, once, [&](int slot) -> absl::Status {
                     CutlassSm90Args gs = g;
                     gs.w = b.w[slot].as<int8_t>();
                     RETURN_IF_CUDA_ERROR(ops->launch(gs, b.workspace.get(), stream));
                     return absl::OkStatus();
                   }));
  std::printf("profile %s M=%lld %s: %.1f us (median of 3 after 1)\n", shape_name(sc).c_str(),
              static_cast<long long>(o.profile_m), ops->name(), us);
  return absl::OkStatus();
#else
  (void)sc, (void)b, (void)o, (void)stream;
  return absl::FailedPreconditionError("built without cuda.cutlass_sm90");
#endif
}

absl::Status compare_energy(const ShapeCase& sc, ShapeBuffers& b, cudaStream_t stream,
                            cublasLtHandle_t lt) {
#if QLINEAR_HAVE_CUTLASS
  GpuPower power;
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  RETURN_IF_ERROR(power.init(device));
  ASSIGN_OR_RETURN(const unsigned limit_mw, power.power_limit_mw());
  DeviceBuffer counters;
  RETURN_IF_ERROR(allocate_quantizing_counters(sc, &counters));
  for (int64_t m : sc.large_ms) {
    auto quantize = [&] { return quantize_x(sc, b, m, b.xq.as<int8_t>(), stream); };
    BareGemm bare;
    RETURN_IF_ERROR(bare.init(lt, m, sc.n, sc.k));
    Candidates cands;
    cands.add("cuBLASLt GEMM", [&](int) {
      return bare.enqueue(b.w[0].as<int8_t>(), b.xq.as<int8_t>(), b.acc.as<int32_t>(),
                          b.workspace.get(), stream);
    });
    cands.add("quantize", [&](int) { return quantize(); });
    std::vector<std::string> tiles;  // tiles with both a GEMM and an op candidate
    for (CutlassSm90Tile t : kLargeMTiles) {
      CutlassSm90Args g = tile_args(sc, b, m);
      g.w = b.w[0].as<int8_t>();
      ASSIGN_OR_RETURN(const cutlass_sm90::TileOps* ops, prepared_tile(t, g));
      if (ops == nullptr) continue;
      tiles.push_back(ops->name());
      cands.add(absl::StrCat("GEMM ", ops->name()), tile_call(ops, g, b, stream));
      CutlassSm90Args gp = g;
      gp.pdl = cutlass_sm90::served_with_pdl(m, *ops);  // as served
      cands.add(absl::StrCat("op ", ops->name()), tile_call(ops, gp, b, stream, quantize));
    }
    {
      const CutlassSm90Args g = quantizing_tile_args(sc, b, m, counters);
      ASSIGN_OR_RETURN(const cutlass_sm90::TileOps* ops,
                       prepared_tile(CutlassSm90Tile::k128x128x128PingpongQ, g));
      if (ops != nullptr) cands.add(absl::StrCat("op ", ops->name()), tile_call(ops, g, b, stream));
    }
    // Each candidate as a graph of about kEnergyReplayUs of calls, its call timed first.
    const std::vector<std::string>& names = cands.names;
    const size_t n = names.size();
    std::vector<cudaGraphExec_t> graphs(n, nullptr);
    std::vector<int64_t> calls(n, 1);
    std::vector<double> replay_us(n, 0);
    Options one_call;
    one_call.reps = 5;
    one_call.warmup = 1;
    absl::Status status = absl::OkStatus();
    for (size_t c = 0; c < n; ++c) {
      const std::function<absl::Status(int)>& enqueue = cands.enqueues[c];
      absl::StatusOr<double> us = median_us(stream, 1, one_call, enqueue);
      if (!us.ok()) {
        status = us.status();
        break;
      }
      calls[c] = std::max<int64_t>(1, static_cast<int64_t>(kEnergyReplayUs / (*us + 1)));
      replay_us[c] = calls[c] * *us;
      absl::StatusOr<cudaGraphExec_t> graph = capture_graph(stream, [&]() -> absl::Status {
        for (int64_t i = 0; i < calls[c]; ++i) RETURN_IF_ERROR(enqueue(0));
        return absl::OkStatus();
      });
      if (!graph.ok()) {
        status = graph.status();
        break;
      }
      graphs[c] = *graph;
    }
    constexpr int kRounds = 2;
    std::vector<std::vector<EnergyRun>> runs(n);
    // The first candidate starts from an idle GPU: how long the clock takes to settle at the cap.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    for (int round = 0; round < kRounds && status.ok(); ++round) {
      for (size_t c = 0; c < n && status.ok(); ++c) {
        absl::StatusOr<EnergyRun> r =
            replay_for_energy(power, stream, graphs[c], calls[c], replay_us[c]);
        if (!r.ok()) {
          status = r.status();
          break;
        }
        runs[c].push_back(*r);
        std::printf(
            "energy %-22s M=%-5lld round %d  %-40s %8.1f us %8.2f mJ %5.0f W %5.0f MHz (settled "
            "%.0f ms%s)  %s; energy counter moved every %.1f ms\n",
            shape_name(sc).c_str(), static_cast<long long>(m), round + 1, names[c].c_str(), r->us,
            r->mj, r->watts, r->mhz, r->settle_ms, round == 0 && c == 0 ? " after 1 s idle" : "",
            GpuPower::describe_reasons(r->reasons).c_str(), r->counter_step_ms);
        std::fflush(stdout);
      }
    }
    for (cudaGraphExec_t g : graphs) {
      if (g != nullptr) cudaGraphExecDestroy(g);
    }
    RETURN_IF_ERROR(status);
    // The rounds' means, and the models per tile.
    auto mean = [&](const std::string& name) {
      EnergyRun a;
      for (size_t c = 0; c < names.size(); ++c) {
        if (names[c] != name) continue;
        for (const EnergyRun& r : runs[c]) {
          a.us += r.us / runs[c].size();
          a.mj += r.mj / runs[c].size();
          a.watts += r.watts / runs[c].size();
        }
      }
      return a;
    };
    const EnergyRun q = mean("quantize"), lt_gemm = mean("cuBLASLt GEMM");
    for (const std::string& t : tiles) {
      const EnergyRun g = mean(absl::StrCat("GEMM ", t)), op = mean(absl::StrCat("op ", t));
      std::printf(
          "energy %-22s M=%-5lld %-26s op %7.1f us %7.2f mJ (x%.2f the cuBLASLt GEMM's %.1f us); "
          "GEMM + quantize: by time %7.1f us, by energy at the GEMM's %3.0f W %7.1f us (power "
          "limit %u W)\n",
          shape_name(sc).c_str(), static_cast<long long>(m), t.c_str(), op.us, op.mj,
          lt_gemm.us / op.us, lt_gemm.us, g.us + q.us, g.watts, 1e3 * (g.mj + q.mj) / g.watts,
          limit_mw / 1000);
    }
    std::fflush(stdout);
  }
#else
  (void)sc, (void)b, (void)stream, (void)lt;
#endif
  return absl::OkStatus();
}

// (3) Every CUDA kernel's op on one shape, for each M. Where the weights do not rotate (M > 64)
// the bare GEMM and the ops are timed in turns (medians_in_turns): under a sustained int8 GEMM
// load the H200 holds its power at the 700 W limit and its SM clock drops from 1980 MHz to
// 1215-1830 MHz, 0.1-0.25 s after an idle GPU starts (NVML: software power cap; --energy), so
// whichever is timed first runs at the highest clock. Measured: one after the other, the bare GEMM
// timed first on 8192 x 8192 at M = 2048 read 176.8 us, and 192.6-222.1 us timed again after the
// other candidates.
absl::Status run_shape(const ShapeCase& sc, const Registry& registry, const Options& o,
                       cudaStream_t stream, cublasLtHandle_t lt, std::vector<Point>* points) {
  const int64_t n = sc.n, k = sc.k;
  if (o.tail && n / 64 <= host_info().gpus[0].sm_count) return absl::OkStatus();  // no last wave
  std::vector<int64_t> ms(std::begin(kSmallMs), std::end(kSmallMs));
  ms.insert(ms.end(), sc.large_ms.begin(), sc.large_ms.end());
  if (o.small_m) ms = {1, 2, 4, 8, 16, 32};
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
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
  ShapeBuffers b;
  b.copies = static_cast<int>(std::clamp<size_t>((kRotateBytes + w_bytes - 1) / w_bytes, 2, 16));

  // Inputs for the largest M; smaller M use the leading rows.
  const std::vector<uint16_t> x_host = random_bf16(rng, static_cast<size_t>(max_m * k));
  const std::vector<int8_t> xq_host = random_int8(rng, static_cast<size_t>(max_m * k));
  const std::vector<float> sa_host = random_floats(rng, static_cast<size_t>(max_m), 1e-3f, 2e-2f);
  b.w.resize(b.copies);
  RETURN_IF_ERROR(b.x.allocate(x_host.size() * 2, "x"));
  RETURN_IF_CUDA_ERROR(cudaMemcpy(b.x.get(), x_host.data(), b.x.size(), cudaMemcpyHostToDevice));
  // Room for the rows cuda.cutlass_sm90's loads cover (tile_args).
  RETURN_IF_ERROR(b.xq.allocate(static_cast<size_t>(cutlass_sm90::xq_rows_for(max_m) * k), "xq"));
  RETURN_IF_CUDA_ERROR(cudaMemset(b.xq.get(), 0, b.xq.size()));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpy(b.xq.get(), xq_host.data(), xq_host.size(), cudaMemcpyHostToDevice));
  RETURN_IF_ERROR(b.y.allocate(static_cast<size_t>(max_m * n) * 2, "y"));
  RETURN_IF_ERROR(b.acc.allocate(static_cast<size_t>(max_m * n) * 4, "acc"));
  RETURN_IF_ERROR(b.workspace.allocate(kWorkspaceBytes, "workspace"));
  RETURN_IF_ERROR(b.sb.allocate(static_cast<size_t>(n) * 4, "sb"));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpy(b.sb.get(), weights->sb.data(), b.sb.size(), cudaMemcpyHostToDevice));
  // The bias as the kernels take it for a bf16 y (bias_v: rounded to y's type and widened back,
  // as a layer prepares it), so that the sections' direct calls write the served op's y; and the
  // same values in bf16 for the "vLLM" anchor, which holds its bias in y's type.
  {
    std::vector<float> bias_v(weights->bias.size());
    for (size_t i = 0; i < bias_v.size(); ++i) {
      bias_v[i] = round_to_dtype(weights->bias[i], DType::kBF16);
    }
    RETURN_IF_ERROR(b.bias.allocate(bias_v.size() * 4, "bias"));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpy(b.bias.get(), bias_v.data(), b.bias.size(), cudaMemcpyHostToDevice));
#if QLINEAR_HAVE_CUTLASS
    std::vector<uint16_t> bias16(bias_v.size());
    for (size_t i = 0; i < bias_v.size(); ++i) bias16[i] = f32_to_bf16(bias_v[i]);
    RETURN_IF_ERROR(b.vllm_bias.allocate(bias16.size() * 2, "vLLM anchor bias"));
    RETURN_IF_CUDA_ERROR(
        cudaMemcpy(b.vllm_bias.get(), bias16.data(), b.vllm_bias.size(), cudaMemcpyHostToDevice));
#endif
  }
  RETURN_IF_ERROR(b.sa.allocate(static_cast<size_t>(max_m) * 4, "sa"));
  RETURN_IF_CUDA_ERROR(cudaMemcpy(b.sa.get(), sa_host.data(), b.sa.size(), cudaMemcpyHostToDevice));
  RETURN_IF_ERROR(b.azp.allocate(static_cast<size_t>(max_m) * 4, "azp"));
  RETURN_IF_CUDA_ERROR(cudaMemset(b.azp.get(), 0, b.azp.size()));
  RETURN_IF_ERROR(b.adj.allocate(static_cast<size_t>(n) * 4, "adj"));
  RETURN_IF_CUDA_ERROR(cudaMemset(b.adj.get(), 0, b.adj.size()));
  for (DeviceBuffer& w : b.w) {
    RETURN_IF_ERROR(w.allocate(w_bytes, "weight copies"));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(w.get(), weights->w.data(), w_bytes, cudaMemcpyHostToDevice));
  }

  if (!o.profile.empty()) return profile_tile(sc, b, o, stream);
  if (o.reads) return compare_reads(sc, b, o, stream);
  if (o.sm_rate) return compare_sm_rate(sc, b, o, stream);
  if (o.fixed_cost) return compare_fixed_cost(sc, b, o, stream);
  if (o.scheduler) return sweep_scheduler(sc, b, o, stream, lt);
  if (o.prefill) return compare_prefill(sc, b, o, stream, lt);
  if (o.setup_quant) return compare_setup_quant(sc, b, o, stream);
  if (o.energy) return compare_energy(sc, b, stream, lt);
  if (o.stream_prefetch) return compare_stream_prefetch(sc, b, o, stream);
  if (o.weights_hint || o.vllm || o.pad_rows || o.swap || o.tail) {
    return compare_weights_hint(sc, b, o, stream, registry, *weights);
  }
  if (o.streamk) return compare_streamk(sc, b, o, stream);
  if (o.claim) return compare_claim(sc, b, o, stream);
  if (o.diagnose) {
    RETURN_IF_ERROR(diagnose_gemv(sc, b, o, stream, lt));
    RETURN_IF_ERROR(diagnose_stream(sc, b, o, stream));
    return diagnose_cutlass(sc, b, o, stream);
  }
  if (o.sweep) {
    RETURN_IF_ERROR(sweep_gemv(sc, b, o, stream));
  }
  if (o.sweep && !o.small_m) {
    std::vector<int64_t> tile_ms = {1, 16, 64, 128, 256};
    tile_ms.insert(tile_ms.end(), sc.large_ms.begin(), sc.large_ms.end());
    RETURN_IF_ERROR(sweep_cutlass(sc, b, tile_ms, o, stream, lt));
  }

  // Every CUDA kernel that can run this layer at some M, each prepared `copies` times on as many
  // LayerWeights (the CUDA kernels of one LayerWeights share one device copy; rotation needs
  // distinct copies). As in the server (--share-tuning), the copies after the first take what the
  // first one's load timed (cuda.gemv_s8, which does not share, times its plans per copy); with
  // --share_tuning=false each copy times its own.
  TuningCache shared_tuning;
  TuningCache* const tuning = o.share_tuning ? &shared_tuning : nullptr;
  std::vector<std::shared_ptr<const LayerWeights>> weight_copies = {weights};
  while (static_cast<int>(weight_copies.size()) < b.copies) {
    weight_copies.push_back(std::make_shared<const LayerWeights>(*weights));
  }
  struct KernelCopies {
    const Kernel* kernel;
    std::vector<std::unique_ptr<PreparedKernel>> prepared;
  };
  std::vector<KernelCopies> kernels;
  for (const Kernel* kern : bench_kernels(registry)) {
    if (!registry.usable(*kern, host_info()).ok()) continue;
    if (!kern->can_implement(weights->config, ProblemShape{1, n, k, DType::kBF16, DType::kBF16})
             .ok() &&
        !kern->can_implement(weights->config, ProblemShape{max_m, n, k, DType::kBF16, DType::kBF16})
             .ok()) {
      continue;
    }
    KernelCopies kc{kern, {}};
    for (int c = 0; c < b.copies; ++c) {
      ASSIGN_OR_RETURN(std::unique_ptr<PreparedKernel> p,
                       kern->prepare_with_tuning(*weight_copies[c], PrepareContext{tuning}));
      if (dynamic_cast<CudaPreparedKernel*>(p.get()) == nullptr) break;
      kc.prepared.push_back(std::move(p));
    }
    if (!kc.prepared.empty()) kernels.push_back(std::move(kc));
  }
  size_t scratch_bytes = 256;
  for (const auto& kc : kernels) {
    scratch_bytes = std::max(
        scratch_bytes,
        static_cast<const CudaPreparedKernel*>(kc.prepared[0].get())->device_scratch_bytes(max_m));
  }
  RETURN_IF_ERROR(b.scratch.allocate(scratch_bytes, "kernel scratch"));

  // The weights read alone (see Point::read_us), once per shape.
  ASSIGN_OR_RETURN(const double read_us, print_weights_read(sc, b, o, stream));

#if QLINEAR_HAVE_CUTLASS
  // The "vLLM" anchor's own output.
  DeviceBuffer vllm_y;
  RETURN_IF_ERROR(vllm_y.allocate(static_cast<size_t>(max_m * n) * 2, "vLLM anchor y"));
#endif

  for (int64_t m : ms) {
    const int slots = m <= 64 ? b.copies : 1;
    Point pt;
    pt.read_us = m <= 64 ? read_us : 0;
    pt.shape = shape_name(sc);
    pt.n = n;
    pt.k = k;
    pt.m = m;
    BareGemm bare;
    RETURN_IF_ERROR(bare.init(lt, m, n, k));
    const std::function<absl::Status(int)> bare_call = [&](int s) {
      return bare.enqueue(b.w[s].as<int8_t>(), b.xq.as<int8_t>(), b.acc.as<int32_t>(),
                          b.workspace.get(), stream);
    };
    const ProblemShape shape{m, n, k, DType::kBF16, DType::kBF16};
    std::vector<const KernelCopies*> able;
    for (const auto& kc : kernels) {
      if (kc.kernel->can_implement(weights->config, shape).ok()) able.push_back(&kc);
    }
    auto op_call = [&](const KernelCopies& kc) -> std::function<absl::Status(int)> {
      return [&, prepared = &kc.prepared](int s) {
        return run_served_op(*static_cast<const CudaPreparedKernel*>((*prepared)[s].get()), b, m,
                             b.scratch.get(), stream);
      };
    };
    // The "vLLM" anchor (vllm_sm90.h): the quantize kernel, then vLLM's GEMM for this M and N.
    std::function<absl::Status(int)> vllm_call;
#if QLINEAR_HAVE_CUTLASS
    const VllmAnchor vllm = vllm_anchor(sc, b, m, vllm_y.get(), true, stream);
    vllm_call = vllm.call;
#endif
    if (slots == 1) {
      // The bare GEMM and every op in turns (see above).
      std::vector<std::function<absl::Status(int)>> calls = {bare_call};
      for (const KernelCopies* kc : able) calls.push_back(op_call(*kc));
      if (vllm_call) calls.push_back(vllm_call);
      ASSIGN_OR_RETURN(const std::vector<double> us, medians_in_turns(stream, 1, o, calls));
      pt.gemm_us = us[0];
      for (size_t j = 0; j < able.size(); ++j) {
        pt.op_us[std::string(able[j]->kernel->name())] = us[j + 1];
      }
      if (vllm_call) pt.vllm_us = us.back();
    } else {
      // Rotating weights: each alone, so that no op finds another's weights in L2.
      ASSIGN_OR_RETURN(pt.gemm_us, median_us(stream, slots, o, bare_call));
      for (const KernelCopies* kc : able) {
        ASSIGN_OR_RETURN(
            const double op_us,
            median_us(stream, std::min<int>(slots, kc->prepared.size()), o, op_call(*kc)));
        pt.op_us[std::string(kc->kernel->name())] = op_us;
      }
      if (vllm_call) {
        ASSIGN_OR_RETURN(pt.vllm_us, median_us(stream, slots, o, vllm_call));
      }
    }
    const MBucket& bucket = m_buckets()[m_bucket_index(m)];
    // What the server runs: its autotune keeps, per M bucket, the fastest of the GPU kernels that
    // prefer the bucket (Layer::create); here that is the fastest of them measured at this M
    // (the server measures once per bucket, at the bucket's largest M or 2048).
    pt.dispatched = "-";
    for (const auto& [name, us] : pt.op_us) {
      const Kernel* k = registry.find(name);
      if (k == nullptr || !k->preferred_m().contains(bucket.lo, bucket.hi)) continue;
      if (pt.dispatched == "-" || us < pt.op_us[pt.dispatched]) pt.dispatched = name;
    }

    const double fl = floor_us(m, n, k);
    const double ops = 2.0 * m * n * k;
    std::printf("%-22s %5lld  %-18s %9.1f us %7.1f TOPS %6.2f TB/s x_floor %5.2f\n",
                pt.shape.c_str(), static_cast<long long>(m), "cublasLt-gemm-s32", pt.gemm_us,
                ops / (pt.gemm_us * 1e-6) / 1e12, n * k / (pt.gemm_us * 1e-6) / 1e12,
                pt.gemm_us / fl);
    for (const auto& [name, us] : pt.op_us) {
      // The kernel's own choice at this M (the first copy's: at large M the only one timed). With
      // --share_tuning=false each copy timed its own choices at load, and the rotation runs each
      // copy's: where some copy chose otherwise, the time is their mix, and the line says how
      // many did.
      std::string how;
      for (const auto& kc : kernels) {
        if (kc.kernel->name() != name) continue;
        how = kc.prepared[0]->variant(m);
        // (The choice without the times at load that cuda.cutlass_sm90's explanation ends with.)
        // (Nor the note that a copy took the first one's choices.)
        auto choice = [](const std::string& v) {
          return absl::StrReplaceAll(v.substr(0, v.find("; at load, M=")),
                                     {{std::string(kTunedByEarlierLayer), ""}});
        };
        int others = 0;
        const size_t timed = std::min<size_t>(slots, kc.prepared.size());  // as the timing rotates
        for (size_t c = 1; c < timed; ++c) {
          others += choice(kc.prepared[c]->variant(m)) != choice(how);
        }
        if (others > 0) {
          absl::StrAppendFormat(&how, " [%d of the %d weight copies rotated chose otherwise]",
                                others, static_cast<int>(timed));
        }
      }
      std::printf("%-22s %5lld  %-18s %9.1f us %7.1f TOPS %6.2f TB/s x_floor %5.2f%s%s%s\n",
                  pt.shape.c_str(), static_cast<long long>(m), name.c_str(), us,
                  ops / (us * 1e-6) / 1e12, n * k / (us * 1e-6) / 1e12, us / fl,
                  name == pt.dispatched ? "  <- dispatched" : "", how.empty() ? "" : "  ",
                  how.c_str());
    }
#if QLINEAR_HAVE_CUTLASS
    if (vllm_call) {
      // Its y against the dispatched op's, on the same weights: the same function for this
      // scheme, so bit for bit.
      std::string same = "not compared";
      for (const auto& kc : kernels) {
        if (kc.kernel->name() != pt.dispatched) continue;
        RETURN_IF_ERROR(op_call(kc)(0));
        RETURN_IF_ERROR(vllm_call(0));
        RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
        const size_t bytes = static_cast<size_t>(m * n) * 2;
        std::vector<uint16_t> ours(bytes / 2), theirs(bytes / 2);
        RETURN_IF_CUDA_ERROR(cudaMemcpy(ours.data(), b.y.get(), bytes, cudaMemcpyDeviceToHost));
        RETURN_IF_CUDA_ERROR(
            cudaMemcpy(theirs.data(), vllm_y.get(), bytes, cudaMemcpyDeviceToHost));
        size_t differ = 0;
        for (size_t i = 0; i < ours.size(); ++i) differ += ours[i] != theirs[i];
        same = differ == 0 ? "y equals the dispatched op's"
                           : absl::StrFormat("y DIFFERS from the dispatched op's in %zu of %zu",
                                             differ, ours.size());
      }
      std::printf("%-22s %5lld  %-18s %9.1f us %7.1f TOPS %6.2f TB/s x_floor %5.2f  %s; %s\n",
                  pt.shape.c_str(), static_cast<long long>(m), "vLLM", pt.vllm_us,
                  ops / (pt.vllm_us * 1e-6) / 1e12, n * k / (pt.vllm_us * 1e-6) / 1e12,
                  pt.vllm_us / fl, vllm_sm90::config_name(vllm.args), same.c_str());
    }
#endif
    std::fflush(stdout);
    points->push_back(std::move(pt));
  }
  return absl::OkStatus();
}

// A CUDA runtime result as a status.
absl::Status cuda_status(cudaError_t e) {
  RETURN_IF_CUDA_ERROR(e);
  return absl::OkStatus();
}

// The process's resident memory in bytes (0 where /proc cannot tell).
int64_t rss_bytes() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  const int got = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  return got == 2 ? static_cast<int64_t>(pages_resident) * sysconf(_SC_PAGESIZE) : 0;
}

// Median and p90 in us of `reps` calls of `call`, timed with a host clock (after `warmup`
// untimed).
absl::StatusOr<std::pair<double, double>> host_timed(int reps,
                                                     const std::function<absl::Status()>& call,
                                                     int warmup = 3) {
  for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(call());
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(call());
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return std::make_pair(us[us.size() / 2], us[us.size() * 9 / 10]);
}

// Where a small call's time goes: the parts of `run` measured one by one with a host clock, on a
// stream and buffers of the bench's own (x at 0, then y, sa and azp back to back, as `run` lays
// them out).
absl::Status serving_breakdown(const CudaPreparedKernel& p, int64_t m,
                               const std::vector<uint16_t>& xh, std::vector<uint16_t>& yh,
                               int reps) {
  const size_t x_bytes = xh.size() * 2, y_bytes = yh.size() * 2, row_bytes = m * 4;
  const size_t d_y = align_up(x_bytes), d_sa = d_y + align_up(y_bytes);
  const size_t d_azp = d_sa + align_up(row_bytes), total = d_azp + align_up(row_bytes);
  const size_t out_bytes = total - d_y;  // y | sa | azp
  DeviceBuffer dev, scratch;
  PinnedBuffer host;
  RETURN_IF_ERROR(dev.allocate(total, "breakdown buffers"));
  RETURN_IF_ERROR(scratch.allocate(std::max<size_t>(256, p.device_scratch_bytes(m)), "scratch"));
  RETURN_IF_ERROR(host.reserve(total, "breakdown staging"));
  cudaStream_t s = nullptr;
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  StageEvents ev;
  for (cudaEvent_t& e : ev.e) RETURN_IF_CUDA_ERROR(cudaEventCreate(&e));
  char* d = dev.as<char>();
  char* h = static_cast<char*>(host.get());
  DeviceRunArgs a;
  a.x = d;
  a.m = m;
  a.y = d + d_y;
  a.sa = at<float>(d, d_sa);
  a.azp = at<int32_t>(d, d_azp);
  auto copies_in = [&]() -> absl::Status {
    std::memcpy(h, xh.data(), x_bytes);
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(d, h, x_bytes, cudaMemcpyHostToDevice, s));
    return absl::OkStatus();
  };
  auto copies_out = [&]() -> absl::Status {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(h + d_y, d + d_y, out_bytes, cudaMemcpyDeviceToHost, s));
    return absl::OkStatus();
  };
  auto sync_out = [&]() -> absl::Status {
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
    std::memcpy(yh.data(), h + d_y, y_bytes);
    return absl::OkStatus();
  };
  struct Row {
    const char* what;
    std::function<absl::Status()> call;
  };
  // How a graph of copies + op is timed: stage events as nodes between its parts, none, events
  // recorded on the stream around the graph's launch, or event nodes at its two ends only.
  enum class Timed { kStages, kNone, kAround, kEnds };
  // Captures copies + op into *exec on first use (keeping the graph in *keep when given), then
  // replays it.
  auto graph_call = [&](cudaGraphExec_t* exec, cudaGraph_t* keep, Timed timed) -> absl::Status {
    StageEvents graph_ev = ev;
    graph_ev.in_graph = true;
    if (*exec == nullptr) {
      RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      absl::Status st = absl::OkStatus();
      if (timed == Timed::kEnds) st = cuda_status(record_stage(&graph_ev, 0, s));
      if (st.ok()) st = copies_in();
      if (st.ok()) {
        st = p.run_device(a, scratch.get(), s, timed == Timed::kStages ? &graph_ev : nullptr);
      }
      if (st.ok()) st = copies_out();
      if (st.ok() && timed == Timed::kEnds) st = cuda_status(record_stage(&graph_ev, 2, s));
      cudaGraph_t g = nullptr;
      const cudaError_t e = cudaStreamEndCapture(s, &g);
      RETURN_IF_ERROR(st);
      RETURN_IF_CUDA_ERROR(e);
      const cudaError_t inst = cudaGraphInstantiate(exec, g, 0);
      if (keep != nullptr && inst == cudaSuccess) {
        *keep = g;
      } else {
        cudaGraphDestroy(g);
      }
      RETURN_IF_CUDA_ERROR(inst);
    }
    std::memcpy(h, xh.data(), x_bytes);
    if (timed == Timed::kAround) RETURN_IF_CUDA_ERROR(cudaEventRecord(ev.e[0], s));
    RETURN_IF_CUDA_ERROR(cudaGraphLaunch(*exec, s));
    if (timed == Timed::kAround) RETURN_IF_CUDA_ERROR(cudaEventRecord(ev.e[2], s));
    RETURN_IF_ERROR(sync_out());
    if (timed != Timed::kNone) {
      float ms = 0;
      RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, ev.e[0], ev.e[2]));
    }
    return absl::OkStatus();
  };
  // Graphs of parts of the call, none with events: which part costs what in a replay.
  enum Parts { kOp = 1, kIn = 2, kOut = 4, kMappedY = 8, kMappedX = 16 };
  DeviceRunArgs mapped = a, mapped_xy = a;
  {
    void* hy = nullptr;
    void* hx = nullptr;
    RETURN_IF_CUDA_ERROR(cudaHostGetDevicePointer(&hy, h + d_y, 0));
    RETURN_IF_CUDA_ERROR(cudaHostGetDevicePointer(&hx, h, 0));
    mapped.y = hy;
    mapped_xy.y = hy;
    mapped_xy.x = hx;
  }
  auto parts_call = [&](cudaGraphExec_t* exec, int parts) -> absl::Status {
    if (*exec == nullptr) {
      RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      absl::Status st = absl::OkStatus();
      if (parts & kIn) st = copies_in();
      if (st.ok()) {
        st = p.run_device(parts & kMappedX   ? mapped_xy
                          : parts & kMappedY ? mapped
                                             : a,
                          scratch.get(), s, nullptr);
      }
      if (st.ok() && (parts & kOut)) st = copies_out();
      cudaGraph_t g = nullptr;
      const cudaError_t e = cudaStreamEndCapture(s, &g);
      RETURN_IF_ERROR(st);
      RETURN_IF_CUDA_ERROR(e);
      const cudaError_t inst = cudaGraphInstantiate(exec, g, 0);
      cudaGraphDestroy(g);
      RETURN_IF_CUDA_ERROR(inst);
    }
    if (parts & (kIn | kMappedX)) std::memcpy(h, xh.data(), x_bytes);
    RETURN_IF_CUDA_ERROR(cudaGraphLaunch(*exec, s));
    return sync_out();
  };
  cudaGraphExec_t part_graphs[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  cudaGraphExec_t graph = nullptr, plain_graph = nullptr, around_graph = nullptr,
                  ends_graph = nullptr;
  cudaGraph_t captured = nullptr;
  const std::vector<Row> rows = {
      {"the op alone + sync",
       [&]() -> absl::Status {
         RETURN_IF_ERROR(p.run_device(a, scratch.get(), s, nullptr));
         RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
         return absl::OkStatus();
       }},
      {"the op with stage events + sync",
       [&]() -> absl::Status {
         RETURN_IF_ERROR(p.run_device(a, scratch.get(), s, &ev));
         RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
         return absl::OkStatus();
       }},
      {"copies alone (x in, y|sa|azp out)",
       [&]() -> absl::Status {
         RETURN_IF_ERROR(copies_in());
         RETURN_IF_ERROR(copies_out());
         return sync_out();
       }},
      {"copies + op, one copy out",
       [&]() -> absl::Status {
         RETURN_IF_ERROR(copies_in());
         RETURN_IF_ERROR(p.run_device(a, scratch.get(), s, &ev));
         RETURN_IF_ERROR(copies_out());
         return sync_out();
       }},
      {"the same as one CUDA graph",
       [&]() -> absl::Status { return graph_call(&graph, &captured, Timed::kStages); }},
      {"  without stage events",
       [&]() -> absl::Status { return graph_call(&plain_graph, nullptr, Timed::kNone); }},
      {"  two events around its launch",
       [&]() -> absl::Status { return graph_call(&around_graph, nullptr, Timed::kAround); }},
      {"  two event nodes at its ends",
       [&]() -> absl::Status { return graph_call(&ends_graph, nullptr, Timed::kEnds); }},
      {"graph: the op alone", [&]() -> absl::Status { return parts_call(&part_graphs[0], kOp); }},
      {"graph: x in + op",
       [&]() -> absl::Status { return parts_call(&part_graphs[1], kIn | kOp); }},
      {"graph: op + y|sa|azp out",
       [&]() -> absl::Status { return parts_call(&part_graphs[2], kOp | kOut); }},
      {"graph: x in + op, y to mapped pinned",
       [&]() -> absl::Status { return parts_call(&part_graphs[3], kIn | kOp | kMappedY); }},
      {"graph: op, x and y in mapped pinned",
       [&]() -> absl::Status { return parts_call(&part_graphs[4], kOp | kMappedX); }},
  };
  absl::Status status;
  for (const Row& r : rows) {
    absl::StatusOr<std::pair<double, double>> t = host_timed(reps, r.call);
    if (!t.ok()) {
      status = t.status();
      break;
    }
    std::printf("  %-36s %10.1f %10.1f\n", r.what, t->first, t->second);
  }
  if (status.ok() && part_graphs[3] != nullptr) {
    // y written straight into mapped pinned memory must equal y copied back.
    status = parts_call(&part_graphs[2], kOp | kOut);
    const std::vector<uint16_t> copied = yh;
    std::memset(h + d_y, 0, y_bytes);
    if (status.ok()) status = parts_call(&part_graphs[3], kIn | kOp | kMappedY);
    if (status.ok()) std::printf("  mapped y equals copied y: %s\n", yh == copied ? "yes" : "NO");
    std::memset(h + d_y, 0, y_bytes);
    if (status.ok()) status = parts_call(&part_graphs[4], kOp | kMappedX);
    if (status.ok()) {
      std::printf("  y from mapped x equals copied y: %s\n", yh == copied ? "yes" : "NO");
    }
  }
  if (status.ok() && captured != nullptr) {
    // What keeping such a graph costs: 64 more instances of it.
    constexpr int kCopies = 64;
    size_t free0 = 0, free1 = 0, total_mem = 0;
    cudaMemGetInfo(&free0, &total_mem);
    const int64_t rss0 = rss_bytes();
    std::vector<cudaGraphExec_t> execs(kCopies, nullptr);
    for (cudaGraphExec_t& e : execs) {
      if (cudaGraphInstantiate(&e, captured, 0) != cudaSuccess) e = nullptr;
    }
    cudaMemGetInfo(&free1, &total_mem);
    const int64_t rss1 = rss_bytes();
    std::printf("  one more instance of the graph: %.1f KB of device memory, %.1f KB of host\n",
                (static_cast<double>(free0) - static_cast<double>(free1)) / kCopies / 1024,
                static_cast<double>(rss1 - rss0) / kCopies / 1024);
    for (cudaGraphExec_t e : execs) {
      if (e != nullptr) cudaGraphExecDestroy(e);
    }
  }
  if (captured != nullptr) cudaGraphDestroy(captured);
  if (graph != nullptr) cudaGraphExecDestroy(graph);
  for (cudaGraphExec_t e : part_graphs) {
    if (e != nullptr) cudaGraphExecDestroy(e);
  }
  for (cudaGraphExec_t e : {plain_graph, around_graph, ends_graph}) {
    if (e != nullptr) cudaGraphExecDestroy(e);
  }
  for (cudaEvent_t e : ev.e) cudaEventDestroy(e);
  cudaStreamDestroy(s);
  return status;
}

// (4) The serving path: host x in, host y out, through `run` (pinned staging, H2D, the op, D2H,
// one synchronisation), timed with a host clock around each call.
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
      "\nserving path (run() on host buffers, copies and one sync included), 8B o %lldx%lld, "
      "CUDA graphs %s (calls of up to %lld rows; a replay's quantize_us is 0 and its gemm+ep_us "
      "the whole call on the host clock), y of up to %zu KB written straight to the host\n",
      static_cast<long long>(n), static_cast<long long>(k), o.cuda_graphs ? "on" : "off",
      static_cast<long long>(kMaxGraphRows), direct_output_bytes() >> 10);
  std::printf(
      "up to 64 rows also as a server sees calls (medians): idle = 500 us of sleep before each "
      "call (a client's round trip), cold = x and y rotating over 64 buffers each\n");
  std::printf("%-18s %6s %10s %10s %12s %12s %10s %10s %12s\n", "kernel", "M", "median_us",
              "p90_us", "quantize_us", "gemm+ep_us", "idle_us", "cold_us", "idle+cold_us");
  for (const Kernel* kern : bench_kernels(registry)) {
    if (!registry.usable(*kern, host_info()).ok()) continue;
    ASSIGN_OR_RETURN(std::unique_ptr<PreparedKernel> p, kern->prepare(*weights));
    for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}, int64_t{16}, int64_t{64},
                      int64_t{2048}}) {
      if (!kern->can_implement(weights->config, ProblemShape{m, n, k, DType::kBF16, DType::kBF16})
               .ok()) {
        continue;
      }
      const std::vector<uint16_t> xh = random_bf16(rng, static_cast<size_t>(m * k));
      std::vector<uint16_t> yh(static_cast<size_t>(m * n));
      RunArgs a;
      a.x = xh.data();
      a.x_dtype = DType::kBF16;
      a.m = m;
      a.y = yh.data();
      a.y_dtype = DType::kBF16;
      RunTimings t;
      const int reps = o.quick ? 10 : 50;
      // Untimed: every stream context's first call of this size, and its second, which captures
      // the call's CUDA graph where it has one.
      ASSIGN_OR_RETURN(const auto us,
                       host_timed(
                           reps, [&]() { return p->run(a, &t); }, 2 * StreamPool::kContexts + 1));
      std::printf("%-18s %6lld %10.1f %10.1f %12.1f %12.1f", std::string(kern->name()).c_str(),
                  static_cast<long long>(m), us.first, us.second, t.quantize_ns / 1e3,
                  t.gemm_ns / 1e3);
      if (m <= 64) {
        // As a server sees calls: the thread idle between them (a client's round trip), and x
        // and y in buffers that have left the core's caches.
        constexpr int kRotate = 64;
        std::vector<std::vector<uint16_t>> xs(kRotate, xh), ys(kRotate, yh);
        auto timed_form = [&](bool idle, bool cold) {
          std::vector<double> v;
          for (int i = 0; i < reps; ++i) {
            RunArgs b = a;
            if (cold) {
              b.x = xs[i % kRotate].data();
              b.y = ys[i % kRotate].data();
            }
            if (idle) std::this_thread::sleep_for(std::chrono::microseconds(500));
            const auto t0 = std::chrono::steady_clock::now();
            if (!p->run(b, nullptr).ok()) return -1.0;
            v.push_back(
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                    .count());
          }
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        std::printf(" %10.1f %10.1f %12.1f", timed_form(true, false), timed_form(false, true),
                    timed_form(true, true));
      }
      std::printf("\n");
      if (m == 1 || m == 16) {
        if (const auto* cp = dynamic_cast<const CudaPreparedKernel*>(p.get()); cp != nullptr) {
          RETURN_IF_ERROR(serving_breakdown(*cp, m, xh, yh, reps));
        }
      }
    }
  }
  return absl::OkStatus();
}

// (5) The summary: the dispatched kernel per (shape, M), and the issue's targets.
void print_summary(const std::vector<Point>& points, const Ceilings& ceil) {
  std::printf("\n=== summary: dispatched kernel per shape and M (bf16 in/out, bias) ===\n");
  std::printf(
      "ceilings this run: SM copy %.2f TB/s, SM read %.2f TB/s; floor uses %.1f TB/s and "
      "%.0f TOPS\n",
      ceil.copy_tbps, ceil.read_tbps, kCopyBytesPerS / 1e12, kInt8OpsPerS / 1e12);
  std::printf("%-21s %5s %-17s %8s %7s %6s %6s %6s %7s %7s %7s %s\n", "shape", "M", "kernel", "us",
              "TOPS", "W_TB/s", "xfloor", "xread", "vs_gemm", "vs_lt+e", "vs_vllm", "best other");
  int met = 0, missed = 0, below_read = 0;
  std::string misses;
  int vllm_rows = 0, faster_than_vllm = 0;
  double vllm_min = 1e30, vllm_max = 0;
  for (const Point& p : points) {
    auto it = p.op_us.find(p.dispatched);
    if (it == p.op_us.end()) continue;
    const double us = it->second;
    const double ops = 2.0 * p.m * p.n * p.k;
    const double tops = ops / (us * 1e-6) / 1e12;
    const double tbps = p.n * p.k / (us * 1e-6) / 1e12;
    auto lt = p.op_us.find("cuda.cublaslt");
    const double lt_us = lt != p.op_us.end() ? lt->second : 0.0;
    const double vs_lt = lt_us / us;
    std::string other;
    for (const auto& [name, o_us] : p.op_us) {
      if (name != p.dispatched && o_us < us * 0.97) {
        other = absl::StrFormat("%s %.1f", name, o_us);
      }
    }
    const std::string xread = p.read_us > 0 ? absl::StrFormat("%.2f", us / p.read_us) : "-";
    const std::string vs_vllm = p.vllm_us > 0 ? absl::StrFormat("%.2f", p.vllm_us / us) : "-";
    if (p.vllm_us > 0) {
      ++vllm_rows;
      faster_than_vllm += us < p.vllm_us;
      vllm_min = std::min(vllm_min, p.vllm_us / us);
      vllm_max = std::max(vllm_max, p.vllm_us / us);
    }
    std::printf("%-21s %5lld %-17s %8.1f %7.1f %6.2f %6.2f %6s %7.2f %7.2f %7s %s\n",
                p.shape.c_str(), static_cast<long long>(p.m), p.dispatched.c_str(), us, tops, tbps,
                us / floor_us(p.m, p.n, p.k), xread.c_str(), p.gemm_us / us, vs_lt, vs_vllm.c_str(),
                other.c_str());
    // The issue's targets, each with the op time it asks for.
    struct Check {
      bool ok;
      std::string what;
      double asks_us;
    };
    std::vector<Check> checks;
    if (p.m == 1 || p.m == 16) {
      if (p.n * p.k >= (int64_t{32} << 20)) {
        checks.push_back({tbps >= 3.6, ">= 3.6 TB/s", p.n * p.k / 3.6e12 * 1e6});
      }
      if (p.n == 4096 && p.k == 4096) {
        checks.push_back({vs_lt >= 2.0, ">= 2x cuBLASLt+ep", lt_us / 2.0});
      }
    } else if (p.m >= 64 && p.m <= 256) {
      checks.push_back({vs_lt >= 1.2, ">= 1.2x cuBLASLt+ep", lt_us / 1.2});
    } else if (p.m >= 1024 && p.m * p.n * p.k >= int64_t{4096} * 4096 * 4096) {
      checks.push_back({p.gemm_us / us >= 1.0, ">= 1.0x cuBLASLt GEMM", p.gemm_us});
      checks.push_back({vs_lt >= 1.2, ">= 1.2x cuBLASLt+ep", lt_us / 1.2});
      if (p.m == 2048 && p.n == 8192 && p.k == 8192)
        checks.push_back({tops >= 1550, ">= 1550 TOPS", ops / 1550e12 * 1e6});
    }
    for (const Check& c : checks) {
      if (c.ok) {
        ++met;
        continue;
      }
      ++missed;
      absl::StrAppendFormat(&misses, "  missed: %s M=%lld %s (%.1f us; asks for <= %.1f us",
                            p.shape, static_cast<long long>(p.m), c.what, us, c.asks_us);
      if (p.read_us > 0 && c.asks_us < p.read_us) {
        ++below_read;
        absl::StrAppendFormat(&misses, ", less than the weights' plain read, %.1f us", p.read_us);
      }
      misses += ")\n";
    }
  }
  std::printf("targets: %d met, %d missed", met, missed);
  if (below_read > 0) {
    std::printf(
        " (%d of them ask for less time than a plain read of the layer's weights takes in "
        "this run)",
        below_read);
  }
  std::printf("\n%s", misses.c_str());
  if (vllm_rows > 0) {
    std::printf(
        "against vLLM's W8A8 GEMM configurations (the quantize kernel, then vLLM's CUTLASS GEMM "
        "for the row's M and N): the dispatched op faster on %d of %d rows, %.2f-%.2fx\n",
        faster_than_vllm, vllm_rows, vllm_min, vllm_max);
  }
}

int bench_main(int argc, char** argv) {
  Options o;
  ArgParser args(
      "qlinear_gpu_bench [--quick] [--small_m] [--diagnose] [--serving] [--reps=N] [--warmup=N] "
      "[--sweep=true|false] [--scheduler] [--stream_prefetch] [--weights_hint] [--pad_rows] "
      "[--swap] "
      "[--prefill] [--energy] [--reads] [--profile=NxK --profile_tile=T --profile_m=M]",
      "W8A8 op of every CUDA kernel vs a bare cuBLASLt int8 GEMM on Llama-3 shapes.");
  args.add("quick", &o.quick, "Fewer shapes and repetitions");
  args.add("small_m", &o.small_m,
           "Only M = 1, 2, 4, 8, 16 and 32 on every shape, gemv plans swept");
  args.add(
      "diagnose", &o.diagnose,
      "Only where the time goes, from in-kernel stamps: cuda.gemv_s8 and cuda.stream_s8 at M = 1 "
      "and 16, cuda.cutlass_sm90 at M = 1-256");
  args.add("serving", &o.serving,
           "Only the serving path (run() on host buffers) and where its time goes at M = 1");
  args.add(
      "cuda_graphs", &o.cuda_graphs,
      "Let the serving path replay small calls from CUDA graphs (qlinear-server --cuda-graphs)");
  args.add("share_tuning", &o.share_tuning,
           "The weight copies rotated after the first take what the first one's load timed, as "
           "a server's later layers of a shape do (qlinear-server --share-tuning); false: each "
           "copy times its own");
  args.add("direct_output_kb", &o.direct_output_kb,
           "The largest y (KB) the serving path lets a kernel write straight into mapped pinned "
           "memory instead of copying it back (set_direct_output_bytes; 0: never; default: the "
           "serving path's)");
  args.add("sweep", &o.sweep, "Sweep cuda.gemv_s8's plans and cuda.cutlass_sm90's tiles first");
  args.add("scheduler", &o.scheduler,
           "Only cuda.cutlass_sm90's large-M tiles with each tile-scheduler walk (raster order, "
           "swizzle): back to back, after an L2 flush and after the quantize kernel");
  args.add("stream_prefetch", &o.stream_prefetch,
           "Only cuda.stream_s8 at M = 1 and 16 with 0-8 units prefetched into L2 past the ring's "
           "first fill, two and three ring slots, in turns");
  args.add("weights_hint", &o.weights_hint,
           "Only cuda.cutlass_sm90's ops at M = 1-256 with and without the weights' evict-first L2 "
           "hint, and the tiles with a cluster with the launch that is not served, in turns");
  args.add("vllm", &o.vllm,
           "Only cuda.cutlass_sm90's ops at M = 64-256 on the tiles that are vLLM's "
           "configurations there, as served, with the zero-point term read and with each part of "
           "their launch changed, beside the \"vLLM\" anchor and at M = 128 vLLM's GEMM with our "
           "epilogue, in turns; from M = 128 again with the weights rotated past the L2");
  args.add("pad_rows", &o.pad_rows,
           "Only cuda.cutlass_sm90's 64-token tiles at M = 1-64, the op and the GEMM alone, with "
           "the token block's rows past M read from the activations' buffer or zero-filled, and "
           "the op with the quantize kernel never splitting a row, in turns");
  args.add("swap", &o.swap,
           "Only cuda.cutlass_sm90 at M = 1 and 16: the op (every stage's weights or 4 or 2 "
           "issued before the wait, with and without L2 prefetch) and the GEMM alone on the 64 x "
           "64 tile and on the tiles with their operands swapped (the stream-K one too), in "
           "turns");
  args.add("tail", &o.tail,
           "Only cuda.cutlass_sm90's swapped tiles at M = 1 and 16 on the layers whose tiles "
           "outnumber the SMs: the op and the GEMM alone with 0-16 MB of the last wave's weights "
           "prefetched into L2 by the other CTAs, and with the grid cut to as few CTAs as keep the "
           "waves, in turns");
  args.add("streamk", &o.streamk,
           "Only cuda.cutlass_sm90's stream-K swapped tile at M = 1 and 16 against the 16 x 64 x "
           "256 swapped tile, alone and as the op with more or fewer weights issued before the "
           "wait, in turns; then its CTAs' timelines");
  args.add("claim", &o.claim,
           "Only cuda.cutlass_sm90's swapped tiles at M = 1 and 16: the op as served with the "
           "static tile deal and with the CTAs claiming their tiles at run time (0-4 k-tiles "
           "before the end of a tile's loads), in turns; then the CTAs' timelines");
  args.add("prefill", &o.prefill,
           "Only cuda.cutlass_sm90 at M >= 1024: the GEMM alone, the op as served, the GEMM "
           "after the quantize kernel and an L2 flush, and the quantizing tiles, in turns");
  args.add("ring_switch", &o.ring_switch,
           "Only the quantize kernel's warp and ring forms on x of 16-192 MB, in turns: where the "
           "ring starts to win");
  args.add("setup_quant", &o.setup_quant,
           "Only cuda.cutlass_sm90 at M = 128 and 256: the quantizing tiles with every row "
           "quantized in the GEMM's set-up against the quantize kernel then the plain tile as "
           "served, in turns, with y compared");
  args.add("energy", &o.energy,
           "Only M >= 1024: the bare cuBLASLt GEMM, the quantize kernel and cuda.cutlass_sm90's "
           "GEMM and op, each back to back for a second, with the GPU's energy per call, power "
           "and SM clock (NVML), in turns");
  args.add("reads", &o.reads,
           "Only every shape's weights read alone in each plain read form, an empty launch, and "
           "the weights read by TMA in the swapped 16 x 64 x 256 tile's order, each tile's k-loop "
           "from k-tile 0 or rotated, and in boxes of 32 and 128 rows, in turns");
  args.add("sm_rate", &o.sm_rate,
           "Only the shapes of at least 128 rows per SM: one tile of weights per CTA on 4, 16, 64 "
           "and every SM, in TMA boxes and bulk copies, with what each CTA streamed per second");
  args.add("fixed_cost", &o.fixed_cost,
           "Only what a launch of the swapped tiles costs besides its stream: empty launches, the "
           "16 x 64 x 256 tile's GEMM and the 3-D read of the same tiles on 64 CTAs at K = 256, "
           "1024 and the shape's, in turns; on 4096 x 4096 each launch's timeline between two "
           "stamp kernels; and (first shape) how fast an SM runs machine code it has not cached");
  args.add("profile", &o.profile,
           "Only one shape (NxK, e.g. 8192x28672): cuda.cutlass_sm90's GEMM alone of tile "
           "--profile_tile at M = --profile_m, four launches over the rotated weights, for a "
           "profiler");
  args.add("profile_tile", &o.profile_tile, "With --profile: the tile (CutlassSm90Tile index)");
  args.add("profile_m", &o.profile_m, "With --profile: M, 1..256");
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
  enable_cuda_graphs(o.cuda_graphs);
  if (o.direct_output_kb >= 0)
    set_direct_output_bytes(static_cast<size_t>(o.direct_output_kb) << 10);

  const HostInfo& host = host_info();
  if (absl::Status s = cuda_device_usable(host); !s.ok()) {
    std::printf("qlinear_gpu_bench: no usable GPU: %s\n", std::string(s.message()).c_str());
    return 0;
  }
  Registry registry;
  if (absl::Status s = register_builtin_kernels(&registry); !s.ok()) {
    std::fprintf(stderr, "qlinear_gpu_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "qlinear_gpu_bench: cannot create a stream or a cuBLASLt handle\n");
    return 1;
  }
  Ceilings ceil;
  if (auto c = measure_ceilings(stream); c.ok()) ceil = *c;
  std::printf("GPU: %s\n", host.gpu_description().c_str());
  std::printf(
      "ceilings: copy %.2f TB/s and read %.2f TB/s measured now (floor uses %.1f), int8 %.0f "
      "TOPS datasheet; reps %lld, median\n",
      ceil.copy_tbps, ceil.read_tbps, kCopyBytesPerS / 1e12, kInt8OpsPerS / 1e12,
      static_cast<long long>(o.reps));
  std::printf("kernels: ");
  for (const Kernel* k : registry.kernels()) {
    const absl::Status s = registry.usable(*k, host);
    std::printf("%s%s; ", std::string(k->name()).c_str(),
                s.ok() ? "" : absl::StrCat(" (", s.message(), ")").c_str());
  }
  std::printf(
      "\nop = quantize + GEMM + epilogue, bf16 in/out, per-token x per-channel, bias; "
      "gemm = bare cuBLASLt int8->int32\n\n");
  std::vector<Point> points;
  int failures = 0;
  if (o.ring_switch) {
    const absl::Status s = compare_ring_switch(o, stream);
    if (!s.ok()) std::printf("ring-switch: %s\n", std::string(s.message()).c_str());
    cublasLtDestroy(lt);
    cudaStreamDestroy(stream);
    return s.ok() ? 0 : 1;
  }
  if (!o.profile.empty() &&
      std::none_of(std::begin(kShapes), std::end(kShapes),
                   [&](const ShapeCase& sc) { return shape_nxk(sc) == o.profile; })) {
    std::printf("--profile=%s: not a benchmark shape (NxK, e.g. 8192x28672)\n", o.profile.c_str());
    return 2;
  }
  for (const ShapeCase& sc : kShapes) {
    if (o.serving) break;
    if (!o.profile.empty() && shape_nxk(sc) != o.profile) continue;
    if ((o.scheduler || o.prefill || o.energy) && sc.large_ms.empty()) continue;
    if (o.quick && !(sc.n == 4096 && sc.k == 4096) && !(sc.n == 28672) &&
        !(sc.n == 8192 && sc.k == 8192)) {
      continue;
    }
    if (absl::Status s = run_shape(sc, registry, o, stream, lt, &points); !s.ok()) {
      std::printf("%s: %s\n", shape_name(sc).c_str(), std::string(s.message()).c_str());
      ++failures;
    }
  }
  if (!o.diagnose && !o.scheduler && !o.stream_prefetch && !o.weights_hint && !o.pad_rows &&
      !o.swap && !o.tail && !o.streamk && !o.claim && !o.prefill && !o.energy && !o.reads &&
      !o.sm_rate && !o.fixed_cost && !o.setup_quant && o.profile.empty()) {
    if (absl::Status s = run_host_path(registry, o); !s.ok()) {
      std::printf("serving path: %s\n", std::string(s.message()).c_str());
      ++failures;
    }
    if (!o.serving) print_summary(points, ceil);
  }
  cublasLtDestroy(lt);
  cudaStreamDestroy(stream);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace qlinear::gpu

int main(int argc, char** argv) {
  // A crash prints a symbolized stack trace (the benchmark runs unattended on the GPU host).
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  return qlinear::gpu::bench_main(argc, argv);
}
