// What a layer's load times, kept for the next layer of the same shape.
//
// A layer times choices at load: its buckets' candidate kernels (autotune, SPEC section 6) and,
// inside some kernels, their own launch forms (cuda.cutlass_sm90's tiles, cuda.stream_s8's ring).
// The times depend on the layer's shape, scheme and device, and hardly on its weights' values
// (the first layer's weights are the ones timed); a model holds many layers of each shape
// (Llama-3 70B: 80 of each of four projections). With a TuningCache, the first layer of a shape
// times and stores its choices and every later layer of that shape on that device takes them as
// they are: it loads without timing them, and all layers of a shape run the same kernels (the
// same code in the SMs' instruction caches as one layer follows another, and one explanation for
// all of them). (cuda.gemv_s8, which the server does not register, times its plans per layer.)
//
// The server's engine owns one (--share-tuning, on by default) and fills it only while layers
// load (a kernel a request prepares on demand reads it but stores nothing: PrepareContext); a
// layer or kernel prepared without one times its own choices. It holds at most kMaxEntries values,
// the oldest given up first (a server whose clients load layers of ever new shapes stays bounded;
// a later layer of a shape given up times anew). Thread-safe.
#pragma once

#include <any>
#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/core/layer.h"

namespace qlinear {

class TuningCache {
 public:
  static constexpr size_t kMaxEntries = 4096;

  // The value stored under `key`, if one of type T is.
  template <typename T>
  std::optional<T> find(absl::string_view key) const {
    absl::MutexLock lock(&mu_);
    const auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    const T* v = std::any_cast<T>(&it->second);
    if (v == nullptr) return std::nullopt;
    return *v;
  }
  // Stores `value` under `key` unless something is stored there already (two layers of a shape
  // loaded at once both time, and the first to finish is kept); at kMaxEntries, the oldest value
  // is given up first.
  template <typename T>
  void insert(absl::string_view key, T value) {
    absl::MutexLock lock(&mu_);
    if (entries_.contains(key)) return;
    if (entries_.size() >= kMaxEntries) {
      entries_.erase(order_.front());
      order_.pop_front();
    }
    order_.emplace_back(key);
    entries_.try_emplace(key, std::any(std::move(value)));
  }
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::any> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // entries_' keys, oldest first
};

// The key of what `what` (e.g. "cuda.cutlass_sm90 tiles") timed for a layer of config `c` on
// `device` (e.g. "cuda:0"): the layer's N, K, scheme and bias, the parts of a config that choose
// a kernel's code. (A static scheme's input scale and zero point are values, not code.)
std::string tuning_key(absl::string_view what, absl::string_view device, const LayerConfig& c);

// What an explanation adds to a choice taken from a TuningCache, e.g. "(timed fastest at load,
// M=1, by an earlier layer of the same N, K, scheme and bias)".
inline constexpr absl::string_view kTunedByEarlierLayer =
    ", by an earlier layer of the same N, K, scheme and bias";

}  // namespace qlinear
