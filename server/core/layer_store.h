// The set of loaded layers by name. Thread-safe. Readers get a shared_ptr that keeps the layer
// alive for as long as they use it, so unload and replace never free memory under a request.
#pragma once

#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/layer.h"

namespace qlinear {

class LayerStore {
 public:
  // NOT_FOUND if absent.
  absl::StatusOr<std::shared_ptr<const Layer>> get(absl::string_view name) const;
  bool contains(absl::string_view name) const;
  // Inserts `layer`; if its name exists, replaces it when `replace`, else ALREADY_EXISTS.
  // Returns whether a layer was replaced. The swap is atomic.
  absl::StatusOr<bool> put(std::shared_ptr<const Layer> layer, bool replace);
  // NOT_FOUND if absent.
  absl::Status remove(absl::string_view name);
  // All layers, sorted by name.
  std::vector<std::shared_ptr<const Layer>> list() const;
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Layer>> layers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qlinear
