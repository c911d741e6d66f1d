#include "server/core/engine.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <system_error>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/steady_clock.h"
#include "common/string_buffer.h"
#include "kernels/core/status.h"
#include "server/core/host_memory.h"

namespace qlinear {
namespace {

bool is_hex_sha256(absl::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

Engine::Engine(const Registry& registry, const HostInfo& host, EngineOptions options,
               Metrics* metrics)
    : registry_(registry),
      host_(host),
      options_(options),
      metrics_(metrics),
      tuning_(options.share_tuning ? std::make_shared<TuningCache>() : nullptr),
      host_memory_(options.available_memory
                       ? std::make_shared<HostMemoryLedger>(options.available_memory)
                       : std::make_shared<HostMemoryLedger>()) {}

absl::StatusOr<std::unique_ptr<LayerUpload>> Engine::begin_upload(LoadRequest request) {
  RETURN_IF_ERROR(validate_layer_name(request.name));
  RETURN_IF_ERROR(validate_layer_spec(request.spec));
  if (!is_hex_sha256(request.weight_sha256)) {
    return absl::InvalidArgumentError(
        "weight_sha256 must be the 64-character hex SHA-256 of the N*K weight bytes");
  }
  request.weight_sha256 = absl::AsciiStrToLower(request.weight_sha256);
  if (!request.replace && store_.contains(request.name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("layer '", request.name, "' already exists (set replace to swap it)"));
  }
  RETURN_IF_ERROR(Layer::check_forced_kernel(registry_, host_, layer_config_of(request.spec),
                                             request.forced_kernel));
  const int64_t bytes = request.spec.n * request.spec.k;
  // std::vector zero-fills what it allocates, so an upload larger than the memory left would be
  // killed by the OOM killer rather than fail with bad_alloc: it is refused up front instead, its
  // bytes held while the buffer takes its pages (see HostMemoryLedger).
  absl::StatusOr<HostMemoryLedger::Hold> held = host_memory_->reserve(bytes);
  if (!held.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("layer needs ", bytes, " bytes of host memory; ", held.status().message()));
  }
  try {
    std::unique_ptr<LayerUpload> up(new LayerUpload(this, std::move(request)));
    up->start_ns_ = steady_now_ns();
    up->weights_.resize(static_cast<size_t>(bytes));  // zero-filled: the pages are taken now
    return up;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory for the weights"));
  }
}

absl::Status LayerUpload::append(absl::string_view chunk) {
  if (chunk.size() > weights_.size() - filled_) {
    return absl::InvalidArgumentError(absl::StrCat("weight bytes exceed n*k=", weights_.size(),
                                                   " (received ", filled_ + chunk.size(),
                                                   " so far)"));
  }
  std::memcpy(weights_.data() + filled_, chunk.data(), chunk.size());
  hash_.update(chunk.data(), chunk.size());
  filled_ += chunk.size();
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> LayerUpload::commit(const std::function<bool()>& cancelled) {
  if (filled_ != weights_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload ended after ", filled_, " weight bytes; n*k=", weights_.size()));
  }
  const std::string digest = hash_.hex_digest();
  if (digest != request_.weight_sha256) {
    return absl::InvalidArgumentError(absl::StrCat("weight checksum mismatch: header says sha256 ",
                                                   request_.weight_sha256,
                                                   ", received bytes hash to ", digest));
  }
  return engine_->publish(request_, std::move(weights_), start_ns_, cancelled);
}

absl::StatusOr<LoadResult> Engine::load(LoadRequest request, std::vector<int8_t> weights) {
  const int64_t start = steady_now_ns();
  RETURN_IF_ERROR(validate_layer_name(request.name));
  RETURN_IF_ERROR(validate_layer_spec(request.spec));
  if (!request.weight_sha256.empty()) {
    const std::string digest = sha256_hex(weights.data(), weights.size());
    if (digest != absl::AsciiStrToLower(request.weight_sha256)) {
      return absl::InvalidArgumentError(absl::StrCat("weight checksum mismatch: header says ",
                                                     request.weight_sha256, ", bytes hash to ",
                                                     digest));
    }
  } else {
    request.weight_sha256 = sha256_hex(weights.data(), weights.size());
  }
  return publish(request, std::move(weights), start);
}

absl::StatusOr<std::shared_ptr<const Layer>> Engine::build_layer(
    const LoadRequest& request, std::vector<int8_t> weights,
    const std::function<bool()>& cancelled) {
  ASSIGN_OR_RETURN(std::shared_ptr<const LayerWeights> lw,
                   build_layer_weights(request.spec, std::move(weights)));
  Layer::Options opts;
  opts.name = request.name;
  opts.forced_kernel = request.forced_kernel;
  opts.autotune = options_.autotune;
  opts.tuning = tuning_;
  opts.weight_sha256 = request.weight_sha256;
  opts.logical_widths = request.spec.logical_widths;
  opts.host_memory = host_memory_;
  // One layer created at a time where a load may time anything: where a usable GPU kernel
  // measures itself, or two usable CPU kernels do (a host that runs more than one of them).
  // Elsewhere loads only pack, and go on side by side.
  // (A GPU kernel alone may time its own choices at prepare: cuda.cutlass_sm90's tiles.)
  bool times = false;
  int cpu_measurable = 0;
  for (const Kernel* k : registry_.kernels()) {
    if (!k->measurable() || !registry_.usable(*k, host_).ok()) continue;
    times = times || kernel_family(*k) != "cpu" || ++cpu_measurable >= 2;
  }
  absl::StatusOr<std::shared_ptr<const Layer>> created;
  {
    std::optional<absl::MutexLock> lock;
    if (times) lock.emplace(&create_mu_);
    // An upload whose client cancelled it (or whose deadline passed) while it waited for another
    // layer's load is not built: building copies, packs and times, and would hold up the loads
    // waiting behind it.
    if (cancelled && cancelled()) {
      return absl::CancelledError(
          "upload cancelled before its layer was built; nothing was loaded or replaced");
    }
    created = Layer::create(std::move(opts), std::move(lw), registry_, host_);
  }
  return created;
}

absl::StatusOr<LoadResult> Engine::publish(const LoadRequest& request, std::vector<int8_t> weights,
                                           int64_t start_ns,
                                           const std::function<bool()>& cancelled) {
  // Building copies the weights and packs them for each kernel: the host's memory running out
  // there (an allocation that throws) fails this load alone, before the store changes.
  absl::StatusOr<std::shared_ptr<const Layer>> built;
  try {
    built = build_layer(request, std::move(weights), cancelled);
  } catch (const std::bad_alloc&) {
    built = absl::ResourceExhaustedError(
        absl::StrCat("layer '", request.name,
                     "': out of host memory while it was being built; nothing was loaded or "
                     "replaced"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const Layer> layer, std::move(built));
  BatchOptions batching = options_.batching;
  if (request.max_batch_rows >= 0)
    batching.max_batch_rows = std::max<int64_t>(1, request.max_batch_rows);
  if (request.max_queue_delay_us >= 0) batching.max_queue_delay_us = request.max_queue_delay_us;
  std::shared_ptr<ServedLayer> served =
      DeferredRelease::own(std::make_unique<ServedLayer>(), released_);
  served->layer = layer;
  LoadResult result;
  // Released after the lock, here where the engine's is the last reference: a replaced layer's
  // queue first runs what it holds, and its memory is free before the load answers.
  DeferredRelease::ReleaseHere release_here;
  std::shared_ptr<const ServedLayer> previous;
  {
    // The store and the gauges change together, so that two loads or unloads of one name leave
    // the gauges to the layer the store holds.
    absl::MutexLock lock(&publish_mu_);
    // An upload whose client cancelled it (or whose deadline passed) while the layer was being
    // built is dropped here, before the store changes: the client was told it failed.
    if (cancelled && cancelled()) {
      return absl::CancelledError(
          "upload cancelled before its layer was published; nothing was loaded or replaced");
    }
    // (Made here, after the last check but the store's own: the queue's metric series take one
    // of Metrics' layer labels.)
    // A host at its limit of threads (or of memory for a thread's stack) fails the load here,
    // before the store changes: a layer it would replace stays served.
    try {
      served->queue = std::make_unique<BatchQueue>(layer, this, batching, metrics_);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("layer '", layer->name(),
                       "': out of host memory for its queue; nothing was loaded or "
                       "replaced"));
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("layer '", layer->name(), "': its batching thread could not be started (",
                       e.what(), "); nothing was loaded or replaced"));
    }
    ASSIGN_OR_RETURN(result.replaced, store_.put(served, request.replace, &previous));
    {
      absl::MutexLock watched(&watched_mu_);
      prune_watched();  // (also here: a server without the watchdog never reads the list)
      watched_.push_back(
          Watched{layer->name(), served->queue->running_since(), served, served.get()});
    }
    if (metrics_ != nullptr) {
      metrics_->layer_loaded(layer.get(), layer->name(), layer->device(), layer->total_bytes());
      // A kernel a request prepared on demand between the store's swap and the line above
      // reported its bytes while another layer owned the gauges: read them again.
      metrics_->layer_bytes(layer.get(), layer->name(), layer->total_bytes());
      // So did a request queued in that while (layer_loaded set the depth to 0).
      served->queue->report_depth();
    }
  }
  result.served = std::move(served);
  result.load_time_us = (steady_now_ns() - start_ns) / 1000;
  return result;
}

void Engine::prune_watched() const {
  // (Never locks a layer: the watchdog must not end up releasing one, whose queue would wait for
  // the very batch it watches.)
  watched_.erase(std::remove_if(watched_.begin(), watched_.end(),
                                [](const Watched& w) { return w.served.expired(); }),
                 watched_.end());
}

size_t Engine::watched_layers() const {
  absl::MutexLock lock(&watched_mu_);
  return watched_.size();
}

std::optional<Engine::RunningBatch> Engine::longest_running_batch() const {
  const int64_t now = steady_now_ns();
  std::optional<RunningBatch> longest;
  const ServedLayer* longest_address = nullptr;
  {
    absl::MutexLock lock(&watched_mu_);
    prune_watched();
    for (const Watched& w : watched_) {
      const int64_t since = w.running_since->load(std::memory_order_relaxed);
      if (since == 0) continue;
      const std::chrono::nanoseconds running(std::max<int64_t>(0, now - since));
      if (!longest.has_value() || running > longest->running) {
        longest = RunningBatch{w.name, running};
        longest_address = w.address;
      }
    }
  }
  if (longest.has_value()) {
    // Retired unless the store holds that very layer.
    bool current = false;
    store_.visit([&](const ServedLayer& l) { current = current || &l == longest_address; });
    longest->retired = !current;
  }
  return longest;
}

absl::Status Engine::unload(absl::string_view name) {
  DeferredRelease::ReleaseHere release_here;
  std::shared_ptr<const ServedLayer> removed;  // released after the lock (see publish)
  absl::MutexLock lock(&publish_mu_);
  RETURN_IF_ERROR(store_.remove(name, &removed));
  if (metrics_ != nullptr) metrics_->layer_unloaded(removed->layer.get(), removed->name());
  return absl::OkStatus();
}

absl::Status Engine::infer(const InferInput& in, const CallContext& call, std::string* y,
                           InferOutput* out) const {
  const int64_t start = steady_now_ns();
  auto served = store_.get(in.layer);
  absl::Status status = served.status();
  if (status.ok()) {
    try {  // (a forced kernel prepared on demand allocates)
      status = validate(*(*served)->layer, in);
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError("out of host memory checking the request");
    }
  }
  if (status.ok()) status = (*served)->queue->run(in, call, y, out);
  if (metrics_ != nullptr) {
    if (status.ok()) {
      // The layer's queue holds its series whenever the engine has metrics.
      (*served)->queue->series()->request_ok(out->kernel, in.m, (steady_now_ns() - start) * 1e-9);
    } else {
      // Only loaded layers become label values: names from clients are unbounded.
      metrics_->request_failed(served.ok() ? (*served)->name() : std::string(), out->kernel,
                               status);
    }
  }
  // (A layer replaced or unloaded meanwhile, whose last reference this may be, is destroyed on
  // the release thread: its queue joined and its weights freed, on a GPU too, after the answer.)
  return status;
}

absl::Status Engine::validate(const Layer& layer, const InferInput& in) const {
  const LayerConfig& c = layer.config();
  if (in.m < 1) {
    return absl::InvalidArgumentError(absl::StrCat("m must be >= 1, got ", in.m));
  }
  const int64_t x_elem = static_cast<int64_t>(dtype_size(in.x_dtype));
  if (in.m > static_cast<int64_t>(in.x.size()) / (c.k * x_elem) + 1 ||
      static_cast<int64_t>(in.x.size()) != in.m * c.k * x_elem) {
    return absl::InvalidArgumentError(absl::StrCat(
        "x has ", in.x.size(), " bytes; expected m*k*", x_elem, " = ", in.m, "*", c.k, "*", x_elem,
        " for ", dtype_name(in.x_dtype), " input to layer '", layer.name(), "'"));
  }
  // The response carries y, and sa and azp when asked, besides its metadata: sa 4 bytes a row,
  // azp a varint of up to 10 (a negative zero point takes all 10).
  const int64_t y_bytes = in.m * c.n * static_cast<int64_t>(dtype_size(in.y_dtype));
  const int64_t scale_bytes = in.return_scales ? in.m * (is_asymmetric(c.scheme) ? 14 : 4) : 0;
  if (y_bytes + scale_bytes + kResponseMetadataBytes > options_.max_output_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "output would be ", y_bytes, " bytes (m=", in.m, ", n=", c.n, ")",
        scale_bytes > 0 ? absl::StrCat(" plus ", scale_bytes, " of sa and azp") : "",
        ", above the limit of ", options_.max_output_bytes, " less ", kResponseMetadataBytes,
        " for the response's metadata; send fewer rows per request"));
  }
  if (!in.forced_kernel.empty()) {
    // A forced kernel that cannot run this request fails here, naming the reason.
    ASSIGN_OR_RETURN(KernelChoice choice,
                     layer.choose(ProblemShape{in.m, c.n, c.k, in.x_dtype, in.y_dtype},
                                  in.forced_kernel, false));
    note_prepared(layer, choice);
  }
  return absl::OkStatus();
}

void Engine::note_prepared(const Layer& layer, const KernelChoice& choice) const {
  if (!choice.prepared_now || metrics_ == nullptr) return;
  // (Dropped unless the layer is still the one loaded under its name: see Metrics.)
  metrics_->layer_bytes(&layer, layer.name(), layer.total_bytes());
}

absl::Status Engine::execute(const Layer& layer, const InferInput& in, std::string* y,
                             InferOutput* out) const {
  // Runs on a layer queue's worker thread as well as on callers': an allocation that fails
  // anywhere in the call (the choice's explanation, y, a kernel's scratch) is the call's status.
  try {
    return execute_call(layer, in, y, out);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of host memory for the call");
  }
}

absl::Status Engine::execute_call(const Layer& layer, const InferInput& in, std::string* y,
                                  InferOutput* out) const {
  const LayerConfig& c = layer.config();
  const ProblemShape shape{in.m, c.n, c.k, in.x_dtype, in.y_dtype};
  ASSIGN_OR_RETURN(KernelChoice choice, layer.choose(shape, in.forced_kernel, in.explain));
  note_prepared(layer, choice);
  // Every kernel writes all of y (the differential tests compare the whole of y with the
  // reference, bit for bit), so it is sized without a fill: no stale byte reaches a client.
  // A unary response's y is new; a stream's keeps its allocation from the previous message.
  resize_for_overwrite(y, static_cast<size_t>(in.m * c.n) * dtype_size(in.y_dtype));
  out->sa.assign(static_cast<size_t>(in.m), 0.f);
  out->azp.assign(is_asymmetric(c.scheme) ? static_cast<size_t>(in.m) : 0, 0);
  RunArgs args;
  args.x = in.x.data();
  args.x_dtype = in.x_dtype;
  args.m = in.m;
  args.y = y->data();
  args.y_dtype = in.y_dtype;
  args.sa = out->sa.data();
  args.azp = out->azp.empty() ? nullptr : out->azp.data();
  out->kernel = std::string(choice.kernel->name());
  out->device = choice.prepared->device();
  RETURN_IF_ERROR(choice.prepared->run(args, &out->timings));
  out->explanation = std::move(choice.explanation);
  out->n = c.n;
  out->batch_rows = in.m;
  return absl::OkStatus();
}

}  // namespace qlinear
