// The set of served layers by name. Thread-safe. Readers get a shared_ptr that keeps the layer
// (and its request queue) alive for as long as they use it, so unload and replace never free
// memory under a request: the last holder releases it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/core/batcher.h"
#include "server/core/layer.h"

namespace qlinear {

// A loaded layer and the queue that batches its requests. Destroying it closes the queue after
// the requests already queued have run.
struct ServedLayer {
  std::shared_ptr<const Layer> layer;
  std::unique_ptr<BatchQueue> queue;
  const std::string& name() const { return layer->name(); }
};

class LayerStore {
 public:
  // NOT_FOUND if absent.
  absl::StatusOr<std::shared_ptr<const ServedLayer>> get(absl::string_view name) const;
  bool contains(absl::string_view name) const;
  // Inserts `layer`; if its name exists, replaces it when `replace`, else ALREADY_EXISTS.
  // Returns whether a layer was replaced. The swap is atomic.
  absl::StatusOr<bool> put(std::shared_ptr<const ServedLayer> layer, bool replace,
                           std::shared_ptr<const ServedLayer>* previous = nullptr);
  // NOT_FOUND if absent. `removed` receives the layer taken out.
  absl::Status remove(absl::string_view name,
                      std::shared_ptr<const ServedLayer>* removed = nullptr);
  // All layers, sorted by name.
  std::vector<std::shared_ptr<const ServedLayer>> list() const;
  // Calls `fn` on every layer, in no order, under the store's lock (no reference is taken, so
  // that the caller never ends up releasing a layer): `fn` must be quick and not call the store.
  void visit(absl::FunctionRef<void(const ServedLayer&)> fn) const;
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const ServedLayer>> layers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qlinear
