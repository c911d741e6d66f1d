#include "kernels/cpu/avx2_kernel.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cpu/cpu_support.h"
#include "kernels/cpu/thread_pool.h"
#if QLINEAR_HAVE_AVX2
#include "kernels/cpu/avx2_gemm.h"
#include "kernels/cpu/quantize_avx2.h"
#endif

namespace qlinear::cpu {

absl::Status avx2_supported(const HostInfo& host) { return avx2_isa_status(host); }

#if QLINEAR_HAVE_AVX2
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Tuning of the work split, measured with bench/cpu/qlinear_cpu_bench on a 2-core AMD EPYC
// (Zen 2, AVX2 only) VM.
struct Tuning {
  // Up to this M the weights stream from DRAM once per call and the GEMM is memory-bound, so the
  // tiles prefetch the weights ahead of use.
  int64_t stream_max_m = 16;
  int64_t prefetch_bytes = 1024;
  // Tasks per thread: the last task bounds the imbalance between threads (a late-waking worker,
  // or a core taken by another process), the number of tasks bounds the claiming overhead.
  int64_t tasks_per_thread = 16;
  // Quantize rows on several threads only when there is enough of it to repay the hand-off.
  int64_t parallel_quantize_min_elems = int64_t{1} << 15;
};

constexpr Tuning kTuning;

class Avx2Prepared final : public PreparedKernel {
 public:
  static absl::StatusOr<std::unique_ptr<PreparedKernel>> create(const LayerWeights& w) {
    std::unique_ptr<Avx2Prepared> p(new Avx2Prepared(w));
    const LayerConfig& c = w.config;
    p->k_pad_ = round_up(c.k, 2);
    p->n_pad_ = round_up(c.n, 8);
    p->panels_ = (p->n_pad_ + kAvx2Panel - 1) / kAvx2Panel;
    p->ldx_ = round_up(p->k_pad_, 32);  // int16 rows on 64-byte boundaries
    const size_t packed_bytes = static_cast<size_t>(p->n_pad_) * static_cast<size_t>(p->k_pad_);
    p->packed_ = allocate_buffer(packed_bytes);
    if (p->packed_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu.avx2: cannot allocate ", packed_bytes, " bytes for packed weights"));
    }
    // Packing is a pass over the weights: spread over the pool (a load that finds the pool busy
    // with requests packs on its own thread).
    const int64_t chunks = std::min<int64_t>(p->panels_, 8 * ThreadPool::global().threads());
    ThreadPool::global().parallel_for(chunks, [&](int64_t t) {
      pack_weights_avx2(w.w.data(), c.n, c.k, p->k_pad_, p->n_pad_,
                        reinterpret_cast<int8_t*>(p->packed_.get()), p->panels_ * t / chunks,
                        p->panels_ * (t + 1) / chunks);
    });
    p->bias_ = round_bias(w);
    p->extra_bytes_ = static_cast<int64_t>(packed_bytes) + p->bias_.bytes();
    return std::unique_ptr<PreparedKernel>(std::move(p));
  }

  int64_t extra_bytes() const override { return extra_bytes_; }

  absl::Status run(const RunArgs& args, RunTimings* timings) const override {
    const LayerConfig& c = weights_.config;
    const int64_t m = args.m;
    if (m < 1) return absl::InvalidArgumentError("M must be >= 1");
    ThreadPool& pool = ThreadPool::global();
    const int threads = pool.threads();

    // Per-thread scratch: x16 [M, ldx] int16, sa [M], azp [M].
    thread_local ScratchBuffer scratch;
    const size_t x16_bytes = static_cast<size_t>(round_up(2 * m * ldx_, 64));
    uint8_t* buf = scratch.get(x16_bytes + static_cast<size_t>(8 * m));
    if (buf == nullptr) {
      return absl::ResourceExhaustedError("cpu.avx2: cannot allocate activation scratch");
    }
    auto* x16 = reinterpret_cast<int16_t*>(buf);
    auto* sa = reinterpret_cast<float*>(buf + x16_bytes);
    auto* azp = reinterpret_cast<int32_t*>(buf + x16_bytes + 4 * m);

    const int64_t t0 = now_ns();
    QuantizeArgs q;
    q.scheme = c.scheme;
    q.input_scale = c.input_scale;
    q.input_zero_point = c.input_zero_point;
    q.x = args.x;
    q.x_dtype = args.x_dtype;
    q.k = c.k;
    q.xq_stride = ldx_;
    q.sa = sa;
    q.azp = azp;
    int64_t bad_row = -1;
    if (m * c.k < kTuning.parallel_quantize_min_elems || threads == 1) {
      bad_row = quantize_rows_avx2(q, x16, 0, m);
    } else {
      const int64_t tasks = std::min<int64_t>(m, 4 * threads);
      std::atomic<int64_t> first_bad{INT64_MAX};
      pool.parallel_for(tasks, [&](int64_t t) {
        const int64_t r = quantize_rows_avx2(q, x16, m * t / tasks, m * (t + 1) / tasks);
        if (r >= 0) {
          int64_t cur = first_bad.load();
          while (r < cur && !first_bad.compare_exchange_weak(cur, r)) {
          }
        }
      });
      if (first_bad.load() != INT64_MAX) bad_row = first_bad.load();
    }
    if (bad_row >= 0) return non_finite_row_error(args.x, args.x_dtype, c.k, bad_row);
    const int64_t t1 = now_ns();

    Avx2GemmArgs g;
    g.packed = reinterpret_cast<const int8_t*>(packed_.get());
    g.n = c.n;
    g.k_pad = k_pad_;
    g.n_pad = n_pad_;
    g.x16 = x16;
    g.ldx = ldx_;
    g.prefetch_bytes = m <= kTuning.stream_max_m ? kTuning.prefetch_bytes : 0;
    g.epi.scheme = c.scheme;
    g.epi.sb = weights_.sb.data();
    g.epi.bias_f = bias_.get(args.y_dtype);
    g.epi.azp_adj = is_asymmetric(c.scheme) ? weights_.azp_adj.data() : nullptr;
    g.epi.sa = sa;
    g.epi.azp = azp;
    g.epi.y = args.y;
    g.epi.y_dtype = args.y_dtype;
    g.epi.ldy = c.n;

    // Split: contiguous panel ranges first (each panel's weights are read once per call), then
    // row ranges when there are too few panels to keep every thread busy or when a long K needs
    // more accumulator scratch than one chunk may use.
    const int64_t target = threads == 1 ? 1 : threads * kTuning.tasks_per_thread;
    const int64_t row_tiles = (m + kAvx2Mr - 1) / kAvx2Mr;
    const int64_t panel_chunks = std::min(panels_, target);
    const int64_t max_chunk_tiles = kAvx2MaxRows / kAvx2Mr;
    const int64_t row_chunks =
        std::min(row_tiles, std::max((target + panel_chunks - 1) / panel_chunks,
                                     (row_tiles + max_chunk_tiles - 1) / max_chunk_tiles));
    std::atomic<bool> out_of_memory{false};
    pool.parallel_for(panel_chunks * row_chunks, [&](int64_t t) {
      const int64_t pc = t / row_chunks, rc = t % row_chunks;
      const int64_t p0 = panels_ * pc / panel_chunks, p1 = panels_ * (pc + 1) / panel_chunks;
      const int64_t r0 = std::min(m, row_tiles * rc / row_chunks * kAvx2Mr);
      const int64_t r1 = std::min(m, row_tiles * (rc + 1) / row_chunks * kAvx2Mr);
      thread_local ScratchBuffer acc_scratch;
      auto* acc = reinterpret_cast<int32_t*>(acc_scratch.get(kAvx2MaxRows * kAvx2Panel * 4));
      if (acc == nullptr) {
        out_of_memory.store(true);
        return;
      }
      gemm_s16s8_avx2(g, r0, r1, p0, p1, acc);
    });
    if (out_of_memory.load()) {
      return absl::ResourceExhaustedError("cpu.avx2: cannot allocate accumulator scratch");
    }
    const int64_t t2 = now_ns();

    if (args.sa != nullptr) std::copy(sa, sa + m, args.sa);
    if (args.azp != nullptr && is_asymmetric(c.scheme)) std::copy(azp, azp + m, args.azp);
    scratch.release_if_larger(kKeepScratchBytes);
    if (timings != nullptr) {
      timings->quantize_ns = t1 - t0;
      timings->gemm_ns = t2 - t1;
    }
    return absl::OkStatus();
  }

 private:
  explicit Avx2Prepared(const LayerWeights& w) : weights_(w) {}

  const LayerWeights& weights_;
  int64_t k_pad_ = 0, n_pad_ = 0, panels_ = 0, ldx_ = 0;
  std::unique_ptr<uint8_t[], FreeDeleter> packed_;
  RoundedBias bias_;
  int64_t extra_bytes_ = 0;
};

}  // namespace
#endif  // QLINEAR_HAVE_AVX2

namespace {

class Avx2Kernel final : public Kernel {
 public:
  absl::string_view name() const override { return "cpu.avx2"; }
  absl::Status is_supported(const HostInfo& host) const override { return avx2_supported(host); }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    // Every scheme, dtype and shape: tails in M, N and K are handled, not refused.
    if (config.k > kMaxK) {
      return absl::InvalidArgumentError(absl::StrCat("K=", config.k, " exceeds ", kMaxK));
    }
    if (shape.m < 1) return absl::InvalidArgumentError("M must be >= 1");
    return absl::OkStatus();
  }
  // Every M bucket: on the hosts it serves, the only other candidate is the scalar reference.
  MRange preferred_m() const override { return MRange{}; }
  bool measurable() const override { return false; }  // the priority order ranks it
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
#if QLINEAR_HAVE_AVX2
    RETURN_IF_ERROR(avx2_supported(host_info()));
    return Avx2Prepared::create(weights);
#else
    (void)weights;
    return avx2_supported(host_info());
#endif
  }
};

}  // namespace

std::unique_ptr<Kernel> make_avx2_kernel() { return std::make_unique<Avx2Kernel>(); }

}  // namespace qlinear::cpu
