#include "bench/cpu/onednn_anchor.h"

#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

#if QLINEAR_BENCH_HAVE_ONEDNN
#include "oneapi/dnnl/dnnl.hpp"
#endif

namespace qlinear::bench {

#if QLINEAR_BENCH_HAVE_ONEDNN
namespace {

using dnnl::memory;
using Dt = dnnl::memory::data_type;
using Tag = dnnl::memory::format_tag;

// As cpu.onednn: the weights' layout is the one oneDNN picks for this M.
constexpr int64_t kLayoutM = 256;

class OneDnnGemmAnchor final : public PreparedKernel {
 public:
  explicit OneDnnGemmAnchor(const LayerWeights& w)
      : engine_(dnnl::engine::kind::cpu, 0), n_(w.config.n), k_(w.config.k) {
    const memory::desc any({k_, n_}, Dt::s8, Tag::any);
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(memory::desc({kLayoutM, k_}, Dt::u8, Tag::ab), any,
                           memory::desc({kLayoutM, n_}, Dt::s32, Tag::ab)),
        engine_);
    weights_md_ = pd.weights_desc();
    packed_ = std::make_unique<memory>(weights_md_, engine_);
    memory native(memory::desc({k_, n_}, Dt::s8, memory::dims{1, k_}), engine_,
                  const_cast<int8_t*>(w.w.data()));
    dnnl::stream stream(engine_);
    dnnl::reorder(native, *packed_).execute(stream, native, *packed_);
    stream.wait();
  }

  absl::Status run(const RunArgs& args, RunTimings*) const override {
    try {
      const int64_t m = args.m;
      std::lock_guard<std::mutex> lock(mu_);
      auto it = per_m_.find(m);
      if (it == per_m_.end()) {
        PerM p;
        p.matmul = dnnl::matmul(dnnl::matmul::primitive_desc(
            dnnl::matmul::desc(memory::desc({m, k_}, Dt::u8, Tag::ab), weights_md_,
                               memory::desc({m, n_}, Dt::s32, Tag::ab)),
            engine_));
        p.src.assign(static_cast<size_t>(m * k_), 0x85);
        p.dst.assign(static_cast<size_t>(m * n_), 0);
        it = per_m_.emplace(m, std::move(p)).first;
      }
      PerM& p = it->second;
      dnnl::stream stream(engine_);
      memory src(memory::desc({m, k_}, Dt::u8, Tag::ab), engine_, p.src.data());
      memory dst(memory::desc({m, n_}, Dt::s32, Tag::ab), engine_, p.dst.data());
      p.matmul.execute(stream,
                       {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, *packed_}, {DNNL_ARG_DST, dst}});
      stream.wait();
      return absl::OkStatus();
    } catch (const dnnl::error& e) {
      return absl::InternalError(absl::StrCat("oneDNN: ", e.what()));
    }
  }

 private:
  struct PerM {
    dnnl::matmul matmul;
    std::vector<uint8_t> src;
    std::vector<int32_t> dst;
  };

  dnnl::engine engine_;
  int64_t n_, k_;
  memory::desc weights_md_;
  std::unique_ptr<memory> packed_;
  mutable std::mutex mu_;  // the bench calls from one thread; the lock only keeps it honest
  mutable std::map<int64_t, PerM> per_m_;
};

}  // namespace

bool onednn_anchor_available() { return true; }

absl::StatusOr<std::unique_ptr<PreparedKernel>> make_onednn_gemm_anchor(
    const LayerWeights& weights) {
  try {
    return std::unique_ptr<PreparedKernel>(new OneDnnGemmAnchor(weights));
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN: ", e.what()));
  }
}

#else

bool onednn_anchor_available() { return false; }

absl::StatusOr<std::unique_ptr<PreparedKernel>> make_onednn_gemm_anchor(const LayerWeights&) {
  return absl::FailedPreconditionError("not built with oneDNN");
}

#endif

}  // namespace qlinear::bench
