#include "kernels/cuda/cuda_host_call.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/functional/bind_front.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/dtype.h"
#include "kernels/core/host_info.h"
#include "kernels/core/status.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/mapped_copy.h"

namespace qlinear::gpu {
namespace {

// Sizes of one call, and where its pieces live in the context's device and pinned buffers:
// device [x | y | sa | azp | xq | acc | scratch] (xq and acc only for debug calls),
// pinned [x | y | sa | azp]; y, sa and azp at the same offsets from y in both, so that one copy
// brings them back together.
struct Layout {
  size_t x_bytes, y_bytes, row_bytes, xq_bytes, acc_bytes;
  size_t d_x, d_y, d_sa, d_azp, d_xq, d_acc, d_scratch, d_total;
  size_t h_x, h_y, h_sa, h_azp, h_total;
  Layout(const RunArgs& a, int64_t n, int64_t k, size_t scratch_bytes, bool debug) {
    x_bytes = static_cast<size_t>(a.m * k) * dtype_size(a.x_dtype);
    y_bytes = static_cast<size_t>(a.m * n) * dtype_size(a.y_dtype);
    row_bytes = static_cast<size_t>(a.m) * 4;
    xq_bytes = debug ? static_cast<size_t>(a.m * k) : 0;
    acc_bytes = debug ? static_cast<size_t>(a.m * n) * 4 : 0;
    d_x = 0;
    d_y = d_x + align_up(x_bytes);
    d_sa = d_y + align_up(y_bytes);
    d_azp = d_sa + align_up(row_bytes);
    d_xq = d_azp + align_up(row_bytes);
    d_acc = d_xq + align_up(xq_bytes);
    d_scratch = d_acc + align_up(acc_bytes);
    d_total = d_scratch + align_up(scratch_bytes);
    h_x = 0;
    h_y = h_x + align_up(x_bytes);
    h_sa = h_y + align_up(y_bytes);
    h_azp = h_sa + align_up(row_bytes);
    h_total = h_azp + align_up(row_bytes);
  }
  // The bytes of the one copy that brings y, sa and (asym) azp back together.
  size_t output_bytes(bool asym) const { return (asym ? d_azp : d_sa) + row_bytes - d_y; }
};

// Large copies go in chunks so that the host memcpy of one overlaps the DMA of the previous one
// (for M = 2048 x 4096 bf16 the copies, not the GPU, are most of a request). At most
// StreamContext::kCopyEvents chunks per direction.
constexpr size_t kMinChunkBytes = size_t{2} << 20;

size_t chunk_bytes(size_t total) {
  const size_t per_event = (total + StreamContext::kCopyEvents - 1) / StreamContext::kCopyEvents;
  return std::max(kMinChunkBytes, align_up(per_event));
}

// A host copy between the caller's buffers and pinned memory. From kParallelCopyBytes on it is
// split into kCopyTaskBytes pieces among a small pool of its own (kCopyThreads threads, the
// caller included; a second request that finds it busy copies on its own thread): one thread's
// memcpy moves far less than PCIe does. Its own pool, not the CPU kernels' one: a copy waits for
// its last piece, and the fewer threads share it, the less a piece can wait for a descheduled
// worker. Measured on the H200 host (bench serving path: 4096 x 4096 at M = 2048, bf16 x and y,
// 16 MB each way; median / p90, us, cuda.cutlass_sm90 and cuda.cublaslt; each form in two runs
// on one machine, the one-thread form once there):
//   one thread (memcpy)                  3266-3290 / 3385-3400
//   four threads (this pool)             1250-1315 / 1286-1368
//   the process-wide pool (16 threads)   1259-1803 / 2912-7546 (another machine: one thread
//                                        5503-5585 / 5892-5986 there)
// Through the server (qlinear-cli bench, one stream on the demo layer, M = 64: 512 KB each way,
// the pool's workers asleep between requests, the stages timed inside the server): the x copy
// finds the workers asleep and mostly runs on the caller, 31-44 us whether the pool is there or
// not; the y copy, with the workers woken by the x copy, took 14-16 us on the pool against
// 38-40 us on one thread (server time 140-152 against 184-188 us).
constexpr size_t kCopyTaskBytes = size_t{128} << 10;
constexpr size_t kParallelCopyBytes = 4 * kCopyTaskBytes;
constexpr unsigned kCopyThreads = 4;

cpu::ThreadPool& copy_pool() {
  static cpu::ThreadPool* pool = new cpu::ThreadPool(
      static_cast<int>(std::min(kCopyThreads, std::max(1u, std::thread::hardware_concurrency()))));
  return *pool;  // never destroyed: workers may be mid-spin at exit
}

// x copies of at least kStreamingCopyBytes into pinned memory use non-temporal (streaming)
// stores: the bytes go to memory without being read for ownership or left dirty in the CPU's
// caches, where the GPU's reads of them would otherwise have to fetch them from. Measured on the
// H200 host with the copy engine reading x (4096 x 4096, bf16, M = 64: 512 KB of x; one request
// at a time):
//   bench --serving, run() median us        plain 99.7-103.5   streaming 89.5-91.3
//     of which the replayed graph           69.2-73.8          61.9-63.9
//   qlinear-server, InferStream, server us  156.7-160.8        140.8-145.1
// At M = 1 (8 KB) streaming stores measured 1-2 us slower, at M = 16 (128 KB) within the noise.
constexpr size_t kStreamingCopyBytes = size_t{256} << 10;

// memcpy with streaming stores where the CPU has them; dst 16-byte aligned.
void streaming_copy(void* dst, const void* src, size_t len) {
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    __m128i* d = static_cast<__m128i*>(dst);
    const __m128i* s = static_cast<const __m128i*>(src);
    const size_t vecs = len / 16;
    for (size_t i = 0; i < vecs; ++i) _mm_stream_si128(d + i, _mm_loadu_si128(s + i));
    _mm_sfence();  // the stores are visible before the GPU is asked to read them
    std::memcpy(d + vecs, s + vecs, len - vecs * 16);
    return;
  }
#endif
  std::memcpy(dst, src, len);
}

void plain_copy(void* dst, const void* src, size_t len) { std::memcpy(dst, src, len); }

// A host copy of `len` bytes; streaming: with streaming_copy.
void host_copy(void* dst, const void* src, size_t len, bool streaming = false) {
  using CopyFn = void (*)(void*, const void*, size_t);
  const CopyFn copy = streaming ? &streaming_copy : &plain_copy;
  cpu::ThreadPool& pool = copy_pool();
  if (len < kParallelCopyBytes || pool.threads() < 2) {
    copy(dst, src, len);
    return;
  }
  const int64_t tasks = static_cast<int64_t>((len + kCopyTaskBytes - 1) / kCopyTaskBytes);
  pool.parallel_for(tasks, [&](int64_t t) {
    const size_t off = static_cast<size_t>(t) * kCopyTaskBytes;
    copy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
         std::min(kCopyTaskBytes, len - off));
  });
}

int64_t ns_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}

// host_copy, its host-clock time added to *copy_ns (RunTimings::copy_ns).
void timed_host_copy(void* dst, const void* src, size_t len, int64_t* copy_ns,
                     bool streaming = false) {
  const auto t0 = std::chrono::steady_clock::now();
  host_copy(dst, src, len, streaming);
  *copy_ns += ns_since(t0);
}

// x from the caller's buffer into pinned memory (`len` of its `x_bytes`).
void copy_x_in(void* pinned, const void* x, size_t len, size_t x_bytes, int64_t* copy_ns) {
  timed_host_copy(pinned, x, len, copy_ns, x_bytes >= kStreamingCopyBytes);
}

int64_t first_nan_row(const float* sa, int64_t m) {
  for (int64_t r = 0; r < m; ++r) {
    if (std::isnan(sa[r])) return r;
  }
  return -1;
}

// Queues the copies of a debug call's intermediates (xq, acc) into `debug`.
absl::Status copy_debug_outputs(const Layout& L, const DeviceDebugOutputs& dbg, cudaStream_t s,
                                DebugOutputs* debug) {
  debug->xq.resize(L.xq_bytes);
  debug->acc.resize(L.acc_bytes / 4);
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(debug->xq.data(), dbg.xq, L.xq_bytes, cudaMemcpyDeviceToHost, s));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(debug->acc.data(), dbg.acc, L.acc_bytes, cudaMemcpyDeviceToHost, s));
  return absl::OkStatus();
}

// After the last synchronisation of a call whose rows were all finite: sa and azp to the caller.
absl::Status finish_call(const Layout& L, const RunArgs& args, const char* host, bool asym,
                         DebugOutputs* debug) {
  const float* h_sa = reinterpret_cast<const float*>(host + L.h_sa);
  const int32_t* h_azp = reinterpret_cast<const int32_t*>(host + L.h_azp);
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

// Copies of up to kMappedCopyBytes between the context's pinned and device buffers are done by a
// kernel (mapped_copy.h) rather than the copy engine: a copy-engine node adds several
// microseconds of latency to a call whatever its size. Measured on the H200 host (bench
// --serving, 4096 x 4096, bf16, run() median us; the copy engine both ways / a kernel for x in /
// for y | sa | azp out / both):
//   cuda.stream_s8     M = 1   30.5 / 27.6 / 22.2 / 22.5    M = 16  48.2 / 50.3 / 44.9 / 43.2
//   cuda.cutlass_sm90  M = 1   31.5 / 27.7 / 24.8 / 23.8    M = 16  54.0 / 51.1 / 44.6 / 41.8
//                      M = 64  83.1 / 81.8 / 68.8 / 65.4
//   cuda.cublaslt      M = 1   32.0 / 29.0 / 27.0 / 27.4    M = 64  87.5 / 78.1 / 70.3 / 69.5
// and through the server (one stream on the demo layer, server time per request, two runs):
// M = 1 30.3-32.0 -> 26.1-27.6, M = 16 52.7-70.7 -> 48.9-50.4, M = 64 117.3-129.2 -> 99.8-108.8.
// (M = 64 there moves 512 KB each way.) Copies above 1 MB keep the copy engine: not measured
// this way, and past 2 MB a call's copies are chunked to overlap with the host's.
constexpr size_t kMappedCopyBytes = size_t{1} << 20;

// The largest y a kernel writes straight into mapped pinned memory (outputs_direct), with sa and
// azp beside it, instead of the output copy: the copy's kernel and its launch drop out of the
// call, but the epilogue's own stores then cross PCIe, which pays only while y is small.
// Measured on the H200 host (bench --serving --direct_output_kb=0 / 1024 in turns, 4096 x 4096,
// bf16, run() median us, two rounds; y is 8 KB per row):
//   M                    1            2            4            8            16
//   cuda.cutlass_sm90    20.5 / 18.4  21.8 / 20.1  24.9 / 22.9  31.2 / 29.2  43.0 / 40.4
//                        20.0 / 19.2  21.5 / 20.6  23.3 / 23.4  30.4 / 28.9  40.1 / 41.5
//   cuda.stream_s8       22.5 / 21.1  25.0 / 23.4  28.9 / 28.2  39.1 / 39.2  47.4 / 50.4
//                        22.5 / 20.9  24.7 / 23.2  29.2 / 28.4  38.0 / 39.6  41.3 / 49.6
//   cuda.cublaslt        26.8 / 25.3  26.1 / 24.3  28.2 / 27.3  35.8 / 32.8  45.7 / 44.4
//                        26.8 / 25.2  25.6 / 24.0  27.5 / 27.0  33.7 / 33.3  45.6 / 47.6
// (cuda.stream_s8's epilogue stores 2-byte values one by one, which PCIe takes worst.)
constexpr size_t kDirectOutputBytes = size_t{32} << 10;

// Queues x's copy from pinned to device memory: `len` bytes at `off`.
cudaError_t queue_x_in(const Layout& L, char* dev, char* host, char* host_dev, size_t off,
                       size_t len, cudaStream_t s) {
  if (host_dev != nullptr && L.x_bytes <= kMappedCopyBytes) {
    return launch_mapped_copy(dev + L.d_x + off, host_dev + L.h_x + off, len, s);
  }
  return cudaMemcpyAsync(dev + L.d_x + off, host + L.h_x + off, len, cudaMemcpyHostToDevice, s);
}

// Queues the one copy that brings y, sa and (asymmetric schemes) azp back together (a kernel's
// when small, see kMappedCopyBytes; host_dev: the device's alias of `host`, or null).
cudaError_t queue_single_output_copy(const Layout& L, const char* dev, char* host, char* host_dev,
                                     bool asym, cudaStream_t s) {
  const size_t bytes = L.output_bytes(asym);
  if (host_dev != nullptr && bytes <= kMappedCopyBytes) {
    return launch_mapped_copy(host_dev + L.h_y, dev + L.d_y, bytes, s);
  }
  return cudaMemcpyAsync(host + L.h_y, dev + L.d_y, bytes, cudaMemcpyDeviceToHost, s);
}

// Where a call's x and outputs are handed to the device half: in the mapped pinned buffer
// (read or written there by the device half itself) or in device memory (copied).
struct Placement {
  bool x_in_pinned = false;
  bool out_in_pinned = false;
};

// The GPU work of a call whose x and output are each one copy: x in (unless the device half reads
// it in pinned memory), the device half, y | sa | azp out (unless it wrote them there), queued on
// `s` (or captured from it). host_dev: the device's alias of `host` (mapped page-locked memory),
// for the copies done by a kernel.
absl::Status queue_single_copy_call(const Layout& L, char* dev, char* host, char* host_dev,
                                    Placement at, const DeviceRunArgs& d, bool asym,
                                    DeviceEnqueue enqueue, const StageEvents* ev, cudaStream_t s) {
  if (!at.x_in_pinned) RETURN_IF_CUDA_ERROR(queue_x_in(L, dev, host, host_dev, 0, L.x_bytes, s));
  RETURN_IF_ERROR(enqueue(d, dev + L.d_scratch, s, ev, nullptr));
  if (!at.out_in_pinned) {
    RETURN_IF_CUDA_ERROR(queue_single_output_copy(L, dev, host, host_dev, asym, s));
  }
  return absl::OkStatus();
}

std::atomic<int> g_live_graphs{0};
std::atomic<bool> g_graphs_enabled{true};
std::atomic<size_t> g_direct_output_bytes{kDirectOutputBytes};

// Captures queue_single_copy_call (without stage events) into `entry`; on any failure the entry
// runs its next calls eagerly (see CallGraphs; this call then runs eagerly too, which reports a
// real error as such).
void capture_call(const Layout& L, char* dev, char* host, char* host_dev, Placement at,
                  const DeviceRunArgs& d, bool asym, DeviceEnqueue enqueue, cudaStream_t s,
                  CallGraphs::Entry* entry) {
  if (g_live_graphs.fetch_add(1, std::memory_order_relaxed) >= kMaxGraphs) {
    g_live_graphs.fetch_sub(1, std::memory_order_relaxed);
    entry->at_graph_limit();
    return;
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    absl::Status queued;
    try {
      queued = queue_single_copy_call(L, dev, host, host_dev, at, d, asym, enqueue, nullptr, s);
    } catch (...) {  // (std::bad_alloc from a message): the stream must not stay capturing
      if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != nullptr) {
        cudaGraphDestroy(graph);
      }
      cudaGetLastError();
      g_live_graphs.fetch_sub(1, std::memory_order_relaxed);
      entry->capture_failed();
      throw;
    }
    const cudaError_t ended = cudaStreamEndCapture(s, &graph);
    if (queued.ok() && ended == cudaSuccess && graph != nullptr &&
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      exec = nullptr;
    }
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();
  if (exec == nullptr) {
    g_live_graphs.fetch_sub(1, std::memory_order_relaxed);
    entry->capture_failed();
    return;
  }
  entry->captured(exec);
}

// Where the serving path hands a call to its device half (see enqueue_call). host_dev: the
// device's alias of the pinned buffer, or null.
Placement place(const Layout& L, bool x_read_once, bool outputs_direct, bool debug,
                const char* host_dev) {
  Placement at;
  // A small x that only the quantize kernel reads, once, is read by it from the mapped pinned
  // buffer: no copy of x to the device before it. Measured on the H200 host (bench --serving
  // --quick, 4096 x 4096, run() median us, four runs of each binary in turns): cuda.cutlass_sm90
  // M = 1 23.3-25.2 -> 22.3-23.5, cuda.stream_s8 (two-launch form) M = 16 43.4-44.6 ->
  // 41.8-43.3, cuda.cublaslt M = 1 27.1-27.9 -> 26.4-27.4; at M = 64 within the noise.
  at.x_in_pinned = x_read_once && host_dev != nullptr && L.x_bytes <= kMappedCopyBytes;
  // Likewise a small y goes straight into the pinned buffer where the device half can write it
  // there, and sa and azp with it: the output copy's kernel and its launch drop out of the call.
  // (A debug call's device half reads more back; it keeps the copy.)
  at.out_in_pinned = outputs_direct && !debug && host_dev != nullptr &&
                     L.y_bytes <= g_direct_output_bytes.load(std::memory_order_relaxed);
  return at;
}

// The device half's pointers for a call laid out as L in `dev` and the pinned buffer's device
// alias `host_dev`, placed as `at`.
DeviceRunArgs device_args(const Layout& L, int64_t m, DType x_dtype, DType y_dtype, char* dev,
                          char* host_dev, Placement at) {
  DeviceRunArgs d;
  d.x = at.x_in_pinned ? static_cast<void*>(host_dev + L.h_x) : static_cast<void*>(dev + L.d_x);
  d.x_dtype = x_dtype;
  d.x_in_host_memory = at.x_in_pinned;
  d.m = m;
  d.y = at.out_in_pinned ? host_dev + L.h_y : dev + L.d_y;
  d.y_dtype = y_dtype;
  d.sa = reinterpret_cast<float*>(dev + L.d_sa);
  d.azp = reinterpret_cast<int32_t*>(dev + L.d_azp);
  if (at.out_in_pinned) {
    d.sa_host = reinterpret_cast<float*>(host_dev + L.h_sa);
    d.azp_host = reinterpret_cast<int32_t*>(host_dev + L.h_azp);
  }
  return d;
}

// After the one synchronisation of a call whose output came back in one copy.
absl::Status finish_single_copy_call(const Layout& L, const RunArgs& args, const char* host,
                                     bool asym, DebugOutputs* debug, int64_t* bad_row,
                                     int64_t* copy_ns) {
  *bad_row = first_nan_row(reinterpret_cast<const float*>(host + L.h_sa), args.m);
  if (*bad_row >= 0) return absl::OkStatus();
  timed_host_copy(args.y, host + L.h_y, L.y_bytes, copy_ns);
  return finish_call(L, args, host, asym, debug);
}

// Grows `ctx`'s buffers for a call of layout `L` (m rows), and publishes their sizes. A call
// whose pinned staging does not fit leaves no GPU memory grown for it.
absl::Status grow_staging(StreamContext* ctx, const Layout& L, int64_t m) {
  const size_t device_before = ctx->device.size();
  absl::Status grown = ctx->device.reserve(L.d_total, absl::StrCat("a request of ", m, " rows"));
  if (grown.ok()) {
    grown = ctx->host.reserve(L.h_total, absl::StrCat("staging a request of ", m, " rows"));
    if (!grown.ok() && ctx->device.size() > device_before) {
      ctx->device.reset();
      if (device_before > 0) (void)ctx->device.reserve(device_before, "the staging kept");
    }
  }
  ctx->sizes_changed();
  return grown;
}

// One call on `ctx` (see the top of cuda_host_call.h). timed: record the context's stage events;
// a graph replay sets *replay_ns to its host-clock time instead (see RunTimings). copy_ns: the
// host copies' time is added to it. bad_row: the first non-finite row of x, or -1. x_read_once,
// outputs_direct: see run_on_host_buffers.
absl::Status enqueue_call(StreamContext* ctx, const LayerConfig& c, const RunArgs& args,
                          size_t scratch_bytes, DeviceEnqueue enqueue, DebugOutputs* debug,
                          CallGraphs* graphs, bool timed, bool x_read_once, bool outputs_direct,
                          int64_t* replay_ns, int64_t* copy_ns, int64_t* bad_row) {
  const Layout L(args, c.n, c.k, scratch_bytes, debug != nullptr);
  if (L.d_total > ctx->device.size() || L.h_total > ctx->host.size()) {
    RETURN_IF_ERROR(grow_staging(ctx, L, args.m));
  }
  // (Only a call that got its buffers holds them past the idle trim: see StreamPool::release.)
  ctx->call_bytes = std::max(L.d_total, L.h_total);
  char* dev = static_cast<char*>(ctx->device.get());
  char* host = static_cast<char*>(ctx->host.get());
  char* host_dev = static_cast<char*>(ctx->host.device_alias());
  const cudaStream_t s = ctx->stream;
  const bool asym = is_asymmetric(c.scheme);
  const size_t x_chunk = chunk_bytes(L.x_bytes);
  const size_t y_chunk = chunk_bytes(L.y_bytes);

  const Placement at = place(L, x_read_once, outputs_direct, debug != nullptr, host_dev);
  const DeviceRunArgs d = device_args(L, args.m, args.x_dtype, args.y_dtype, dev, host_dev, at);
  StageEvents ev;
  for (int i = 0; i < 3; ++i) ev.e[i] = ctx->events[i];

  // A small call replays its graph (see CallGraphs).
  if (graphs != nullptr && debug == nullptr && args.m <= kMaxGraphRows && L.x_bytes <= x_chunk &&
      L.y_bytes <= y_chunk && g_graphs_enabled.load(std::memory_order_relaxed)) {
    CallGraphs::Entry* graph =
        graphs->find(ctx->index, args.m, args.x_dtype, args.y_dtype, dev, host);
    if (graph != nullptr && graph->graph_turn()) {
      copy_x_in(host + L.h_x, args.x, L.x_bytes, L.x_bytes, copy_ns);
      if (graph->exec == nullptr)
        capture_call(L, dev, host, host_dev, at, d, asym, enqueue, s, graph);
      if (graph->exec != nullptr) {
        // Timing events inside the graph or around its launch cost more than the graph saves
        // (see CallGraphs): the replay is timed on the host clock.
        const auto t0 = std::chrono::steady_clock::now();
        RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graph->exec, s));
        RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
        *replay_ns = std::max<int64_t>(1, ns_since(t0));
        return finish_single_copy_call(L, args, host, asym, nullptr, bad_row, copy_ns);
      }
    }
  }

  // x: host -> pinned -> device, chunk by chunk (the pinned buffer holds all of x, so a chunk's
  // memcpy never waits for an earlier chunk's DMA).
  for (size_t off = 0; off < L.x_bytes; off += x_chunk) {
    const size_t len = std::min(x_chunk, L.x_bytes - off);
    copy_x_in(host + L.h_x + off, static_cast<const char*>(args.x) + off, len, L.x_bytes, copy_ns);
    if (!at.x_in_pinned) RETURN_IF_CUDA_ERROR(queue_x_in(L, dev, host, host_dev, off, len, s));
  }
  DeviceDebugOutputs dbg;
  if (debug != nullptr) {
    dbg.xq = reinterpret_cast<int8_t*>(dev + L.d_xq);
    dbg.acc = reinterpret_cast<int32_t*>(dev + L.d_acc);
  }
  RETURN_IF_ERROR(
      enqueue(d, dev + L.d_scratch, s, timed ? &ev : nullptr, debug != nullptr ? &dbg : nullptr));

  // An output of one chunk comes back in one copy: y, sa and azp lie back to back at the same
  // offsets in both buffers. Larger ones: sa (which also flags non-finite rows) and azp first,
  // then y in chunks, each chunk's arrival marked by an event so that the host copies it out
  // while the next one is in flight.
  if (at.out_in_pinned || L.y_bytes <= y_chunk) {
    if (!at.out_in_pinned) {
      RETURN_IF_CUDA_ERROR(queue_single_output_copy(L, dev, host, host_dev, asym, s));
    }
    if (debug != nullptr) RETURN_IF_ERROR(copy_debug_outputs(L, dbg, s, debug));
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
    return finish_single_copy_call(L, args, host, asym, debug, bad_row, copy_ns);
  }
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host + L.h_sa, d.sa, L.row_bytes, cudaMemcpyDeviceToHost, s));
  if (asym) {
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(host + L.h_azp, d.azp, L.row_bytes, cudaMemcpyDeviceToHost, s));
  }
  int chunks = 0;
  for (size_t off = 0; off < L.y_bytes; off += y_chunk, ++chunks) {
    const size_t len = std::min(y_chunk, L.y_bytes - off);
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(host + L.h_y + off, static_cast<char*>(d.y) + off, len,
                                         cudaMemcpyDeviceToHost, s));
    RETURN_IF_CUDA_ERROR(cudaEventRecord(ctx->copy_events[chunks], s));
  }
  if (debug != nullptr) RETURN_IF_ERROR(copy_debug_outputs(L, dbg, s, debug));

  const float* h_sa = reinterpret_cast<const float*>(host + L.h_sa);
  for (int i = 0; i < chunks; ++i) {
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(ctx->copy_events[i]));
    if (i == 0) {
      *bad_row = first_nan_row(h_sa, args.m);
      if (*bad_row >= 0) break;  // the caller reports it; y stays untouched
    }
    const size_t off = static_cast<size_t>(i) * y_chunk;
    timed_host_copy(static_cast<char*>(args.y) + off, host + L.h_y + off,
                    std::min(y_chunk, L.y_bytes - off), copy_ns);
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
  if (*bad_row >= 0) return absl::OkStatus();
  return finish_call(L, args, host, asym, debug);
}

}  // namespace

CallGraphs::~CallGraphs() {
  for (std::vector<Entry>& entries : by_context_) {
    for (Entry& e : entries) {
      if (e.exec == nullptr) continue;
      // (A failure must not stay in the last-error slot: see DeviceBuffer::reset.)
      if (cudaGraphExecDestroy(e.exec) != cudaSuccess) cudaGetLastError();
      g_live_graphs.fetch_sub(1, std::memory_order_relaxed);
    }
  }
}

int CallGraphs::live() { return g_live_graphs.load(std::memory_order_relaxed); }

CallGraphs::Entry* CallGraphs::find(int ctx, int64_t m, DType x_dtype, DType y_dtype,
                                    const void* device, const void* host) {
  std::vector<Entry>& entries = by_context_[ctx];
  for (Entry& e : entries) {
    if (e.m != m || e.x_dtype != x_dtype || e.y_dtype != y_dtype) continue;
    if (e.device != device || e.host != host) {
      // The context's buffers grew since the capture: capture again on the new ones.
      if (e.exec != nullptr) {
        if (cudaGraphExecDestroy(e.exec) != cudaSuccess) cudaGetLastError();
        g_live_graphs.fetch_sub(1, std::memory_order_relaxed);
      }
      e.exec = nullptr;
      e.failures = 0;
      e.eager_calls = 0;
      e.device = device;
      e.host = host;
    }
    return &e;
  }
  Entry e;
  e.m = m;
  e.x_dtype = x_dtype;
  e.y_dtype = y_dtype;
  e.device = device;
  e.host = host;
  entries.push_back(e);
  return nullptr;
}

void set_direct_output_bytes(size_t bytes) {
  g_direct_output_bytes.store(bytes, std::memory_order_relaxed);
}
size_t direct_output_bytes() { return g_direct_output_bytes.load(std::memory_order_relaxed); }

absl::Status run_on_host_buffers(StreamPool* pool, const LayerConfig& c, const RunArgs& args,
                                 size_t scratch_bytes, DeviceEnqueue enqueue, RunTimings* timings,
                                 DebugOutputs* debug, CallGraphs* graphs, bool x_read_once,
                                 bool outputs_direct) {
  if (args.m < 1) return absl::InvalidArgumentError("M must be >= 1");
  int64_t bad_row = -1;
  int64_t replay_ns = 0;
  int64_t copy_ns = 0;
  {
    StreamLease ctx(pool);
    absl::Status s;
    try {
      s = enqueue_call(ctx.get(), c, args, scratch_bytes, enqueue, debug, graphs,
                       timings != nullptr, x_read_once, outputs_direct, &replay_ns, &copy_ns,
                       &bad_row);
    } catch (...) {
      // (std::bad_alloc, which the engine answers): the work queued so far is drained before the
      // context goes to the next request, as for an error, and a fatal error found there is the
      // process's device fault and this request's answer.
      if (const cudaError_t e = cudaStreamSynchronize(ctx->stream); is_context_fatal(e)) {
        return cuda_error_status(e, "cudaStreamSynchronize after a failed call", __FILE__,
                                 __LINE__);
      }
      cudaGetLastError();
      throw;
    }
    if (!s.ok()) {
      // Work already queued may still read or write the context's buffers: drain it before the
      // next request can take them.
      // A fatal error found here (a failure reported by cuBLASLt's status alone) is the
      // process's device fault, and this request's answer.
      if (const cudaError_t e = cudaStreamSynchronize(ctx->stream); is_context_fatal(e)) {
        return cuda_error_status(e, "cudaStreamSynchronize after a failed call", __FILE__,
                                 __LINE__);
      }
      cudaGetLastError();
      return s;
    }
    if (timings != nullptr && bad_row < 0) {
      timings->copy_ns = copy_ns;
      if (replay_ns > 0) {
        // A graph replay, timed as a whole (see RunTimings).
        timings->quantize_ns = 0;
        timings->gemm_ns = replay_ns;
      } else {
        // CUDA events on the request's stream (resolution about 0.5 us); host <-> device copies
        // are in neither figure.
        float q_ms = 0.f, g_ms = 0.f;
        RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&q_ms, ctx->events[0], ctx->events[1]));
        RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&g_ms, ctx->events[1], ctx->events[2]));
        timings->quantize_ns = static_cast<int64_t>(q_ms * 1e6);
        timings->gemm_ns = static_cast<int64_t>(g_ms * 1e6);
      }
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

absl::Status HostCallPreparedKernel::attach() {
  ASSIGN_OR_RETURN(pool_, StreamPool::get());
  ASSIGN_OR_RETURN(dev_, shared_device_layer(weights_, &owns_dev_));
  return absl::OkStatus();
}

absl::Status HostCallPreparedKernel::run_host(const RunArgs& args, RunTimings* timings,
                                              DebugOutputs* debug) const {
  return run_on_host_buffers(pool_, weights_.config, args, device_scratch_bytes(args.m),
                             absl::bind_front(&HostCallPreparedKernel::enqueue, this), timings,
                             debug, &graphs_, x_read_once(args), outputs_direct(args));
}

absl::StatusOr<double> HostCallPreparedKernel::measure_us(const ProblemShape& shape,
                                                          bool cold) const {
  if (shape.m < 1 || shape.n < 1 || shape.k < 1) return CudaPreparedKernel::measure_us(shape, cold);
  RunArgs ra;
  ra.m = shape.m;
  ra.x_dtype = shape.x_dtype;
  ra.y_dtype = shape.y_dtype;
  const Layout L(ra, shape.n, shape.k, device_scratch_bytes(shape.m), false);
  // Larger calls' copies go through the copy engine, the same for every kernel.
  if (L.x_bytes > kMappedCopyBytes || L.output_bytes(/*asym=*/true) > kMappedCopyBytes) {
    return CudaPreparedKernel::measure_us(shape, cold);
  }
  // One pinned buffer serves every measurement in the process, held while measuring (up to 2 MB
  // and a few rows): a load's dozens of measurements then page-lock host memory once.
  static std::mutex pinned_mu;
  static PinnedBuffer* const pinned = new PinnedBuffer();
  const std::lock_guard<std::mutex> lock(pinned_mu);
  RETURN_IF_ERROR(pinned->reserve(L.h_total, "the measurement's pinned buffers"));
  if (pinned->device_alias() == nullptr) return CudaPreparedKernel::measure_us(shape, cold);
  // Declared before the timer, so freed after its stream has been synchronised.
  DeviceBuffer device;
  RETURN_IF_ERROR(device.allocate(L.d_total, "the measurement's device buffers"));
  ASSIGN_OR_RETURN(std::unique_ptr<CallTimer> timer, CallTimer::create());
  const cudaStream_t stream = timer->stream();
  char* dev = static_cast<char*>(device.get());
  char* host = static_cast<char*>(pinned->get());
  char* host_dev = static_cast<char*>(pinned->device_alias());
  RETURN_IF_ERROR(fill_made_up_activations(dev + L.d_x, shape.x_dtype,
                                           static_cast<size_t>(shape.m * shape.k), stream));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(host + L.h_x, dev + L.d_x, L.x_bytes, cudaMemcpyDeviceToHost, stream));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  const Placement at = place(L, x_read_once(ra), outputs_direct(ra), false, host_dev);
  const DeviceRunArgs d = device_args(L, shape.m, shape.x_dtype, shape.y_dtype, dev, host_dev, at);
  const bool asym = is_asymmetric(weights_.config.scheme);
  const auto enqueue_fn = absl::bind_front(&HostCallPreparedKernel::enqueue, this);
  return time_measured_calls(*timer, cold, [&](cudaStream_t s) {
    return queue_single_copy_call(L, dev, host, host_dev, at, d, asym, enqueue_fn, nullptr, s);
  });
}

absl::Status HostCallPreparedKernel::warm_up() const {
  const LayerConfig& c = weights_.config;
  std::vector<uint16_t> x(static_cast<size_t>(c.k), 0), y(static_cast<size_t>(c.n));
  RunArgs warm;
  warm.x = x.data();
  warm.m = 1;
  warm.y = y.data();
  return run(warm, nullptr);
}

absl::Status check_rows_of_16_bytes(const LayerConfig& config, absl::string_view k_why,
                                    absl::string_view n_why) {
  if (config.k > kMaxK) {
    return absl::FailedPreconditionError(absl::StrCat("K=", config.k, " exceeds ", kMaxK));
  }
  if (config.k % 16 != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("K=", config.k, " is not a multiple of 16 (", k_why, ")"));
  }
  if (config.n % 16 != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("N=", config.n, " is not a multiple of 16 (", n_why, ")"));
  }
  return absl::OkStatus();
}

}  // namespace qlinear::gpu

namespace qlinear {

void set_cuda_graphs(bool enabled) {
  gpu::g_graphs_enabled.store(enabled, std::memory_order_relaxed);
}

absl::StatusOr<int64_t> reserve_cuda_staging(int64_t bytes) {
  if (bytes <= 0 || !gpu::cuda_device_usable(host_info()).ok()) return 0;
  ASSIGN_OR_RETURN(gpu::StreamPool * pool, gpu::StreamPool::get());
  RETURN_IF_ERROR(pool->reserve_all(static_cast<size_t>(bytes)));
  return 2 * bytes * gpu::StreamPool::kContexts;
}

int64_t trim_cuda_staging(std::chrono::steady_clock::duration idle) {
  gpu::StreamPool* pool = gpu::StreamPool::existing();
  return pool == nullptr ? 0 : static_cast<int64_t>(pool->trim(idle));
}

std::pair<int64_t, int64_t> cuda_staging_bytes() {
  const gpu::StreamPool* pool = gpu::StreamPool::existing();
  if (pool == nullptr) return {0, 0};
  const gpu::StreamPool::Bytes b = pool->staging_bytes();
  return {static_cast<int64_t>(b.host), static_cast<int64_t>(b.device)};
}

}  // namespace qlinear
