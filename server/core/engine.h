// The service core: layer uploads and inference over the layer store, free of transport types.
// The gRPC service converts messages to these structs and statuses back; tests drive it directly.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/layer_name.h"
#include "common/sha256.h"
#include "kernels/core/tuning_cache.h"
#include "kernels/core/weights.h"
#include "kernels/registry.h"
#include "server/core/batcher.h"
#include "server/core/deferred_release.h"
#include "server/core/host_memory.h"
#include "server/core/layer.h"
#include "server/core/layer_store.h"
#include "server/core/metrics.h"

namespace qlinear {

struct LoadRequest {
  std::string name;
  LayerSpec spec;
  std::string forced_kernel;
  bool replace = false;
  std::string weight_sha256;  // hex; required for uploads, optional for in-process loads
  // Per-layer batching overrides; -1 keeps the server default.
  int64_t max_batch_rows = -1;
  int64_t max_queue_delay_us = -1;
};

struct LoadResult {
  std::shared_ptr<const ServedLayer> served;
  const Layer& layer() const { return *served->layer; }
  bool replaced = false;
  int64_t load_time_us = 0;
};

struct InferInput {
  absl::string_view layer;
  DType x_dtype = DType::kBF16;
  int64_t m = 0;
  absl::string_view x;  // [M, K] raw bytes
  DType y_dtype = DType::kBF16;
  absl::string_view forced_kernel;
  bool explain = false;
  bool return_scales = false;
};

struct InferOutput {
  std::string kernel;
  std::string device;
  std::vector<CandidateVerdict> explanation;
  RunTimings timings;  // of the batch this request ran in
  int64_t n = 0;
  std::vector<float> sa;
  std::vector<int32_t> azp;
  int64_t queue_ns = 0;
  int64_t batch_requests = 1;
  int64_t batch_rows = 0;
};

// What a response may need besides y, sa and azp (its metadata: the kernel's and device's names,
// the selection explanation, timings, the request id); Engine::validate keeps that much of the
// message limit free.
inline constexpr int64_t kResponseMetadataBytes = int64_t{64} << 10;

struct EngineOptions {
  // Largest response message: a request whose y (with sa and azp when asked, and
  // kResponseMetadataBytes for the rest) would not fit is RESOURCE_EXHAUSTED (it could not be
  // sent).
  int64_t max_output_bytes = int64_t{64} << 20;
  BatchOptions batching;  // defaults for every layer
  // Rank each bucket's measurable kernels by their time measured at load (Layer::Options).
  bool autotune = true;
  // The first layer of a shape times its choices at load and every later layer of that shape
  // takes them (Layer::Options::tuning, TuningCache); off, every layer times its own.
  bool share_tuning = true;
  // The host memory left (negative: unknown), which uploads and kernels' copies of the weights
  // reserve against (HostMemoryLedger). Null: available_memory_bytes.
  std::function<int64_t()> available_memory;
};

class Engine;

// One streamed layer upload: header first, then chunks, then commit. Nothing is visible in the
// store until commit succeeds; dropping the object discards everything.
class LayerUpload {
 public:
  absl::Status append(absl::string_view chunk);
  int64_t received() const { return static_cast<int64_t>(filled_); }
  int64_t expected() const { return static_cast<int64_t>(weights_.size()); }
  // Verifies size and checksum, prepares kernels and publishes the layer atomically. Where
  // `cancelled` is given and says true just before the layer would be published (the client
  // cancelled, or its deadline passed, while the layer was built), nothing is published and the
  // status is CANCELLED.
  absl::StatusOr<LoadResult> commit(const std::function<bool()>& cancelled = nullptr);

 private:
  friend class Engine;
  LayerUpload(Engine* engine, LoadRequest request)
      : engine_(engine), request_(std::move(request)) {}
  Engine* engine_;
  LoadRequest request_;
  std::vector<int8_t> weights_;
  size_t filled_ = 0;
  Sha256 hash_;
  int64_t start_ns_ = 0;
};

class Engine {
 public:
  // `metrics` may be null.
  Engine(const Registry& registry, const HostInfo& host, EngineOptions options = {},
         Metrics* metrics = nullptr);

  // Validates the header (name, shape, scheme, scales, duplicates) before any weight arrives.
  absl::StatusOr<std::unique_ptr<LayerUpload>> begin_upload(LoadRequest request);
  // Loads a layer whose weights are already in memory (demo layer, tests). Checks the checksum
  // when one is given.
  absl::StatusOr<LoadResult> load(LoadRequest request, std::vector<int8_t> weights);
  absl::Status unload(absl::string_view name);

  // Runs one request through the layer's batching queue; y is resized and written as [M, N] in
  // y_dtype. Validation errors come back at once, without queueing.
  absl::Status infer(const InferInput& in, const CallContext& call, std::string* y,
                     InferOutput* out) const;
  // Checks a request against a layer: shapes, sizes and output limit.
  absl::Status validate(const Layer& layer, const InferInput& in) const;
  // Runs a validated request (or a batch of them concatenated) directly on the layer: selection,
  // quantization, GEMM and epilogue. sa/azp are always returned.
  absl::Status execute(const Layer& layer, const InferInput& in, std::string* y,
                       InferOutput* out) const;

  // The watched batch (BatchQueue::running_since: on a GPU) that has been executing longest,
  // if one is: its layer and how long it has run. The loaded layers' batches count, and so do the
  // last batches of layers replaced or unloaded since (`retired`). (A watchdog's input: a kernel
  // that never returns holds its layer's queue, and the GPU, for good.)
  struct RunningBatch {
    std::string layer;
    std::chrono::nanoseconds running{0};
    bool retired = false;  // the layer was replaced or unloaded since
  };
  std::optional<RunningBatch> longest_running_batch() const;
  // How many layers that list holds (the loaded ones, and the replaced or unloaded ones not yet
  // destroyed, give or take those destroyed since it was last pruned): for tests.
  size_t watched_layers() const;

  const LayerStore& store() const { return store_; }
  const Registry& registry() const { return registry_; }
  const HostInfo& host() const { return host_; }
  const EngineOptions& options() const { return options_; }
  Metrics* metrics() const { return metrics_; }

 private:
  // Updates the layer's bytes gauge after choose() prepared a kernel on demand.
  void note_prepared(const Layer& layer, const KernelChoice& choice) const;
  friend class LayerUpload;
  // execute's body; execute turns an allocation failure into RESOURCE_EXHAUSTED.
  absl::Status execute_call(const Layer& layer, const InferInput& in, std::string* y,
                            InferOutput* out) const;
  absl::StatusOr<LoadResult> publish(const LoadRequest& request, std::vector<int8_t> weights,
                                     int64_t start_ns,
                                     const std::function<bool()>& cancelled = nullptr);
  // publish's first step: the layer's weights and prepared kernels, not yet served.
  absl::StatusOr<std::shared_ptr<const Layer>> build_layer(const LoadRequest& request,
                                                           std::vector<int8_t> weights,
                                                           const std::function<bool()>& cancelled);

  const Registry& registry_;
  const HostInfo& host_;
  EngineOptions options_;
  Metrics* metrics_;
  // What the loads timed, per shape; null without options_.share_tuning.
  std::shared_ptr<TuningCache> tuning_;
  // Held while a layer is created (publish) where loads time (a GPU): what a load times would be
  // skewed by another load timing on the same GPU at once, and a layer of a shape whose first
  // layer is being loaded then finds that one's timings in tuning_ rather than timing beside it.
  absl::Mutex create_mu_;
  // Held while the store and the metrics' per-layer gauges change together (publish, unload).
  absl::Mutex publish_mu_;
  // Every layer published: its name, its queue's running stamp, and the layer itself unowned
  // (expired once the last batch of a replaced or unloaded layer is done and it is destroyed),
  // for longest_running_batch. Pruned as it is read and as layers are published.
  struct Watched {
    std::string name;
    std::shared_ptr<const std::atomic<int64_t>> running_since;
    std::weak_ptr<const ServedLayer> served;
    const ServedLayer* address;  // to tell the one the store holds (never dereferenced)
  };
  mutable absl::Mutex watched_mu_;
  mutable std::vector<Watched> watched_ ABSL_GUARDED_BY(watched_mu_);
  // Drops the destroyed layers' entries.
  void prune_watched() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(watched_mu_);
  // The host memory that uploads' weight buffers and kernels' copies of the weights being
  // allocated have reserved (begin_upload, Layer::Options::host_memory).
  const std::shared_ptr<HostMemoryLedger> host_memory_;
  LayerStore store_;
  // Last: destroyed first, releasing what it holds while the rest of the engine is still whole.
  // Every served layer is made by DeferredRelease::own on it, so that a request dropping a
  // replaced or unloaded layer's last reference never destroys it on the request's thread.
  const std::shared_ptr<DeferredRelease> released_ = std::make_shared<DeferredRelease>();
};

}  // namespace qlinear
