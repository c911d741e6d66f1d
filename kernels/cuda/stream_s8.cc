#include "kernels/cuda/stream_s8.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/core/tuning_cache.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_host_call.h"
#include "kernels/cuda/quantize_s8.h"
#include "kernels/cuda/stream_s8_device.h"

namespace qlinear::gpu {
namespace {

// The token count at which the two-launch form's start is timed at load (the 2..16 bucket's).
constexpr int64_t kTunedUnfusedM = 16;

// Where a call keeps its intermediates inside the caller's scratch (each 256-byte aligned).
struct ScratchLayout {
  size_t flags = 0, xq = 0, sa = 0, azp = 0, counters = 0, partials = 0, total = 0;
  ScratchLayout(int64_t m, int64_t n, int64_t k, int grid) {
    size_t off = 0;
    auto take = [&off](size_t bytes) {
      const size_t at = off;
      off += align_up(bytes);
      return at;
    };
    flags = take(stream_s8_flags_bytes(grid));
    xq = take(stream_xq_bytes(m, k));
    sa = take(static_cast<size_t>(m) * 4);
    azp = take(static_cast<size_t>(m) * 4);
    counters = take(static_cast<size_t>(stream_s8_counters(n)) * 4);
    partials = take(stream_s8_partials_bytes(grid, m));
    total = off;
  }
};

class StreamS8Prepared final : public HostCallPreparedKernel {
 public:
  // With context.tuning, the ring and start come from an earlier layer of the same shape where
  // one timed them, and this layer's are stored there otherwise (not on demand).
  static absl::StatusOr<std::unique_ptr<StreamS8Prepared>> create(const LayerWeights& weights,
                                                                  const PrepareContext& context);

  size_t device_scratch_bytes(int64_t m) const override {
    return ScratchLayout(m, weights_.config.n, weights_.config.k, grid_).total;
  }
  std::string variant(int64_t m) const override;

 private:
  explicit StreamS8Prepared(const LayerWeights& weights) : HostCallPreparedKernel(weights) {}
  absl::Status enqueue(const DeviceRunArgs& args, void* scratch, cudaStream_t stream,
                       const StageEvents* events, const DeviceDebugOutputs* debug) const override;
  // The quantize kernel reads x once; the form that quantizes inside the launch reads it in
  // every block. (The device half gets x in a 256-byte aligned buffer of the serving path, so
  // stream_s8_can_fuse's alignment condition holds there.)
  bool x_read_once(const RunArgs& args) const override {
    return !stream_s8_fuses(args.m, weights_.config.k, static_cast<ElemType>(args.x_dtype));
  }
  // y is written once, by the epilogues; the quantize kernel mirrors sa and azp (the form that
  // quantizes inside the launch keeps them in shared memory, and block 0 writes them out).
  bool outputs_direct(const RunArgs&) const override { return true; }
  absl::Status tune_fused_ring();

  int grid_ = 0;
  // The fused form's ring slots (StreamS8Args::stages; 0: the kernel's default) and units
  // prefetched into L2 past them (StreamS8Args::l2_prefetch), timed at load (tune_fused_ring).
  int fused_stages_ = 0;
  int fused_ahead_ = 0;
  // The two-launch form's ring slots filled before the grid dependency (StreamS8Args::prefetch:
  // 0 all, -1 none) and units prefetched into L2 past them (StreamS8Args::l2_prefetch), timed at
  // load at M = 16 on layers larger than the L2 (tune_fused_ring); not timed, the whole ring and
  // no prefetch.
  struct Start {
    int slots = 0, ahead = 0;
  };
  Start unfused_start_;
  bool unfused_timed_ = false;
  std::string tune_error_;  // why tune_fused_ring failed, if it did
  // Whether the ring and start came from an earlier layer of this shape (TuningCache).
  bool tuned_shared_ = false;
  // When they were timed: "at load", or "on first use" (PrepareContext::on_demand).
  const char* timed_when_ = "at load";
  // What a TuningCache holds for a shape.
  struct TunedRing {
    int fused_stages, fused_ahead;
    Start unfused_start;
    bool unfused_timed;
  };
  StreamTmaMap w_map_;
  // A fused launch's flag value (StreamS8Args::token): random, nonzero, one per layer.
  uint64_t token_ = 0;
};

absl::StatusOr<std::unique_ptr<StreamS8Prepared>> StreamS8Prepared::create(
    const LayerWeights& weights, const PrepareContext& context) {
  std::unique_ptr<StreamS8Prepared> p(new StreamS8Prepared(weights));
  TuningCache* const tuning = context.tuning;
  const LayerConfig& c = weights.config;
  RETURN_IF_ERROR(p->attach());
  RETURN_IF_CUDA_ERROR(stream_s8_grid(c.n, c.k, &p->grid_));
  RETURN_IF_CUDA_ERROR(stream_s8_weights_map(p->dev_->w.as<int8_t>(), c.n, c.k, &p->w_map_));
  std::random_device rd;
  p->token_ = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
  RETURN_IF_ERROR(p->warm_up());
  // The ring and start an earlier layer of this shape timed, where one did.
  const std::string key =
      tuning != nullptr ? tuning_key("cuda.stream_s8 ring", p->device(), c) : "";
  if (tuning != nullptr) {
    if (const std::optional<TunedRing> t = tuning->find<TunedRing>(key)) {
      p->fused_stages_ = t->fused_stages;
      p->fused_ahead_ = t->fused_ahead;
      p->unfused_start_ = t->unfused_start;
      p->unfused_timed_ = t->unfused_timed;
      p->tuned_shared_ = true;
      return p;
    }
  }
  // Like the autotune's measurements, a failed timing (out of memory for the timer's buffers)
  // never fails the load: the default ring stays, and the explanation says why. (Timed on
  // demand, beside running requests, it is not stored.)
  if (context.on_demand) p->timed_when_ = "on first use";
  if (const absl::Status s = p->tune_fused_ring(); !s.ok()) {
    cudaGetLastError();
    p->fused_stages_ = 0;
    p->fused_ahead_ = 0;
    p->unfused_start_ = Start{};
    p->unfused_timed_ = false;
    p->tune_error_ = std::string(s.message());
  } else if (tuning != nullptr && !context.on_demand) {
    tuning->insert(
        key, TunedRing{p->fused_stages_, p->fused_ahead_, p->unfused_start_, p->unfused_timed_});
  }
  return p;
}

// The ring depth of the fused form (M = 1 quantizing inside the launch) is timed per layer: which
// is faster depends on the layer. Measured on the H200 (bench --diagnose, M = 1, us, 2 / 3
// slots, four runs each): 6144 x 4096 14.4-14.6 / 15.1-15.2, 4096 x 4096 12.8-13.0 / 13.2-13.3,
// 57344 x 8192 118.1-120.0 / 122.0-122.9, but 28672 x 4096 36.7-37.0 / 36.2-36.3, 4096 x 14336
// 24.2-24.6 / 23.3-23.9, 8192 x 8192 25.1-25.5 / 24.7-24.9. The unfused form keeps three (two
// measured slower at M = 16 on every benchmark layer, by up to 9 us on 57344 x 8192).
//
// So is how many units past the ring each block prefetches into L2 at its start
// (StreamS8Args::l2_prefetch): while the consumers quantize the rows, the ring is full and, with
// no prefetch, DRAM idles; the longer the rows, the longer the wait. Measured on the H200 (bench
// --stream_prefetch, M = 1, us, medians of three rounds in turns; 2 slots + 0 / 2 / 4 / 8
// units, then 3 slots + the same):
//   6144 x 4096      15.2 / 16.0 / 17.1 / 17.1      15.6 / 17.2 / 17.4 / 17.5
//   4096 x 4096      13.9 / 14.3 / 13.9 / 13.8      13.8 / 14.6 / 14.2 / 14.1
//   28672 x 4096     37.3 / 37.1 / 38.5 / 41.8      36.4 / 37.2 / 38.7 / 42.2
//   4096 x 14336     24.3 / 23.9 / 25.4 / 28.6      23.8 / 23.9 / 25.4 / 28.8
//   8192 x 8192      25.6 / 25.5 / 27.1 / 30.4      25.3 / 25.6 / 27.0 / 30.6
//   57344 x 8192    120.9 / 119.6 / 120.5 / 124.1  122.0 / 122.8 / 122.2 / 126.1
//   8192 x 28672     67.0 / 65.6 / 65.0 / 68.6      66.7 / 65.2 / 65.4 / 68.9
// so only the layers whose blocks stream long enough gain (1-2 us); on the others the early
// reads compete with the first slots'. Eight units (34 MB of L2 on 132 SMs) lose everywhere.
// Keeping the prefetch a fixed distance ahead of the ring for the whole range (one more unit
// prefetched as each unit is issued) made every layer but the two smallest 11-26% slower
// (4096 x 14336 25.0 -> 27.8, 8192 x 28672 65.3 -> 81.3, 57344 x 8192 118.7 -> 150.0 us with 2
// slots and 2 or 4 units ahead), so only the start prefetches. Nor did prefetching the last 2, 4
// or 8 units of each block's range into L2 at once, as its producer issues the ring's load that
// leaves only those (so that a block has more bytes in flight near its end, where the blocks
// finish 4-9 us apart): M = 1, us, medians of three rounds in turns, 2 slots + 0 / + 0 and 2, 4,
// 8 at the end: 8192 x 28672 67.1 / 67.6, 67.7, 70.9; 57344 x 8192 121.3 / 121.5, 122.0, 126.4;
// 28672 x 4096 37.5 / 38.3, 38.8, 42.4; 8192 x 8192 25.6 / 26.7, 27.4, 31.0. The two-launch form
// at M = 16 gained at most 0.7 us (8192 x 28672, 3 slots + 4 at the end: 70.0 -> 69.3).
// The figures above were measured with the weights' TMA loads promoting each L2 fetch to 256
// bytes. With 128 bytes (stream_s8_weights_map) the weights stream faster, and a third slot and
// the prefetch pay more often (bench --stream_prefetch, M = 1, us, medians of three rounds in
// turns; 2 slots + 0 / 2 / 4 / 8 units, then 3 slots + the same):
//   6144 x 4096      15.0 / 15.7 / 16.3 / 16.3      15.1 / 16.2 / 16.3 / 16.5
//   4096 x 4096      14.1 / 14.0 / 13.6 / 13.6      13.7 / 14.3 / 13.9 / 14.0
//   28672 x 4096     37.7 / 37.4 / 37.3 / 38.0      36.6 / 36.5 / 37.1 / 37.3
//   4096 x 14336     24.6 / 23.7 / 23.6 / 25.5      23.6 / 23.2 / 23.7 / 25.5
//   8192 x 8192      25.5 / 25.3 / 25.3 / 26.7      24.6 / 24.5 / 25.3 / 26.5
//   57344 x 8192    121.3 / 119.8 / 119.7 / 119.8  115.1 / 114.6 / 114.6 / 114.3
//   8192 x 28672     67.2 / 65.9 / 65.0 / 64.6      63.9 / 62.4 / 61.2 / 61.3
// so load times 2 slots, and 3 slots with 0, 2, 4 or 8 units. Four slots won nowhere (both forms,
// 0-8 units: 8192 x 28672 at M = 1 61.2 vs 61.1, at M = 16 67.2 vs 66.3; 57344 x 8192 114.7 vs
// 114.3, 121.5 vs 120.5; within 0.5 us or slower on the other layers). The two-launch form (M = 16,
// 3 slots, 0 / 2 / 4 / 8 units) gains from the prefetch too now, while the quantize kernel runs:
// 57344 x 8192 124.8 / 122.0 / 120.8 / 120.9, 8192 x 28672 69.0 / 67.8 / 66.7 / 66.2, 8192 x
// 8192 28.4 / 27.5 / 27.6 / 29.0, 28672 x 4096 43.2 / 41.8 / 42.2 / 43.4, but 6144 x 4096
// 17.8 / 18.3 / 18.2 / 18.2; so load times its prefetch at M = 16 as well (kTunedUnfusedM), on
// layers larger than the L2 only: on the two smaller benchmark layers it gained at most 0.4 us
// (4096 x 4096 15.9 -> 15.5) or lost, and its timings add tens of milliseconds to a load. Filling
// fewer ring slots before the grid dependency, the prefetch taking the units after them, paid
// more on those layers (M = 16, 3 slots, us; the whole ring filled + 0 / + 4 units, 1 slot + 4 /
// + 8, none + 4 / + 8):
//   8192 x 28672    69.1 / 66.6    65.5 / 65.8    64.6 / 64.9
//   57344 x 8192   124.5 / 119.9  119.4 / 120.4  119.9 / 120.4
//   8192 x 8192     28.3 / 27.6    26.9 / 28.9    27.0 / 29.3
//   4096 x 14336    26.9 / 26.5    26.0 / 27.2    26.0 / 27.6
//   28672 x 4096    43.0 / 41.8    40.5 / 43.1    41.2 / 43.1
// The whole ring (+ 0 or 4), 1 slot + 8 and none + 8 were never the fastest; with all five timed
// at load, a load picked 1 slot + 8 on 8192 x 28672 (65.8 us in turns against 64.6 for none + 4;
// the benchmark's op 66.0), the timings' noise about the gaps between the candidates. So the
// two-launch form times two starts, 1 slot + 4 and none + 4, in kStartRounds rounds.
// (With the 256-byte promotion the two-launch form gained only on 57344 x 8192, 124.4 -> 123.0
// us with 3 slots + 2, and prefetched nothing. Nor did that form gain when its launch asked only
// for its slots' shared memory, so that its blocks could share the SMs with the quantize kernel's
// and start streaming at once: M = 16, 3 slots, us, all / its slots' shared memory, 8192 x
// 28672 70.0 / 69.9-70.1, 8192 x 8192 28.3-28.4 / 28.3-28.4, 4096 x 14336 27.4 / 27.4-27.5.)
//
// How they are timed matters. After the autotune's L2 read (measure_us) the prefetch gained
// nothing: 8192 x 28672, us, 2 slots + 0 / 2 / 4, 3 slots + 0 / 2: 66.7 / 66.6 / 66.7, 66.9 /
// 67.1 (57344 x 8192: 121.0 / 121.2 / 122.9, 121.3 / 122.1); that read leaves the L2 full of one
// buffer's lines and the activations out of it, where a model's decode finds the previous
// layers' weights and the activations just written. Back to back on one copy of the weights
// (bench --stream_prefetch, "as at load") the calls pick what the rotated copies pick on every
// layer whose weights are more than twice the L2 (no call then finds its weights in L2: each
// streams past what the L2 holds): 8192 x 28672 69.0 / 67.6 / 66.7, 68.5 / 67.1; 57344 x 8192
// 122.4 / 121.4 / 122.5, 123.2 / 123.5; 28672 x 4096 39.6 / 39.6 / 40.7, 39.1 / 40.3. Smaller
// layers would be warm that way and are timed after the L2 read as before.
//
// The candidates are timed in turns, kRingRounds times each, and the lowest median of those
// timings wins: one timing of each, one after the other, picked the slower depth on two of the
// seven benchmark layers in a load (6144 x 4096: 3 slots, 28672 x 4096: 2), the GPU's clock
// drifting between them.
absl::Status StreamS8Prepared::tune_fused_ring() {
  struct Ring {
    int stages, ahead;
  };
  constexpr Ring kRings[] = {{2, 0}, {3, 0}, {3, 2}, {3, 4}, {3, 8}};
  constexpr Start kStarts[] = {{1, 4}, {-1, 4}};
  constexpr int kRingRounds = 5;
  constexpr int kStartRounds = 9;
  const LayerConfig& c = weights_.config;
  ASSIGN_OR_RETURN(const int64_t l2_bytes, device_l2_bytes());
  const bool cold = c.n * c.k <= 2 * l2_bytes;
  // Each candidate set (applied by `set`) timed in turns at m tokens, through the autotune's own
  // measurement (made-up bf16 activations); returns the fastest candidate's index.
  auto fastest = [&](size_t count, int64_t m, int rounds, auto set) -> absl::StatusOr<size_t> {
    std::vector<std::vector<double>> us(count);
    for (int r = 0; r < rounds; ++r) {
      for (size_t j = 0; j < count; ++j) {
        set(j);
        ASSIGN_OR_RETURN(const double t,
                         measure_us(ProblemShape{m, c.n, c.k, DType::kBF16, DType::kBF16}, cold));
        us[j].push_back(t);
      }
    }
    return lowest_median(us);
  };
  if (stream_s8_fuses_rows(1, c.k)) {
    ASSIGN_OR_RETURN(const size_t best, fastest(std::size(kRings), 1, kRingRounds, [&](size_t j) {
                       fused_stages_ = kRings[j].stages;
                       fused_ahead_ = kRings[j].ahead;
                     }));
    fused_stages_ = kRings[best].stages;
    fused_ahead_ = kRings[best].ahead;
  }
  if (!stream_s8_fuses_rows(kTunedUnfusedM, c.k) && c.n * c.k > l2_bytes) {
    ASSIGN_OR_RETURN(const size_t best, fastest(std::size(kStarts), kTunedUnfusedM, kStartRounds,
                                                [&](size_t j) { unfused_start_ = kStarts[j]; }));
    unfused_start_ = kStarts[best];
    unfused_timed_ = true;
  }
  return absl::OkStatus();
}

std::string StreamS8Prepared::variant(int64_t m) const {
  const LayerConfig& c = weights_.config;
  // (16-bit activations at 16-byte aligned addresses, as the serving path holds them.)
  if (stream_s8_fuses_rows(m, c.k)) {
    const std::string ring =
        fused_stages_ > 0
            ? absl::StrCat(fused_stages_, " slots",
                           fused_ahead_ > 0
                               ? absl::StrCat(" and ", fused_ahead_, " units prefetched into L2")
                               : std::string(),
                           " (timed fastest ", timed_when_, ", M=1",
                           tuned_shared_ ? kTunedByEarlierLayer : "", ")")
            : absl::StrCat("the default slots (timing them ", timed_when_, " failed: ", tune_error_,
                           ")");
    return absl::StrCat("quantizes inside the launch (16-bit activations); ring of ", ring);
  }
  const std::string two = "the quantize kernel first, this kernel as its programmatic dependent";
  if (!unfused_timed_) return two;
  const Start& st = unfused_start_;
  return absl::StrCat(two, "; before it waits, ",
                      st.slots == 0   ? std::string("its whole ring")
                      : st.slots < 0  ? std::string("no ring slot")
                      : st.slots == 1 ? std::string("1 ring slot")
                                      : absl::StrCat(st.slots, " ring slots"),
                      " filled and ", st.ahead > 0 ? absl::StrCat(st.ahead) : std::string("no"),
                      " units prefetched into L2 (timed fastest ", timed_when_,
                      ", M=", kTunedUnfusedM, tuned_shared_ ? kTunedByEarlierLayer : "", ")");
}

absl::Status StreamS8Prepared::enqueue(const DeviceRunArgs& args, void* scratch,
                                       cudaStream_t stream, const StageEvents* events,
                                       const DeviceDebugOutputs* debug) const {
  const LayerConfig& c = weights_.config;
  const int64_t m = args.m;
  if (m < 1 || m > kStreamMaxM) {
    return absl::FailedPreconditionError(
        absl::StrCat("M=", m, " is outside 1..", kStreamMaxM, " (cuda.stream_s8)"));
  }
  const ScratchLayout L(m, c.n, c.k, grid_);
  int8_t* xq = at<int8_t>(scratch, L.xq);
  float* sa = args.sa != nullptr ? args.sa : at<float>(scratch, L.sa);
  int32_t* azp = args.azp != nullptr ? args.azp : at<int32_t>(scratch, L.azp);
  int32_t* counters = at<int32_t>(scratch, L.counters);

  StreamS8Args g;
  g.w_map = w_map_;
  g.xq = xq;
  g.sa = sa;
  g.azp = azp;
  g.m = m;
  g.n = c.n;
  g.k = c.k;
  g.scheme = static_cast<QuantScheme>(c.scheme);
  g.w = dev_->w.as<int8_t>();
  g.sb = dev_->sb.as<float>();
  g.azp_adj = is_asymmetric(c.scheme) ? dev_->azp_adj.as<int32_t>() : nullptr;
  g.bias = c.has_bias ? dev_->bias.as<float>() : nullptr;
  g.y = args.y;
  g.y_type = static_cast<ElemType>(args.y_dtype);
  g.acc = debug != nullptr ? debug->acc : nullptr;
  g.counters = counters;
  g.partials = at<int32_t>(scratch, L.partials);
  g.grid = grid_;
  g.pdl = true;
  const QuantizeParams qp = quantize_params(c);
  const XqLayout layout = stream_xq_layout(m);
  const ElemType x_type = static_cast<ElemType>(args.x_dtype);
  // A few rows of 16-bit activations are quantized inside the kernel: no quantize kernel, and the
  // weights stream from the launch's first microsecond (see stream_s8.h).
  g.fuse = stream_s8_can_fuse(m, c.k, x_type, args.x);

  RETURN_IF_CUDA_ERROR(record_stage(events, 0, stream));
  if (g.fuse) {
    g.pdl = false;
    g.stages = fused_stages_;
    g.l2_prefetch = fused_ahead_;
    g.x = args.x;
    g.x_type = x_type;
    g.qp = qp;
    g.sa_out = args.sa_host != nullptr ? args.sa_host : sa;
    g.azp_out = args.sa_host != nullptr ? args.azp_host : azp;
    g.xq_out = debug != nullptr ? xq : nullptr;
    g.flags = at<uint64_t>(scratch, L.flags);
    g.token = token_;
  } else {
    g.prefetch = unfused_start_.slots;
    g.l2_prefetch = unfused_start_.ahead;
    RETURN_IF_CUDA_ERROR(launch_quantize_s8(args.x, x_type, m, c.k, qp, xq, sa, azp, stream,
                                            counters, stream_s8_counters(c.n), &layout, true,
                                            RowParamsMirror{args.sa_host, args.azp_host}));
  }
  // The event does not hold the programmatic launch back (measured on the H200: recording it
  // here or before the quantize kernel gives the same serving time): the quantize stage is the
  // quantize kernel (empty when the GEMM quantizes), and the GEMM stage the rest of the GEMM
  // after it.
  RETURN_IF_CUDA_ERROR(record_stage(events, 1, stream));
  RETURN_IF_CUDA_ERROR(launch_stream_s8(g, stream));
  RETURN_IF_CUDA_ERROR(record_stage(events, 2, stream));
  if (debug != nullptr) {
    // xq back to row-major, chunk by chunk.
    for (int64_t k0 = 0; k0 < c.k; k0 += kStreamChunk) {
      const size_t len = static_cast<size_t>(std::min<int64_t>(kStreamChunk, c.k - k0));
      RETURN_IF_CUDA_ERROR(cudaMemcpy2DAsync(
          debug->xq + k0, static_cast<size_t>(c.k), xq + (k0 / kStreamChunk) * layout.chunk_stride,
          kStreamXRow, len, static_cast<size_t>(m), cudaMemcpyDeviceToDevice, stream));
    }
  }
  return absl::OkStatus();
}

class StreamS8Kernel final : public Kernel {
 public:
  absl::string_view name() const override { return kStreamS8KernelName; }
  absl::Status is_supported(const HostInfo& host) const override {
    RETURN_IF_ERROR(cuda_device_usable(host));
    return stream_s8_device_gate(host.gpus[0]);
  }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    RETURN_IF_ERROR(check_rows_of_16_bytes(config, "16-byte bulk copies", "16-row mma tiles"));
    if (shape.m < 1 || shape.m > kStreamMaxM) {
      return absl::FailedPreconditionError(
          absl::StrCat("M=", shape.m, " is outside 1..", kStreamMaxM, " (small-M kernel)"));
    }
    return absl::OkStatus();
  }
  // Decode and small batches (M = 1..16); up to 32 tokens when forced (the 17..64 bucket is
  // measured at M = 64, which it cannot take). Measured on the H200 (bench/gpu/gpu_bench.cc,
  // weights rotated past L2, bf16 in/out, bias), op time in us, this kernel / cuda.cutlass_sm90 /
  // cuda.cublaslt / cuda.gemv_s8 (M = 1 quantizing inside the launch):
  //   (N, K)          M=1                          M=16
  //   6144 x 4096     15.2 / 16.3 / 19.9 / 20.5     17.8 / 15.6 / 19.1 / 30.1
  //   4096 x 4096     13.9 / 14.9 / 19.6 / 19.8     16.0 / 14.4 / 17.5 / 29.2
  //   28672 x 4096    36.1 / 38.8 / 42.3 / 45.6     41.0 / 38.6 / 44.1 / 68.2
  //   4096 x 14336    23.3 / 32.8 / 40.3 / 32.5     26.5 / 29.1 / 30.3 / 51.6
  //   8192 x 8192     24.0 / 31.1 / 30.6 / 39.8     27.2 / 27.3 / 33.3 / 59.5
  //   57344 x 8192   114.9 / 122.1 / 174.2 / 138.8  119.7 / 124.7 / 176.0 / 181.3
  //   8192 x 28672    63.4 / 79.1 / 77.5 / 84.5     66.9 / 84.3 / 73.8 / 123.5
  // At M = 1 it wins on every layer; at M = 16 where K is long or the layer wide (one share per
  // SM whatever the tile grid), within 14% elsewhere. The server's autotune measures each layer
  // and keeps the fastest. Not
  // beyond 32 tokens: with 8 n-blocks (M = 64) the mma.sync work outran the stream, 1.3-1.7x
  // cuda.cutlass_sm90's time on every benchmark layer (57344 x 8192: 179.7 against 123.1 us).
  // Between those M (bench --small_m, one run, this kernel / cuda.cutlass_sm90, us):
  //   (N, K)          M=2            M=4            M=8            M=32
  //   6144 x 4096     16.3 / 17.9    17.4 / 17.6    20.4 / 17.2    20.1 / 18.4
  //   4096 x 4096     14.3 / 15.6    15.8 / 14.9    18.8 / 14.9    18.2 / 14.9
  //   28672 x 4096    37.2 / 39.0    38.5 / 38.9    41.4 / 38.2    48.6 / 41.3
  //   4096 x 14336    25.2 / 31.3    25.5 / 31.2    25.5 / 29.8    29.1 / 28.7
  //   8192 x 8192     25.2 / 30.6    27.8 / 30.4    26.5 / 28.9    29.5 / 28.6
  //   57344 x 8192   121.1 / 132.5  123.2 / 131.6  120.8 / 125.4  132.7 / 154.2 (a 64 x 64 tile)
  //   8192 x 28672    69.3 / 93.1    69.1 / 93.4    68.7 / 97.3    69.7 / 70.1
  // so the 2..16 bucket, measured at M = 16, picks what wins at M = 8 on every layer but 57344 x
  // 8192 (the two within 0.5 us at M = 16); only M = 2-3 on the 4096-wide layers (the one-launch
  // form) would gain from a bucket of their own (1.3-1.8 us). At M = 32 this kernel wins only
  // where the layer's load picked a poor tile for M = 64.
  MRange preferred_m() const override { return MRange{1, 16}; }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
    return prepare_with_tuning(weights, PrepareContext{});
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare_with_tuning(
      const LayerWeights& weights, const PrepareContext& context) const override {
    ASSIGN_OR_RETURN(std::unique_ptr<StreamS8Prepared> p,
                     StreamS8Prepared::create(weights, context));
    return std::unique_ptr<PreparedKernel>(std::move(p));
  }
};

}  // namespace

absl::Status stream_s8_device_gate(const GpuInfo& g) {
  if (g.cc_major < 9) {
    return absl::FailedPreconditionError(
        absl::StrCat("needs compute capability 9.0 or newer (bulk copies, programmatic launches), "
                     "device is sm_",
                     g.cc_major, g.cc_minor));
  }
  return absl::OkStatus();
}

std::unique_ptr<Kernel> make_stream_s8_kernel() { return std::make_unique<StreamS8Kernel>(); }

}  // namespace qlinear::gpu
