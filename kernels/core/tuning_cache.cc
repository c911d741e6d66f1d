#include "kernels/core/tuning_cache.h"

#include "absl/strings/str_cat.h"

namespace qlinear {

size_t TuningCache::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

std::string tuning_key(absl::string_view what, absl::string_view device, const LayerConfig& c) {
  return absl::StrCat(what, " on ", device, ": N=", c.n, " K=", c.k, " ", scheme_name(c.scheme),
                      c.has_bias ? " bias" : " no bias");
}

}  // namespace qlinear
