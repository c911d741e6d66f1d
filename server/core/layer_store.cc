#include "server/core/layer_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace qlinear {

absl::StatusOr<std::shared_ptr<const ServedLayer>> LayerStore::get(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = layers_.find(name);
  if (it == layers_.end()) return absl::NotFoundError(absl::StrCat("layer '", name, "' not found"));
  return it->second;
}

bool LayerStore::contains(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  return layers_.contains(name);
}

absl::StatusOr<bool> LayerStore::put(std::shared_ptr<const ServedLayer> layer, bool replace,
                                     std::shared_ptr<const ServedLayer>* previous) {
  std::shared_ptr<const ServedLayer> old;  // released outside the lock
  absl::MutexLock lock(&mu_);
  auto it = layers_.find(layer->name());
  if (it == layers_.end()) {
    std::string name = layer->name();
    layers_.emplace(std::move(name), std::move(layer));
    return false;
  }
  if (!replace) {
    return absl::AlreadyExistsError(
        absl::StrCat("layer '", layer->name(), "' already exists (set replace to swap it)"));
  }
  old = std::move(it->second);
  it->second = std::move(layer);
  if (previous != nullptr) *previous = old;
  return true;
}

absl::Status LayerStore::remove(absl::string_view name,
                                std::shared_ptr<const ServedLayer>* removed) {
  std::shared_ptr<const ServedLayer> old;
  absl::MutexLock lock(&mu_);
  auto it = layers_.find(name);
  if (it == layers_.end()) return absl::NotFoundError(absl::StrCat("layer '", name, "' not found"));
  old = std::move(it->second);
  layers_.erase(it);
  if (removed != nullptr) *removed = old;
  return absl::OkStatus();
}

std::vector<std::shared_ptr<const ServedLayer>> LayerStore::list() const {
  std::vector<std::shared_ptr<const ServedLayer>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, layer] : layers_) out.push_back(layer);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a->name() < b->name(); });
  return out;
}

void LayerStore::visit(absl::FunctionRef<void(const ServedLayer&)> fn) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, layer] : layers_) fn(*layer);
}

size_t LayerStore::size() const {
  absl::MutexLock lock(&mu_);
  return layers_.size();
}

}  // namespace qlinear
