// Device detection and the compiled-architecture gate (SPEC section 6: is_supported honours the
// compute capability and what was compiled in). Runs with or without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <new>
#include <set>
#include <vector>

#include "kernels/core/device_fault.h"
#include "kernels/core/host_info.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_host_call.h"
#include "kernels/cuda/cutlass_sm90_gemm.h"
#include "kernels/cuda/gemv_s8.h"
#include "kernels/cuda/mapped_copy.h"
#include "kernels/cuda/stream_s8.h"
#include "tests/kernels/cuda/cuda_test_util.h"

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

// Errors that leave the context unusable are reported as the process's device fault, with a
// message that says so; others are not (run anywhere: no device needed).
TEST(CudaErrors, ContextFatalErrorsAreReportedAsTheDeviceFault) {
  clear_device_fault_for_testing();
  for (cudaError_t e :
       {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorAssert,
        cudaErrorIllegalInstruction, cudaErrorMisalignedAddress, cudaErrorECCUncorrectable}) {
    EXPECT_TRUE(is_context_fatal(e)) << cudaGetErrorName(e);
  }
  for (cudaError_t e :
       {cudaErrorMemoryAllocation, cudaErrorInvalidValue, cudaErrorLaunchOutOfResources,
        cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorNotReady}) {
    EXPECT_FALSE(is_context_fatal(e)) << cudaGetErrorName(e);
  }
  const absl::Status oom = cuda_error_status(cudaErrorMemoryAllocation, "cudaMalloc", "x.cc", 1);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  const absl::Status invalid = cuda_error_status(cudaErrorInvalidValue, "cudaMemcpy", "x.cc", 2);
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(device_fault().has_value()) << *device_fault();

  // A fatal-looking code that a synchronization after it does not return again (a launch that
  // was only refused) is no fault.
  const absl::Status refused =
      cuda_error_status_after(cudaErrorLaunchFailure, cudaSuccess, "Gemm::run", "x.cc", 3);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(device_fault().has_value()) << *device_fault();

  const absl::Status fatal =
      cuda_error_status_after(cudaErrorIllegalAddress, cudaErrorIllegalAddress,
                              "cudaStreamSynchronize(s)", "/a/b/call.cc", 7);
  EXPECT_EQ(fatal.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(fatal.message(),
            std::string("CUDA error in cudaStreamSynchronize(s) (call.cc:7): "
                        "cudaErrorIllegalAddress: ") +
                cudaGetErrorString(cudaErrorIllegalAddress) +
                "; the GPU cannot serve again in this process, which must restart");
  ASSERT_TRUE(device_fault().has_value());
  EXPECT_EQ(*device_fault(), fatal.message());
  clear_device_fault_for_testing();
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

// A build for "native" or "all" architectures lets any device past the build's check: each
// kernel's own gate then decides. The sm_90a kernel takes compute capability 9.0 only (a Blackwell
// device, sm_100, has no wgmma); the small-M kernels take 9.0 and newer.
TEST(CudaArch, CMakesOwnListsPassEveryDeviceToTheKernelsOwnGates) {
  EXPECT_TRUE(check_cuda_arch("native", 10, 0).ok());
  EXPECT_TRUE(check_cuda_arch("all", 8, 0).ok());
  auto gpu = [](int major, int minor) {
    return GpuInfo{0, "Fake", major, minor, int64_t{80} << 30, 132};
  };
  EXPECT_TRUE(cutlass_sm90_device_gate(gpu(9, 0)).ok());
  EXPECT_EQ(cutlass_sm90_device_gate(gpu(10, 0)).message(),
            "needs compute capability 9.0 (sm_90a wgmma), device is sm_100");
  EXPECT_EQ(cutlass_sm90_device_gate(gpu(9, 1)).message(),
            "needs compute capability 9.0 (sm_90a wgmma), device is sm_91");
  EXPECT_EQ(cutlass_sm90_device_gate(gpu(8, 9)).message(),
            "needs compute capability 9.0 (sm_90a wgmma), device is sm_89");
  for (const auto& gate : {gemv_s8_device_gate, stream_s8_device_gate}) {
    EXPECT_TRUE(gate(gpu(9, 0)).ok());
    EXPECT_TRUE(gate(gpu(10, 0)).ok());
    EXPECT_EQ(gate(gpu(8, 0)).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(gemv_s8_device_gate(gpu(8, 0)).message(),
            "needs compute capability 9.0 or newer (thread block clusters), device is sm_80");
  EXPECT_EQ(stream_s8_device_gate(gpu(8, 6)).message(),
            "needs compute capability 9.0 or newer (bulk copies, programmatic launches), device "
            "is sm_86");
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

// A growth that does not fit (1 PiB) is RESOURCE_EXHAUSTED and keeps the old buffer, usable (a
// stream context keeps its reserved staging through a request too large for the memory left);
// one that fits grows it in 1.5x steps.
TEST(Buffers, AGrowthThatDoesNotFitKeepsTheOldSize) {
  QLINEAR_REQUIRE_GPU();
  constexpr size_t kOld = size_t{1} << 20, kHuge = size_t{1} << 50;
  DeviceBuffer dev;
  ASSERT_TRUE(dev.reserve(kOld, "test").ok());
  const void* dev_before = dev.get();
  absl::Status s = dev.reserve(kHuge, "a huge test buffer");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("out of GPU memory"), absl::string_view::npos) << s;
  EXPECT_EQ(dev.size(), kOld);
  EXPECT_EQ(dev.get(), dev_before) << "the old buffer was given up";
  ASSERT_NE(dev.get(), nullptr);
  EXPECT_EQ(cudaMemset(dev.get(), 0x11, kOld), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_TRUE(dev.reserve(kOld + 1, "test").ok());
  EXPECT_EQ(dev.size(), kOld + kOld / 2);

  PinnedBuffer host;
  ASSERT_TRUE(host.reserve(kOld, "test").ok());
  const void* host_before = host.get();
  const void* alias_before = host.device_alias();
  s = host.reserve(kHuge, "a huge test buffer");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(host.size(), kOld);
  EXPECT_EQ(host.get(), host_before) << "the old buffer was given up";
  EXPECT_EQ(host.device_alias(), alias_before);
  ASSERT_NE(host.get(), nullptr);
  ASSERT_NE(host.device_alias(), nullptr);
  std::memset(host.get(), 0x22, kOld);
  ASSERT_TRUE(host.reserve(3 * kOld, "test").ok());
  EXPECT_EQ(host.size(), 3 * kOld);
  EXPECT_NE(host.device_alias(), nullptr);
}

// One row of a 64 x 64 layer through the serving path, whose device half (`enqueue`, given by the
// test) only zeroes y and sa: what the graph tests below capture.
struct OneRowCall {
  OneRowCall() {
    c.n = 64;
    c.k = 64;
    args.x = x.data();
    args.m = 1;
    args.y = y.data();
  }
  // Queues the device half's work on `s`.
  absl::Status zero_outputs(const DeviceRunArgs& d, cudaStream_t s) const {
    if (cudaMemsetAsync(d.y, 0, static_cast<size_t>(c.n) * 2, s) != cudaSuccess ||
        cudaMemsetAsync(d.sa, 0, sizeof(float), s) != cudaSuccess) {
      return absl::InternalError("memset");
    }
    return absl::OkStatus();
  }
  absl::Status run(StreamPool* pool, DeviceEnqueue enqueue, CallGraphs* graphs) {
    return run_on_host_buffers(pool, c, args, 256, enqueue, nullptr, nullptr, graphs);
  }
  LayerConfig c;
  std::vector<uint16_t> x = std::vector<uint16_t>(64), y = std::vector<uint16_t>(64);
  RunArgs args;
};

// An exception out of a call's device half (std::bad_alloc, which the engine answers) while the
// call is being captured into a graph ends the capture and leaves the context for the next
// request: no stream stays capturing, and later calls of that size run (eagerly) and succeed.
TEST(ServingPath, AnExceptionWhileAGraphIsCapturedLeavesNoStreamCapturing) {
  QLINEAR_REQUIRE_GPU();
  auto pool = StreamPool::get();
  ASSERT_TRUE(pool.ok()) << pool.status();
  OneRowCall call;
  bool throw_in_capture = true;
  auto enqueue = [&](const DeviceRunArgs& d, void*, cudaStream_t s, const StageEvents*,
                     const DeviceDebugOutputs*) -> absl::Status {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &capturing) != cudaSuccess) return absl::InternalError("status");
    if (capturing != cudaStreamCaptureStatusNone && throw_in_capture) throw std::bad_alloc();
    return call.zero_outputs(d, s);
  };
  CallGraphs graphs;
  const int live_before = CallGraphs::live();
  bool threw = false;
  for (int i = 0; i < 3 * StreamPool::kContexts && !threw; ++i) {
    try {
      const absl::Status s = call.run(*pool, enqueue, &graphs);
      ASSERT_TRUE(s.ok()) << s;
    } catch (const std::bad_alloc&) {
      threw = true;
    }
  }
  ASSERT_TRUE(threw) << "no call was captured";
  EXPECT_EQ(CallGraphs::live(), live_before) << "the failed capture still counts as a graph";
  testing::for_every_context(**pool, [](StreamContext& ctx) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(ctx.stream, &capturing), cudaSuccess);
    EXPECT_EQ(capturing, cudaStreamCaptureStatusNone) << "context " << ctx.index;
  });
  throw_in_capture = false;
  for (int i = 0; i < 2 * StreamPool::kContexts; ++i) {
    const absl::Status s = call.run(*pool, enqueue, &graphs);
    EXPECT_TRUE(s.ok()) << "call " << i << ": " << s;
  }
}

// A call size whose capture failed runs eagerly for a while, then is captured again: 16 calls after
// a first failure, twice as many after each further one, at most 4096; a capture resets the count.
// One that found the process's graph limit looks again after 64 calls. (No GPU needed.)
TEST(CallGraphsEntry, AFailedCaptureIsTriedAgainAfterABackoff) {
  CallGraphs::Entry e;
  EXPECT_TRUE(e.graph_turn());
  auto eager_run = [&e] {
    int64_t n = 0;
    while (!e.graph_turn()) ++n;
    return n;
  };
  e.capture_failed();
  EXPECT_EQ(eager_run(), 16);
  e.capture_failed();
  EXPECT_EQ(eager_run(), 32);
  for (int i = 0; i < 20; ++i) e.capture_failed();
  EXPECT_EQ(eager_run(), 4096);
  e.captured(nullptr);
  EXPECT_TRUE(e.graph_turn());
  e.capture_failed();
  EXPECT_EQ(eager_run(), 16) << "a capture did not reset the failures";
  e.at_graph_limit();
  EXPECT_EQ(eager_run(), 64);
}

// A capture that fails (here the device half's error inside the capture, once per stream) leaves
// its call answered eagerly, and that call size is captured again later on the same context.
TEST(ServingPath, ACallSizeWhoseCaptureFailedIsCapturedLater) {
  QLINEAR_REQUIRE_GPU();
  auto pool = StreamPool::get();
  ASSERT_TRUE(pool.ok()) << pool.status();
  OneRowCall call;
  std::set<cudaStream_t> failed, captured;
  auto enqueue = [&](const DeviceRunArgs& d, void*, cudaStream_t s, const StageEvents*,
                     const DeviceDebugOutputs*) -> absl::Status {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &capturing) != cudaSuccess) return absl::InternalError("status");
    if (capturing != cudaStreamCaptureStatusNone) {
      if (failed.insert(s).second) return absl::InternalError("a capture that fails");
      captured.insert(s);
    }
    return call.zero_outputs(d, s);
  };
  CallGraphs graphs;
  const int live_before = CallGraphs::live();
  for (int i = 0; i < 40 * StreamPool::kContexts; ++i) {
    const absl::Status s = call.run(*pool, enqueue, &graphs);
    ASSERT_TRUE(s.ok()) << "call " << i << ": " << s;
    if (!failed.empty() && captured == failed) break;
  }
  ASSERT_FALSE(failed.empty()) << "no call was captured";
  EXPECT_EQ(captured, failed) << "a stream whose capture failed never captured its call again";
  EXPECT_EQ(CallGraphs::live() - live_before, static_cast<int>(captured.size()));
}

// The serving path's small copies by a kernel on mapped pinned memory (mapped_copy.h), both ways,
// at lengths that are and are not multiples of 16: every byte arrives, and nothing past the length
// rounded up to 16 is written.
TEST(MappedCopy, CopiesEveryByteBothWaysAndStopsAtTheRoundedLength) {
  QLINEAR_REQUIRE_GPU();
  SplitMix64 rng = testing::test_rng();
  constexpr size_t kCap = size_t{1} << 20;
  PinnedBuffer host;
  DeviceBuffer dev;
  ASSERT_TRUE(host.reserve(kCap, "test").ok());
  ASSERT_TRUE(dev.allocate(kCap, "test").ok());
  ASSERT_NE(host.device_alias(), nullptr);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  char* h = static_cast<char*>(host.get());
  char* hd = static_cast<char*>(host.device_alias());
  char* d = static_cast<char*>(dev.get());
  for (size_t len :
       {size_t{4}, size_t{16}, size_t{100}, size_t{8192}, size_t{131072 + 36}, size_t{524288}}) {
    SCOPED_TRACE("len " + std::to_string(len));
    const size_t rounded = (len + 15) / 16 * 16;
    std::vector<char> want(len);
    for (char& c : want) c = static_cast<char>(rng.next() & 0xff);
    // Host -> device: the device bytes past `rounded` keep their fill.
    std::memcpy(h, want.data(), len);
    ASSERT_EQ(cudaMemset(d, 0x5a, kCap), cudaSuccess);
    ASSERT_EQ(launch_mapped_copy(d, hd, len, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<char> got(rounded + 64);
    ASSERT_EQ(cudaMemcpy(got.data(), d, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), len), 0);
    for (size_t i = rounded; i < got.size(); ++i) ASSERT_EQ(got[i], 0x5a) << "byte " << i;
    // Device -> host.
    std::memset(h, 0x33, rounded + 64);
    ASSERT_EQ(cudaMemcpy(d, want.data(), len, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(launch_mapped_copy(hd, d, len, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(std::memcmp(h, want.data(), len), 0);
    for (size_t i = rounded; i < rounded + 64; ++i) ASSERT_EQ(h[i], 0x33) << "byte " << i;
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace qlinear::gpu
