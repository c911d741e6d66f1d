#include "kernels/cpu/onednn_gemm.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"
#include "kernels/cpu/cpu_support.h"

#if QLINEAR_HAVE_ONEDNN
#include <limits.h>
#include <omp.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cpu/epilogue_avx512.h"
#include "kernels/cpu/quantize_avx512.h"
#include "oneapi/dnnl/dnnl.hpp"
#endif

namespace qlinear::cpu {

absl::Status onednn_supported(const HostInfo& host) {
#if !QLINEAR_HAVE_ONEDNN
  (void)host;
  return absl::FailedPreconditionError("not compiled in (oneDNN was not found at build time)");
#else
  // Without VNNI, oneDNN's int8 kernels go through VPMADDUBSW, whose int16 intermediate
  // saturates: not exact. Our quantization and epilogue around it are AVX-512 too.
  return avx512_vnni_isa_status(host);
#endif
}

#if QLINEAR_HAVE_ONEDNN
namespace {

using dnnl::memory;
using Dt = dnnl::memory::data_type;
using Tag = dnnl::memory::format_tag;

// oneDNN's C++ API throws; this is the one place where that becomes a status.
absl::Status dnnl_call(absl::string_view what, absl::FunctionRef<void()> fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const dnnl::error& e) {
    const std::string msg = absl::StrCat("oneDNN ", what, ": ", e.what());
    return e.status == dnnl_out_of_memory ? absl::ResourceExhaustedError(msg)
                                          : absl::InternalError(msg);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("oneDNN ", what, ": out of memory"));
  }
}

// The process's CPU engine, created once.
absl::StatusOr<const dnnl::engine*> cpu_engine() {
  static dnnl::engine* engine = nullptr;
  static absl::Status status =
      dnnl_call("engine creation", [] { engine = new dnnl::engine(dnnl::engine::kind::cpu, 0); });
  if (!status.ok()) return status;
  return engine;
}

// The M at which the weights' blocked layout is chosen. oneDNN 2.6 picks its brgemm matmul with
// the same layout for every fixed M (a runtime M would fall back to its slower gemm path), so
// primitives for other M reuse the reordered weights.
constexpr int64_t kLayoutM = 256;
// The GEMM's K, padded with zero weights to whole blocks of 64. oneDNN 2.6's AMX int8 matmul
// (brg:avx512_core_amx_int8) executes an illegal instruction (SIGILL, a tileloadd in its brgemm
// kernel) on some shapes with a K tail, e.g. M = 615, K = 4159, N = 527, which would end the
// process; without a tail it takes none. The padded columns of x hold the encoding's zero
// (QuantizeArgs::xq_stride), and with zero weights add nothing.
int64_t padded_k(int64_t k) { return (k + 63) / 64 * 64; }
// Distinct M values whose primitives are kept per layer; beyond that a call creates its own.
constexpr size_t kMaxCachedPrimitives = 64;
// Below these sizes quantization and epilogue stay on the calling thread.
constexpr int64_t kParallelMinElems = int64_t{1} << 15;

struct Primitive {
  dnnl::matmul matmul;
  size_t scratchpad_bytes = 0;
};

class OneDnnPrepared final : public MeasuredCpuKernel {
 public:
  bool runs_on_thread_pool() const override { return false; }  // oneDNN's OpenMP team
  absl::Span<const uint8_t> weight_memory() const override {
    return {packed_.get(), weights_md_.get_size()};
  }
  static absl::StatusOr<std::unique_ptr<PreparedKernel>> create(const LayerWeights& w) {
    ASSIGN_OR_RETURN(const dnnl::engine* engine, cpu_engine());
    std::unique_ptr<OneDnnPrepared> p(new OneDnnPrepared(w, *engine));
    const LayerConfig& c = w.config;
    const int64_t kp = padded_k(c.k);
    RETURN_IF_ERROR(dnnl_call("weight reorder", [&] {
      const memory::desc any({kp, c.n}, Dt::s8, Tag::any);
      const dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(memory::desc({kLayoutM, kp}, Dt::u8, Tag::ab), any,
                             memory::desc({kLayoutM, c.n}, Dt::s32, Tag::ab)),
          p->engine_);
      p->weights_md_ = pd.weights_desc();
      p->packed_ = allocate_buffer(p->weights_md_.get_size());
      if (p->packed_ == nullptr) throw std::bad_alloc();
      // [N, K] row-major is K x N with strides {1, K}; with a tail, a copy padded to [N, kp].
      std::vector<int8_t> padded;
      if (kp != c.k) {
        padded.assign(static_cast<size_t>(c.n * kp), 0);
        for (int64_t n = 0; n < c.n; ++n) {
          std::memcpy(padded.data() + n * kp, w.w.data() + n * c.k, static_cast<size_t>(c.k));
        }
      }
      memory native(memory::desc({kp, c.n}, Dt::s8, memory::dims{1, kp}), p->engine_,
                    kp != c.k ? padded.data() : const_cast<int8_t*>(w.w.data()));
      memory packed(p->weights_md_, p->engine_, p->packed_.get());
      dnnl::stream stream(p->engine_);
      dnnl::reorder(native, packed).execute(stream, native, packed);
      stream.wait();
    }));
    // -128 * colsum[n], wrapping: turns sum (xq + 128) * W back into sum xq * W.
    p->comp_.resize(c.n);
    for (int64_t n = 0; n < c.n; ++n) {
      uint32_t sum = 0;
      for (int64_t i = 0; i < c.k; ++i) sum += static_cast<uint32_t>(int32_t{w.w[n * c.k + i]});
      p->comp_[n] = static_cast<int32_t>(0u - 128u * sum);
    }
    p->bias_ = round_bias(w);
    p->extra_bytes_ = static_cast<int64_t>(p->weights_md_.get_size()) + 4 * c.n + p->bias_.bytes();
    return std::unique_ptr<PreparedKernel>(std::move(p));
  }

  int64_t extra_bytes() const override { return extra_bytes_; }
  // Which CPU kernel is fastest depends on the CPU: autotune measures it (cpu_support.h).
  const LayerConfig& layer_config() const override { return weights_.config; }

  absl::Status run(const RunArgs& args, RunTimings* timings) const override {
    const LayerConfig& c = weights_.config;
    const int64_t m = args.m;
    if (m < 1) return absl::InvalidArgumentError("M must be >= 1");
    ASSIGN_OR_RETURN(std::shared_ptr<const Primitive> prim, primitive_for(m));

    // Per-thread scratch: xu [M, K] | acc [M, N] | sa [M] | azp [M], and oneDNN's scratchpad.
    thread_local ScratchBuffer scratch, pad;
    absl::Cleanup trim = [] {
      scratch.release_if_larger(kKeepScratchBytes);
      pad.release_if_larger(kKeepScratchBytes);
    };
    const int64_t kp = padded_k(c.k);
    const size_t xu_bytes = static_cast<size_t>(m * kp);
    const size_t acc_bytes = static_cast<size_t>(4 * m * c.n);
    uint8_t* buf = scratch.get(xu_bytes + acc_bytes + static_cast<size_t>(8 * m));
    uint8_t* pad_buf = pad.get(prim->scratchpad_bytes + 64);
    if (buf == nullptr || pad_buf == nullptr) {
      return absl::ResourceExhaustedError("cpu.onednn: cannot allocate scratch");
    }
    uint8_t* xu = buf;
    auto* acc = reinterpret_cast<int32_t*>(buf + xu_bytes);
    auto* sa = reinterpret_cast<float*>(buf + xu_bytes + acc_bytes);
    auto* azp = reinterpret_cast<int32_t*>(buf + xu_bytes + acc_bytes + 4 * m);

    const int64_t t0 = now_ns();
    QuantizeArgs q = quantize_args_for(c, args, sa, azp);
    q.xq = reinterpret_cast<int8_t*>(xu);
    q.xq_stride = kp;
    q.shift_to_u8 = true;
    int64_t bad_row = INT64_MAX;
    const int threads = m * c.k < kParallelMinElems ? 1 : omp_get_max_threads();
#pragma omp parallel for if (threads > 1) num_threads(threads) schedule(static) \
    reduction(min                                                               \
              : bad_row)
    for (int64_t t = 0; t < threads; ++t) {
      const int64_t r = quantize_rows_avx512(q, m * t / threads, m * (t + 1) / threads);
      if (r >= 0 && r < bad_row) bad_row = r;
    }
    if (bad_row != INT64_MAX) return non_finite_row_error(args.x, args.x_dtype, c.k, bad_row);
    const int64_t t1 = now_ns();

    RETURN_IF_ERROR(dnnl_call("matmul", [&] {
      dnnl::stream stream(engine_);
      memory src(memory::desc({m, kp}, Dt::u8, Tag::ab), engine_, xu);
      memory wei(weights_md_, engine_, packed_.get());
      memory dst(memory::desc({m, c.n}, Dt::s32, Tag::ab), engine_, acc);
      memory scratchpad(
          memory::desc({static_cast<memory::dim>(prim->scratchpad_bytes)}, Dt::u8, Tag::a), engine_,
          pad_buf);
      prim->matmul.execute(stream, {{DNNL_ARG_SRC, src},
                                    {DNNL_ARG_WEIGHTS, wei},
                                    {DNNL_ARG_DST, dst},
                                    {DNNL_ARG_SCRATCHPAD, scratchpad}});
      stream.wait();
    }));

    EpilogueArgs e = epilogue_args_for(weights_, bias_, args, sa, azp);
    e.comp = comp_.data();
    const int etasks = m * c.n < kParallelMinElems ? 1 : omp_get_max_threads();
#pragma omp parallel for if (etasks > 1) num_threads(etasks) schedule(static)
    for (int64_t t = 0; t < etasks; ++t) {
      const int64_t r0 = m * t / etasks, r1 = m * (t + 1) / etasks;
      // Row blocks of 8 keep sb, bias and the adjustments in cache across the rows.
      for (int64_t r = r0; r < r1; r += 8) {
        const int64_t rows = r1 - r < 8 ? r1 - r : 8;
        epilogue_s32_avx512(e, acc + r * c.n, c.n, r, rows, 0, c.n);
      }
    }
    const int64_t t2 = now_ns();

    finish_call(c, args, sa, azp, t0, t1, t2, timings);
    return absl::OkStatus();
  }

 private:
  OneDnnPrepared(const LayerWeights& w, const dnnl::engine& engine)
      : weights_(w), engine_(engine) {}

  absl::StatusOr<std::shared_ptr<const Primitive>> primitive_for(int64_t m) const {
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = cache_.find(m);
      if (it != cache_.end()) return it->second;
    }
    auto prim = std::make_shared<Primitive>();
    const LayerConfig& c = weights_.config;
    RETURN_IF_ERROR(dnnl_call("matmul creation", [&] {
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // concurrent calls, own scratch
      const dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(memory::desc({m, padded_k(c.k)}, Dt::u8, Tag::ab), weights_md_,
                             memory::desc({m, c.n}, Dt::s32, Tag::ab)),
          attr, engine_);
      prim->scratchpad_bytes = pd.scratchpad_desc().get_size();
      prim->matmul = dnnl::matmul(pd);
    }));
    absl::WriterMutexLock lock(&mu_);
    if (cache_.size() < kMaxCachedPrimitives) cache_.emplace(m, prim);
    return std::shared_ptr<const Primitive>(std::move(prim));
  }

  const LayerWeights& weights_;
  const dnnl::engine& engine_;
  memory::desc weights_md_;
  std::unique_ptr<uint8_t[], FreeDeleter> packed_;
  std::vector<int32_t> comp_;
  RoundedBias bias_;
  int64_t extra_bytes_ = 0;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<int64_t, std::shared_ptr<const Primitive>> cache_;
};

}  // namespace
#endif  // QLINEAR_HAVE_ONEDNN

namespace {

class OneDnnKernel final : public Kernel {
 public:
  absl::string_view name() const override { return "cpu.onednn"; }
  absl::Status is_supported(const HostInfo& host) const override { return onednn_supported(host); }
  absl::Status can_implement(const LayerConfig& config, const ProblemShape& shape) const override {
    if (config.k > kOneDnnMaxK) {
      return absl::InvalidArgumentError(
          absl::StrCat("K=", config.k, " exceeds ", kOneDnnMaxK,
                       ", the largest K whose u8 x s8 int32 accumulation cannot overflow"));
    }
    if (shape.m < 1) return absl::InvalidArgumentError("M must be >= 1");
    return absl::OkStatus();
  }
  // Every M bucket: it runs wherever cpu.avx512_vnni is disabled. Where both run,
  // cpu.avx512_vnni (first in the priority order) measured as fast or faster in every bucket (see
  // its preferred_m).
  MRange preferred_m() const override { return MRange{}; }
  // Its reordered copy of the weights: about N x K bytes (padded).
  int64_t host_bytes_to_prepare(const LayerConfig& config) const override {
    return config.n * config.k;
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> prepare(
      const LayerWeights& weights) const override {
    RETURN_IF_ERROR(onednn_supported(host_info()));
#if QLINEAR_HAVE_ONEDNN
    return OneDnnPrepared::create(weights);
#else
    (void)weights;
    return absl::InternalError("unreachable");
#endif
  }
};

}  // namespace

std::unique_ptr<Kernel> make_onednn_kernel() { return std::make_unique<OneDnnKernel>(); }

std::string apply_openmp_spin_default(char** argv) {
#if !QLINEAR_HAVE_ONEDNN
  (void)argv;
  return "";
#else
  constexpr const char* kMark = "QLINEAR_OPENMP_SPIN_SET";  // set across our own re-execution
  const bool reexecuted = std::getenv(kMark) != nullptr;
  unsetenv(kMark);  // not for child processes
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (spin != nullptr && *spin == '\0') spin = nullptr;  // libgomp ignores an empty one
  if (policy != nullptr || spin != nullptr) {
    std::string what = "OpenMP (cpu.onednn):";
    if (spin != nullptr) {
      absl::StrAppend(&what, " GOMP_SPINCOUNT=", spin,
                      reexecuted ? " (qlinear's default; set GOMP_SPINCOUNT or OMP_WAIT_POLICY "
                                   "to choose another)"
                                 : " from the environment");
    }
    if (policy != nullptr) {
      absl::StrAppend(&what, spin != nullptr ? " and" : "", " OMP_WAIT_POLICY=", policy,
                      " from the environment");
    }
    return what;
  }
  const std::string keep =
      "OpenMP (cpu.onednn): libgomp's default spin (about 10 ms after each call), since ";
  if (reexecuted) return keep + "GOMP_SPINCOUNT did not reach the re-executed program";
  if (argv == nullptr || argv[0] == nullptr) return keep + "there is no argv to re-execute with";
  // Re-execute the program's own file by its real path (so that the process keeps its name), and
  // only where that is what the kernel started: not under a loader or a tool that runs it
  // (ld-linux.so, valgrind), where the same arguments would start something else.
  char self[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return keep + "/proc/self/exe cannot be read";
  self[len] = '\0';
  const char* execfn = reinterpret_cast<const char*>(getauxval(AT_EXECFN));
  char started[PATH_MAX];
  if (execfn == nullptr || realpath(execfn, started) == nullptr ||
      std::strcmp(started, self) != 0) {
    return keep + "the program was started through another one (/proc/self/exe is " + self + ")";
  }
  if (setenv("GOMP_SPINCOUNT", kOpenMpSpinCount, 1) != 0 || setenv(kMark, "1", 1) != 0) {
    unsetenv("GOMP_SPINCOUNT");
    return keep + "the environment cannot be set";
  }
  execv(self, argv);
  const int err = errno;  // execv returns only on failure
  unsetenv("GOMP_SPINCOUNT");
  unsetenv(kMark);
  return keep + "re-executing " + self + " with GOMP_SPINCOUNT=" + kOpenMpSpinCount +
         " failed: " + std::strerror(err);
#endif
}

}  // namespace qlinear::cpu
