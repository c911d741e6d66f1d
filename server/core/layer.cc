#include "server/core/layer.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "kernels/core/status.h"

namespace qlinear {
namespace {

constexpr DType kAllDTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

ProblemShape shape_for(const LayerConfig& c, int64_t m, DType x, DType y) {
  return ProblemShape{m, c.n, c.k, x, y};
}

// Whether `k` can implement the layer for some M bucket and dtype pair: only then is it worth
// preparing (packing weights) at load.
bool implements_somewhere(const Kernel& k, const LayerConfig& c) {
  for (const MBucket& b : m_buckets()) {
    const int64_t ms[] = {b.lo, b.hi == INT64_MAX ? b.lo * 4 : b.hi};
    for (int64_t m : ms) {
      for (DType x : kAllDTypes) {
        for (DType y : kAllDTypes) {
          if (k.can_implement(c, shape_for(c, m, x, y)).ok()) return true;
        }
      }
    }
  }
  return false;
}

}  // namespace

Layer::Layer(Options options, std::shared_ptr<const LayerWeights> weights, const Registry& registry,
             const HostInfo& host)
    : options_(std::move(options)),
      weights_(std::move(weights)),
      registry_(registry),
      host_(host) {}

absl::StatusOr<std::shared_ptr<const Layer>> Layer::create(
    Options options, std::shared_ptr<const LayerWeights> weights, const Registry& registry,
    const HostInfo& host) {
  std::shared_ptr<Layer> layer(new Layer(std::move(options), std::move(weights), registry, host));
  const LayerConfig& c = layer->config();
  const std::string& forced = layer->options_.forced_kernel;

  if (!forced.empty()) {
    const Kernel* k = registry.find(forced);
    if (k == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown forced_kernel '", forced, "'"));
    }
    absl::Status s = registry.usable(*k, host);
    if (s.ok() && !implements_somewhere(*k, c)) {
      s = k->can_implement(c, shape_for(c, 1, DType::kBF16, DType::kBF16));
    }
    if (!s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("forced kernel ", forced, " cannot run this layer: ", s.message()));
    }
  }

  for (const Kernel* k : registry.kernels()) {
    if (!registry.usable(*k, host).ok() || !implements_somewhere(*k, c)) continue;
    ASSIGN_OR_RETURN(std::unique_ptr<PreparedKernel> state, k->prepare(*layer->weights_));
    layer->total_bytes_ += state->extra_bytes();
    layer->prepared_.push_back({k, std::move(state)});
  }

  for (const MBucket& b : m_buckets()) {
    std::vector<const Prepared*> cands;
    for (const Prepared& p : layer->prepared_) {
      if (p.kernel->preferred_m().contains(b.lo, b.hi)) cands.push_back(&p);
    }
    layer->bucket_candidates_.push_back(std::move(cands));

    BucketInfo info{b, "", {}};
    const int64_t m = b.hi == INT64_MAX ? b.lo : b.hi;
    auto sel =
        registry.select(host, c, shape_for(c, m, DType::kBF16, DType::kBF16), forced, b.lo, b.hi);
    if (sel.ok()) {
      info.kernel = std::string(sel->kernel->name());
      info.explanation = std::move(sel->explanation);
    } else {
      info.explanation.push_back({"", false, std::string(sel.status().message())});
    }
    layer->buckets_.push_back(std::move(info));
  }

  const LayerWeights& w = *layer->weights_;
  layer->total_bytes_ +=
      static_cast<int64_t>(w.w.size() + 4 * w.sb.size() + 4 * w.bias.size() + 4 * w.azp_adj.size());
  layer->loaded_unix_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  return std::shared_ptr<const Layer>(std::move(layer));
}

const PreparedKernel* Layer::find_prepared(const Kernel* k) const {
  for (const Prepared& p : prepared_) {
    if (p.kernel == k) return p.state.get();
  }
  return nullptr;
}

absl::StatusOr<KernelChoice> Layer::choose(const ProblemShape& shape, absl::string_view forced,
                                           bool explain) const {
  if (forced.empty()) forced = options_.forced_kernel;
  const size_t bi = m_bucket_index(shape.m);
  KernelChoice choice;
  if (!forced.empty() || explain) {
    const MBucket& b = m_buckets()[bi];
    ASSIGN_OR_RETURN(Selection sel, registry_.select(host_, config(), shape, forced, b.lo, b.hi));
    choice.kernel = sel.kernel;
    choice.explanation = std::move(sel.explanation);
  } else {
    // Hot path: the bucket's short list, checked with can_implement only.
    for (const Prepared* p : bucket_candidates_[bi]) {
      if (p->kernel->can_implement(config(), shape).ok()) {
        choice.kernel = p->kernel;
        break;
      }
    }
    if (choice.kernel == nullptr) {
      // Let the registry produce the error that lists every reason.
      const MBucket& b = m_buckets()[bi];
      ASSIGN_OR_RETURN(Selection sel, registry_.select(host_, config(), shape, "", b.lo, b.hi));
      choice.kernel = sel.kernel;
    }
  }
  choice.prepared = find_prepared(choice.kernel);
  if (choice.prepared == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel ", choice.kernel->name(), " was not prepared for layer ", name(),
                     " (it could not implement the layer at load)"));
  }
  return choice;
}

std::string Layer::device() const {
  for (const BucketInfo& b : buckets_) {
    if (b.kernel.empty()) continue;
    for (const Prepared& p : prepared_) {
      if (p.kernel->name() == b.kernel) return p.state->device();
    }
  }
  return "cpu";
}

}  // namespace qlinear
