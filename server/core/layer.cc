#include "server/core/layer.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "kernels/core/dtype.h"
#include "kernels/core/status.h"
#include "server/core/host_memory.h"

namespace qlinear {
namespace {

constexpr DType kAllDTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

ProblemShape shape_for(const LayerConfig& c, int64_t m, DType x, DType y) {
  return ProblemShape{m, c.n, c.k, x, y};
}

// The M at which a bucket's choice is made at load (and its candidates measured): its upper
// bound, and for the open prefill bucket 2048 rows, a typical prefill chunk.
int64_t representative_m(const MBucket& b) { return b.hi == INT64_MAX ? 2048 : b.hi; }

// The M values at which a bucket is probed: its ends (the open bucket: lo and 4*lo).
std::vector<int64_t> probe_ms(const MBucket& b) {
  return {b.lo, b.hi == INT64_MAX ? b.lo * 4 : b.hi};
}

// Where a layer's load shares the CPU kernels it kept after its measurements (Layer::create).
std::string kept_cpu_key(const LayerConfig& c) {
  return tuning_key("CPU kernels kept after autotune", "cpu", c);
}

// Whether `k` can implement the layer for some M bucket and dtype pair: only then may a request
// use it, forced or not.
bool implements_somewhere(const Kernel& k, const LayerConfig& c) {
  for (const MBucket& b : m_buckets()) {
    for (int64_t m : probe_ms(b)) {
      for (DType x : kAllDTypes) {
        for (DType y : kAllDTypes) {
          if (k.can_implement(c, shape_for(c, m, x, y)).ok()) return true;
        }
      }
    }
  }
  return false;
}

// Whether the layer may choose `order[i]` without forcing, so that it is worth preparing
// (packing weights) at load. `order` is the usable kernels that can implement the layer
// somewhere, in priority order. It may when, for some bucket it prefers, dtype pair and M at the
// bucket's ends, it can implement the shape and no kernel ahead of it that prefers the bucket
// can. With autotune, also when it is measurable and eligible for a bucket's measurement, with no
// kernel of another family ahead of it that can run the bucket's measured shape (a measurement
// can rank it ahead of the kernels of its own family that precede it, never ahead of another
// family's); an unmeasurable kernel never moves ahead of one that precedes it
// (Layer::autotune_bucket), so the priority test holds for it. Shapes between the probed ones are
// covered by preparing on demand (Layer::choose). After the measurements, a kernel prepared here
// that no bucket ranks first for any probed shape is released again (Layer::create).
bool may_choose(const std::vector<const Kernel*>& order, size_t i, const LayerConfig& c,
                bool autotune) {
  const Kernel& k = *order[i];
  for (const MBucket& b : m_buckets()) {
    if (!k.preferred_m().contains(b.lo, b.hi)) continue;
    const ProblemShape measured = shape_for(c, representative_m(b), DType::kBF16, DType::kBF16);
    if (autotune && k.measurable() && k.can_implement(c, measured).ok()) {
      bool covered = false;  // by a kernel a measurement cannot rank it above
      for (size_t j = 0; j < i && !covered; ++j) {
        covered = kernel_family(*order[j]) != kernel_family(k) &&
                  order[j]->preferred_m().contains(b.lo, b.hi) &&
                  order[j]->can_implement(c, measured).ok();
      }
      if (!covered) return true;
    }
    for (int64_t m : probe_ms(b)) {
      for (DType x : kAllDTypes) {
        for (DType y : kAllDTypes) {
          const ProblemShape s = shape_for(c, m, x, y);
          if (!k.can_implement(c, s).ok()) continue;
          bool covered = false;
          for (size_t j = 0; j < i && !covered; ++j) {
            covered =
                order[j]->preferred_m().contains(b.lo, b.hi) && order[j]->can_implement(c, s).ok();
          }
          if (!covered) return true;
        }
      }
    }
  }
  return false;
}

std::string us_str(double us) { return absl::StrFormat("%.1f us", us); }

std::string margin_str(double margin) { return absl::StrFormat("%g%%", 100.0 * margin); }

const KernelMeasurement* find_measurement(const BucketInfo& b, absl::string_view kernel) {
  for (const KernelMeasurement& km : b.measured) {
    if (km.kernel == kernel) return &km;
  }
  return nullptr;
}

// Why `chosen` won a bucket that autotune ranked, e.g. "fastest measured at load, 14.7 us at
// M=16; cuda.stream_s8 19.1 us; cuda.cublaslt 16.5 us". Empty when `chosen` was not measured (it
// ranks by priority ahead of the measured kernels).
std::string selected_note(const BucketInfo& b, absl::string_view chosen) {
  const KernelMeasurement* mine = find_measurement(b, chosen);
  if (mine == nullptr) return "";
  if (!mine->error.empty()) {
    return absl::StrCat("not ranked: its measurement at load failed (", mine->error, ")");
  }
  bool fastest = true;
  std::string others;
  for (const KernelMeasurement& km : b.measured) {
    if (km.kernel == chosen) continue;
    if (km.error.empty()) {
      fastest = fastest && km.us >= mine->us;
      absl::StrAppend(&others, "; ", km.kernel, " ", us_str(km.us));
    } else {
      absl::StrAppend(&others, "; ", km.kernel, " not measured");
    }
  }
  // When a faster kernel cannot run this request's shape, the next in the ranking runs; where
  // another measured faster by less than the margin, the priority order kept this one first.
  // (Times an earlier layer of the shape measured: see autotune_bucket.)
  const std::string how =
      b.kept_by_margin == chosen
          ? absl::StrCat("first in the priority order and within ", margin_str(b.margin),
                         " of the fastest measured at load",
                         b.measured_shared ? kTunedByEarlierLayer : "")
      : !b.measured_shared
          ? absl::StrCat("fastest measured at load", fastest ? "" : " that can run this shape")
          : absl::StrCat("fastest", fastest ? "" : " that can run this shape", " measured at load",
                         kTunedByEarlierLayer);
  return absl::StrCat(how, ", ", us_str(mine->us), " at M=", b.measured_m, others);
}

}  // namespace

Layer::Layer(Options options, std::shared_ptr<const LayerWeights> weights, const Registry& registry,
             const HostInfo& host)
    : options_(std::move(options)),
      weights_(std::move(weights)),
      registry_(registry),
      host_(host) {}

absl::Status Layer::check_forced_kernel(const Registry& registry, const HostInfo& host,
                                        const LayerConfig& c, const std::string& forced) {
  if (forced.empty()) return absl::OkStatus();
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
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Layer>> Layer::create(
    Options options, std::shared_ptr<const LayerWeights> weights, const Registry& registry,
    const HostInfo& host) {
  std::shared_ptr<Layer> layer(new Layer(std::move(options), std::move(weights), registry, host));
  const LayerConfig& c = layer->config();
  const std::string& forced = layer->options_.forced_kernel;

  RETURN_IF_ERROR(check_forced_kernel(registry, host, c, forced));

  // A slot for every kernel a request may use; prepared now only those the layer may choose
  // without forcing, and the forced kernel.
  std::vector<const Kernel*> order;
  for (const Kernel* k : registry.kernels()) {
    if (!registry.usable(*k, host).ok() || !implements_somewhere(*k, c)) continue;
    order.push_back(k);
    layer->slots_.push_back(std::make_unique<Slot>(k));
  }
  const bool tune = layer->options_.autotune && forced.empty();
  // The CPU kernels an earlier layer of this shape kept after its measurements (release_unchosen):
  // one it released is not prepared here just to be measured, and its times come from that layer.
  std::optional<std::vector<std::string>> kept;
  if (tune && layer->options_.tuning != nullptr) {
    kept = layer->options_.tuning->find<std::vector<std::string>>(kept_cpu_key(c));
  }
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i]->name() != forced && (!forced.empty() || !may_choose(order, i, c, tune))) continue;
    // (Also one the priority order alone would choose: the earlier layer's ranking, which this
    // one takes, put another first wherever it could run.)
    if (kept.has_value() && kernel_family(*order[i]) == "cpu" && order[i]->measurable() &&
        std::find(kept->begin(), kept->end(), order[i]->name()) == kept->end()) {
      layer->slots_[i]->released_by_earlier_layer = true;
      continue;
    }
    RETURN_IF_ERROR(layer->prepared(*layer->slots_[i], /*at_load=*/true).status());
  }

  const std::vector<MBucket>& buckets = m_buckets();
  LoadTimes measured;  // what this load measured, by candidates and M (autotune_bucket)
  for (size_t bi = 0; bi < buckets.size(); ++bi) {
    const MBucket& b = buckets[bi];
    std::vector<Slot*> cands;
    for (const std::unique_ptr<Slot>& s : layer->slots_) {
      if (s->kernel->preferred_m().contains(b.lo, b.hi)) cands.push_back(s.get());
    }
    layer->bucket_candidates_.push_back(std::move(cands));
    BucketInfo fresh;
    fresh.bucket = b;
    layer->buckets_.push_back(std::move(fresh));
    BucketInfo& info = layer->buckets_.back();

    const ProblemShape shape = shape_for(c, representative_m(b), DType::kBF16, DType::kBF16);
    if (layer->options_.autotune && forced.empty()) layer->autotune_bucket(bi, shape, &measured);
    const Kernel* chosen = nullptr;
    absl::StatusOr<std::vector<CandidateVerdict>> explanation;
    if (forced.empty()) {
      explanation = layer->explain_ranked(bi, shape, &chosen);
    } else {
      auto sel = registry.select(host, c, shape, forced, b.lo, b.hi);
      if (sel.ok()) {
        chosen = sel->kernel;
        explanation = std::move(sel->explanation);
      } else {
        explanation = sel.status();
      }
    }
    if (explanation.ok()) {
      // The recorded kernel is a prepared one: prepare it now if the probes missed its shape.
      if (Slot* s = layer->find_slot(chosen); s != nullptr) {
        RETURN_IF_ERROR(layer->prepared(*s, /*at_load=*/true).status());
      }
      info.kernel = std::string(chosen->name());
      info.explanation = *std::move(explanation);
    } else {
      info.explanation.push_back({"", false, std::string(explanation.status().message())});
    }
  }

  if (forced.empty()) {
    layer->release_unchosen();
    if (tune && layer->options_.tuning != nullptr && layer->cpu_measurements_ok_) {
      std::vector<std::string> cpu_kept;
      for (const std::unique_ptr<Slot>& s : layer->slots_) {
        if (kernel_family(*s->kernel) == "cpu" && s->kernel->measurable() &&
            s->ready.load(std::memory_order_acquire) != nullptr) {
          cpu_kept.emplace_back(s->kernel->name());
        }
      }
      layer->options_.tuning->insert(kept_cpu_key(c), std::move(cpu_kept));
    }
  }

  const LayerWeights& w = *layer->weights_;
  layer->total_bytes_.fetch_add(
      static_cast<int64_t>(w.w.size() + 4 * w.sb.size() + 4 * w.bias.size() + 4 * w.azp_adj.size()),
      std::memory_order_relaxed);
  layer->loaded_unix_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  return std::shared_ptr<const Layer>(std::move(layer));
}

void Layer::autotune_bucket(size_t bi, const ProblemShape& shape, LoadTimes* load_times) {
  std::vector<Slot*>& cands = bucket_candidates_[bi];
  struct Measured {
    Slot* p;
    absl::StatusOr<double> us;
  };
  // Not prepared at load: unmeasurable (may_choose), or not eligible here; and a kernel that says
  // it is unmeasurable is never measured. Only the family of the first eligible candidate is
  // measured (kernel_family: times on different devices, each of which may be busy with other
  // layers' calls, are not compared): the others keep their places behind it.
  // A CPU kernel an earlier layer of the shape released (Slot::released_by_earlier_layer) is
  // eligible unprepared (null): its times come from that layer, or it is prepared to be measured.
  std::vector<std::pair<size_t, const PreparedKernel*>> eligible;  // position, prepared kernel
  ProblemShape at = shape;  // the shape measured: at most every eligible kernel's max_measured_m
  for (size_t i = 0; i < cands.size(); ++i) {
    const PreparedKernel* p = cands[i]->ready.load(std::memory_order_acquire);
    if (p == nullptr && !cands[i]->released_by_earlier_layer) continue;
    if (!cands[i]->kernel->measurable()) continue;
    if (!cands[i]->kernel->can_implement(config(), shape).ok()) continue;
    if (!eligible.empty() &&
        kernel_family(*cands[i]->kernel) != kernel_family(*cands[eligible.front().first]->kernel)) {
      continue;
    }
    eligible.emplace_back(i, p);
    if (p != nullptr) at.m = std::max<int64_t>(1, std::min(at.m, p->max_measured_m()));
  }
  // Where every eligible kernel was released by an earlier layer, the first that can be is
  // prepared, so that the bucket is measured (or its times found) at its max_measured_m.
  const auto prepared_one = [&] {
    return std::find_if(eligible.begin(), eligible.end(),
                        [](const auto& e) { return e.second != nullptr; });
  };
  if (!eligible.empty() && prepared_one() == eligible.end()) {
    for (auto& e : eligible) {
      absl::StatusOr<const PreparedKernel*> now = prepared(*cands[e.first], /*at_load=*/true);
      if (!now.ok()) continue;  // then it is not ranked, as when a load cannot prepare it
      e.second = *now;
      at.m = std::max<int64_t>(1, std::min(at.m, (*now)->max_measured_m()));
      break;
    }
    if (prepared_one() == eligible.end()) return;  // none could be prepared: nothing to rank
  }
  if (at.m != shape.m) {
    eligible.erase(
        std::remove_if(eligible.begin(), eligible.end(),
                       [&](const auto& e) {
                         return !cands[e.first]->kernel->can_implement(config(), at).ok();
                       }),
        eligible.end());
  }
  if (eligible.size() < 2) return;  // nothing to rank
  // The times an earlier layer of this shape measured for the same candidates, each running the
  // same variant of itself (the tiles or ring it timed or took from options_.tuning), where one
  // did: a bucket takes them all or measures them all, and stores them only when every
  // measurement succeeded. And the times this load measured for an earlier bucket at the same M
  // (buckets timed at a kernel's max_measured_m), taken as measured here.
  using SharedTimes = std::vector<std::pair<std::string, double>>;  // kernel, us
  std::string key;
  std::optional<SharedTimes> shared;
  const LoadTimes::value_type::second_type* here = nullptr;
  {
    std::string what = absl::StrCat("autotune at M=", at.m, " ", dtype_name(at.x_dtype), " to ",
                                    dtype_name(at.y_dtype), " of");
    // (An unprepared kernel as a CPU kernel's, which has no variant: its own text if it had one.)
    for (const auto& [i, p] : eligible) {
      absl::StrAppend(
          &what, " ", cands[i]->kernel->name(), " [",
          p == nullptr ? "" : absl::StrReplaceAll(p->variant(at.m), {{kTunedByEarlierLayer, ""}}),
          "]");
    }
    key = tuning_key(what, prepared_one()->second->device(), config());
    if (const auto it = load_times->find(key); it != load_times->end()) here = &it->second;
    if (here == nullptr && options_.tuning != nullptr) {
      shared = options_.tuning->find<SharedTimes>(key);
    }
  }
  std::vector<Measured> measured;  // priority order
  size_t first = cands.size();     // position of the first measured candidate
  for (const auto& [i, p] : eligible) {
    const absl::string_view name = cands[i]->kernel->name();
    absl::StatusOr<double> us;
    if (here != nullptr) {
      const auto it =
          std::find_if(here->begin(), here->end(), [&](const auto& t) { return t.first == name; });
      if (it == here->end()) continue;  // UNIMPLEMENTED there
      us = it->second;
    } else if (shared.has_value()) {
      const auto it = std::find_if(shared->begin(), shared->end(),
                                   [&](const auto& t) { return t.first == name; });
      if (it == shared->end()) continue;  // it did not time itself there either (UNIMPLEMENTED)
      us = it->second;
    } else {
      const PreparedKernel* ready = p;
      if (ready == nullptr) {  // released by an earlier layer, whose times are not stored
        absl::StatusOr<const PreparedKernel*> now = prepared(*cands[i], /*at_load=*/true);
        if (!now.ok()) continue;  // then it is not ranked, as when a load cannot prepare it
        ready = *now;
      }
      us = ready->measure_us(at);
      if (absl::IsUnimplemented(us.status())) continue;  // the priority order places it
    }
    first = std::min(first, i);
    measured.push_back({cands[i], std::move(us)});
  }
  if (here == nullptr && !shared.has_value()) {
    auto& mine = (*load_times)[key];
    for (const Measured& m : measured) mine.emplace_back(std::string(m.p->kernel->name()), m.us);
  }
  const bool all_ok =
      std::all_of(measured.begin(), measured.end(), [](const Measured& m) { return m.us.ok(); });
  if (!all_ok && kernel_family(*cands[eligible[0].first]->kernel) == "cpu") {
    cpu_measurements_ok_ = false;
  }
  if (here == nullptr && !shared.has_value() && options_.tuning != nullptr && !measured.empty() &&
      all_ok) {
    SharedTimes times;
    for (const Measured& m : measured) times.emplace_back(std::string(m.p->kernel->name()), *m.us);
    options_.tuning->insert(key, std::move(times));
  }
  if (measured.size() < 2) return;  // nothing to rank

  BucketInfo& info = buckets_[bi];
  info.measured_m = at.m;
  info.measured_shared = shared.has_value();
  bool any_ok = false;
  for (const Measured& m : measured) {
    KernelMeasurement km{std::string(m.p->kernel->name()), 0, ""};
    if (m.us.ok()) {
      km.us = *m.us;
      any_ok = true;
    } else {
      km.error = std::string(m.us.status().message());
    }
    info.measured.push_back(std::move(km));
  }
  if (!any_ok) return;  // the priority order stands; the explanation says why

  // The measured candidates move as one block, fastest first (ties keep the priority order), to
  // where the first of them stood; a failed measurement ranks after the block. Unmeasurable
  // candidates keep their places around it, so a CPU kernel is never ranked above a GPU one by a
  // measurement. The first of them in the priority order that was measured keeps the lead where
  // the fastest is not faster than it by more than its measure_margin.
  const auto lead =
      std::find_if(measured.begin(), measured.end(), [](const Measured& m) { return m.us.ok(); });
  const Slot* lead_slot = lead->p;
  const double lead_us = *lead->us;
  // (Its margin; where an earlier layer released it, so that it is not prepared here, another
  // measured kernel's of its family.)
  double margin = 0;
  for (const Measured& m : measured) {
    if (const PreparedKernel* p = m.p->ready.load(std::memory_order_acquire); p != nullptr) {
      margin = p->measure_margin();
      if (m.p == lead->p) break;
    }
  }
  std::stable_sort(measured.begin(), measured.end(), [](const Measured& a, const Measured& b) {
    if (a.us.ok() != b.us.ok()) return a.us.ok();
    return a.us.ok() && *a.us < *b.us;
  });
  if (measured.front().p != lead_slot && lead_us <= *measured.front().us * (1.0 + margin)) {
    const auto at = std::find_if(measured.begin(), measured.end(),
                                 [&](const Measured& m) { return m.p == lead_slot; });
    std::rotate(measured.begin(), at, at + 1);
    info.kept_by_margin = std::string(lead_slot->kernel->name());
    info.margin = margin;
  }
  std::vector<Slot*> ranked(cands.begin(), cands.begin() + first);
  for (const Measured& m : measured) ranked.push_back(m.p);
  for (size_t i = first; i < cands.size(); ++i) {
    const bool was_measured = std::any_of(measured.begin(), measured.end(),
                                          [&](const Measured& m) { return m.p == cands[i]; });
    if (!was_measured) ranked.push_back(cands[i]);
  }
  cands = std::move(ranked);
}

void Layer::release_unchosen() {
  const std::vector<MBucket>& buckets = m_buckets();
  for (const std::unique_ptr<Slot>& slot : slots_) {
    if (slot->ready.load(std::memory_order_acquire) == nullptr) continue;
    // Only CPU kernels, each of which holds a packed copy of its own. The CUDA kernels of a layer
    // share one device copy of its weights (gpu::shared_device_layer), whose bytes the first of
    // them counts: they stay as they were prepared.
    if (slot->state->device() != "cpu") continue;
    bool needed = false;
    for (size_t bi = 0; bi < buckets.size() && !needed; ++bi) {
      std::vector<int64_t> ms = probe_ms(buckets[bi]);
      ms.push_back(representative_m(buckets[bi]));
      for (int64_t m : ms) {
        for (DType x : kAllDTypes) {
          for (DType y : kAllDTypes) {
            const ProblemShape s = shape_for(config(), m, x, y);
            for (Slot* cand : bucket_candidates_[bi]) {
              if (!cand->kernel->can_implement(config(), s).ok()) continue;
              needed = needed || cand == slot.get();
              break;
            }
          }
        }
      }
    }
    if (needed) continue;
    // Not yet published: no request can hold it.
    total_bytes_.fetch_sub(slot->state->extra_bytes(), std::memory_order_relaxed);
    slot->ready.store(nullptr, std::memory_order_release);
    slot->state.reset();
  }
}

absl::StatusOr<std::vector<CandidateVerdict>> Layer::explain_ranked(size_t bi,
                                                                    const ProblemShape& shape,
                                                                    const Kernel** chosen) const {
  const BucketInfo& info = buckets_[bi];
  // The registry gives every kernel's verdict in priority order; the reasons of kernels outside
  // the bucket's candidates (disabled, unsupported, M preference) do not depend on the ranking.
  ASSIGN_OR_RETURN(Selection sel,
                   registry_.select(host_, config(), shape, "", info.bucket.lo, info.bucket.hi));
  const std::vector<Slot*>& cands = bucket_candidates_[bi];
  std::vector<std::string> declined;  // can_implement reasons of the candidates ranked first
  size_t ci = 0;
  for (; ci < cands.size(); ++ci) {
    absl::Status s = cands[ci]->kernel->can_implement(config(), shape);
    if (s.ok()) break;
    declined.emplace_back(s.message());
  }
  if (info.measured.empty() || ci == cands.size()) {
    // Not ranked by measurement, the ranking is the priority order; or no prepared candidate
    // fits, and the registry's pick (which cannot run) produces the error.
    *chosen = sel.kernel;
    return std::move(sel.explanation);
  }
  *chosen = cands[ci]->kernel;
  const absl::string_view winner = (*chosen)->name();
  const KernelMeasurement* winner_m = find_measurement(info, winner);
  const bool winner_timed = winner_m != nullptr && winner_m->error.empty();
  bool any_ok = false;
  for (const KernelMeasurement& km : info.measured) any_ok = any_ok || km.error.empty();
  for (CandidateVerdict& v : sel.explanation) {
    size_t pos = cands.size();
    for (size_t i = 0; i < cands.size(); ++i) {
      if (cands[i]->kernel->name() == v.kernel) pos = i;
    }
    if (pos == cands.size()) {
      if (v.selected) {  // the registry's pick has no slot; a ranked candidate runs instead
        v = {v.kernel, false, "could not implement the layer at load"};
      }
      continue;
    }
    if (pos < ci) {
      v = {v.kernel, false, declined[pos]};
    } else if (pos == ci) {
      v = {v.kernel, true, selected_note(info, winner)};
    } else if (const KernelMeasurement* km = find_measurement(info, v.kernel); km == nullptr) {
      v = {v.kernel, false, "a higher-priority kernel was selected"};
    } else if (!km->error.empty()) {
      v = {v.kernel, false,
           absl::StrCat("its measurement at load failed (", km->error, "); ",
                        any_ok ? "ranked after the measured kernels"
                               : "a higher-priority kernel was selected")};
    } else if (winner_timed && km->us < winner_m->us && info.kept_by_margin == winner) {
      v = {v.kernel, false,
           absl::StrCat("measured faster at load by less than ", margin_str(info.margin), ": ",
                        us_str(km->us), " at M=", info.measured_m, " (", winner, " ",
                        us_str(winner_m->us), ", first in the priority order)")};
    } else if (winner_timed) {
      v = {v.kernel, false,
           absl::StrCat("measured slower at load: ", us_str(km->us), " at M=", info.measured_m,
                        " (", winner, " ", us_str(winner_m->us), ")")};
    } else {
      v = {v.kernel, false, "a higher-priority kernel was selected"};
    }
  }
  return std::move(sel.explanation);
}

Layer::Slot* Layer::find_slot(const Kernel* k) const {
  for (const std::unique_ptr<Slot>& s : slots_) {
    if (s->kernel == k) return s.get();
  }
  return nullptr;
}

absl::StatusOr<const PreparedKernel*> Layer::prepared(Slot& slot, bool at_load,
                                                      bool* prepared_now) const {
  if (const PreparedKernel* p = slot.ready.load(std::memory_order_acquire)) return p;
  absl::MutexLock lock(&slot.mu);
  // Another request may have prepared it while this one waited.
  if (const PreparedKernel* p = slot.ready.load(std::memory_order_acquire)) return p;
  // Held until the kernel's copy has taken its pages (see HostMemoryLedger).
  HostMemoryLedger::Hold held;
  if (options_.host_memory != nullptr) {
    if (const int64_t need = slot.kernel->host_bytes_to_prepare(config()); need > 0) {
      absl::StatusOr<HostMemoryLedger::Hold> h = options_.host_memory->reserve(need);
      if (!h.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            slot.kernel->name(), " needs about ", need, " bytes of host memory for layer '", name(),
            "' (its copy of the weights); ", h.status().message()));
      }
      held = *std::move(h);
    }
  }
  absl::StatusOr<std::unique_ptr<PreparedKernel>> state;
  try {
    state = slot.kernel->prepare_with_tuning(*weights_,
                                             PrepareContext{options_.tuning.get(), !at_load});
  } catch (const std::bad_alloc&) {
    if (at_load) throw;  // the load fails whole, saying nothing was loaded (Engine::build_layer)
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of host memory preparing ", slot.kernel->name(), " for layer '", name(), "'"));
  }
  if (!state.ok()) return state.status();  // not cached: the next request tries again
  slot.state = *std::move(state);
  total_bytes_.fetch_add(slot.state->extra_bytes(), std::memory_order_relaxed);
  slot.ready.store(slot.state.get(), std::memory_order_release);
  if (prepared_now != nullptr) *prepared_now = true;
  return slot.state.get();
}

absl::StatusOr<KernelChoice> Layer::choose(const ProblemShape& shape, absl::string_view forced,
                                           bool explain) const {
  if (forced.empty()) forced = options_.forced_kernel;
  const size_t bi = m_bucket_index(shape.m);
  KernelChoice choice;
  Slot* slot = nullptr;
  if (!forced.empty()) {
    const MBucket& b = m_buckets()[bi];
    ASSIGN_OR_RETURN(Selection sel, registry_.select(host_, config(), shape, forced, b.lo, b.hi));
    choice.kernel = sel.kernel;
    choice.explanation = std::move(sel.explanation);
  } else if (explain) {
    // The same walk as the hot path below, with every candidate's verdict.
    ASSIGN_OR_RETURN(choice.explanation, explain_ranked(bi, shape, &choice.kernel));
  } else {
    // Hot path: the bucket's short list, checked with can_implement only.
    for (Slot* s : bucket_candidates_[bi]) {
      if (s->kernel->can_implement(config(), shape).ok()) {
        choice.kernel = s->kernel;
        slot = s;
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
  if (slot == nullptr) slot = find_slot(choice.kernel);
  if (slot == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernel ", choice.kernel->name(), " was not prepared for layer ", name(),
                     " (it could not implement the layer at load)"));
  }
  ASSIGN_OR_RETURN(choice.prepared, prepared(*slot, /*at_load=*/false, &choice.prepared_now));
  if (!choice.explanation.empty()) {
    // The kernel's own choice for this M (a tile, a launch), after why it was selected.
    if (const std::string how = choice.prepared->variant(shape.m); !how.empty()) {
      for (CandidateVerdict& v : choice.explanation) {
        if (v.selected)
          v.reason = v.reason.empty() ? absl::StrCat("runs ", how)
                                      : absl::StrCat(v.reason, "; runs ", how);
      }
    }
  }
  return choice;
}

std::string Layer::device() const {
  for (const BucketInfo& b : buckets_) {
    if (b.kernel.empty()) continue;
    for (const std::unique_ptr<Slot>& s : slots_) {
      const PreparedKernel* p = s->ready.load(std::memory_order_acquire);
      if (p != nullptr && s->kernel->name() == b.kernel) return p->device();
    }
  }
  return "cpu";
}

}  // namespace qlinear
