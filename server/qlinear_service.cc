#include "server/qlinear_service.h"

#include <grpc/support/time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/layer_name.h"
#include "common/steady_clock.h"
#include "common/version.h"
#include "kernels/core/status.h"
#include "server/core/batcher.h"
#include "server/grpc_status.h"
#include "server/log.h"

namespace qlinear {
namespace {

int64_t now_us() { return steady_now_ns() / 1000; }

// A request id is echoed in its response, within the kResponseMetadataBytes the engine keeps free
// beside y. One longer than kMaxRequestIdBytes is INVALID_ARGUMENT, answered with its first
// kEchoedBadIdBytes, so that no answer can outgrow the message limit (on a stream a failed send
// would end the stream), cut at a character boundary (a client's parser refuses a string field
// holding part of one, which would end the stream on its side).
constexpr size_t kMaxRequestIdBytes = 4096;
constexpr size_t kEchoedBadIdBytes = 128;
static_assert(kMaxRequestIdBytes <= kResponseMetadataBytes / 8);

std::string echoed_request_id(const v1::InferRequest& request) {
  const std::string& id = request.request_id();
  return id.size() <= kMaxRequestIdBytes ? id : std::string(utf8_prefix(id, kEchoedBadIdBytes));
}

absl::StatusOr<DType> dtype_from_proto(v1::DType t, absl::string_view field) {
  switch (t) {
    case v1::DTYPE_FP32:
      return DType::kF32;
    case v1::DTYPE_FP16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must be DTYPE_FP32, DTYPE_FP16 or DTYPE_BF16 (got ", static_cast<int>(t), ")"));
  }
}

v1::DType dtype_to_proto(DType t) {
  switch (t) {
    case DType::kF32:
      return v1::DTYPE_FP32;
    case DType::kF16:
      return v1::DTYPE_FP16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<Scheme> scheme_from_proto(v1::Scheme s) {
  switch (s) {
    case v1::SCHEME_UNSPECIFIED:
    case v1::SCHEME_DYNAMIC_SYMMETRIC:
      return Scheme::kDynamicSymmetric;
    case v1::SCHEME_STATIC_SYMMETRIC:
      return Scheme::kStaticSymmetric;
    case v1::SCHEME_DYNAMIC_ASYMMETRIC:
      return Scheme::kDynamicAsymmetric;
    case v1::SCHEME_STATIC_ASYMMETRIC:
      return Scheme::kStaticAsymmetric;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown scheme ", static_cast<int>(s)));
  }
}

v1::Scheme scheme_to_proto(Scheme s) { return static_cast<v1::Scheme>(static_cast<int>(s)); }

// Reads a small tensor as fp32 values; `shape` receives its declared shape.
absl::StatusOr<std::vector<float>> floats_from_tensor(const v1::Tensor& t, absl::string_view field,
                                                      std::vector<int64_t>* shape) {
  v1::DType dt = t.dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP32 : t.dtype();
  ASSIGN_OR_RETURN(DType type, dtype_from_proto(dt, absl::StrCat(field, ".dtype")));
  const size_t elem = dtype_size(type);
  if (t.data().size() % elem != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", t.data().size(),
                                                   " bytes, not a multiple of ", elem, " (",
                                                   dtype_name(type), ")"));
  }
  const size_t count = t.data().size() / elem;
  if (t.shape_size() > 0) {
    int64_t expect = 1;
    for (int64_t d : t.shape()) {
      if (d < 0 || d > (int64_t{1} << 32)) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".shape has a bad dimension ", d));
      }
      if (__builtin_mul_overflow(expect, d, &expect)) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".shape [", absl::StrJoin(t.shape(), ", "), "] has too many values"));
      }
    }
    if (static_cast<size_t>(expect) != count) {
      return absl::InvalidArgumentError(absl::StrCat(field, " has ", count, " values but shape [",
                                                     absl::StrJoin(t.shape(), ", "), "] says ",
                                                     expect));
    }
  }
  if (shape != nullptr) shape->assign(t.shape().begin(), t.shape().end());
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = load_as_f32(t.data().data(), type, i);
  return out;
}

void fill_verdicts(const std::vector<CandidateVerdict>& in,
                   google::protobuf::RepeatedPtrField<v1::CandidateVerdict>* out) {
  for (const CandidateVerdict& v : in) {
    v1::CandidateVerdict* p = out->Add();
    p->set_kernel(v.kernel);
    p->set_selected(v.selected);
    p->set_reason(v.reason);
  }
}

// "M 1-16: a, M >=17: b": consecutive buckets with the same kernel are merged.
std::string bucket_summary(const Layer& layer) {
  std::vector<std::string> parts;
  const auto& buckets = layer.buckets();
  for (size_t i = 0; i < buckets.size();) {
    size_t j = i;
    while (j + 1 < buckets.size() && buckets[j + 1].kernel == buckets[i].kernel) ++j;
    const int64_t lo = buckets[i].bucket.lo, hi = buckets[j].bucket.hi;
    parts.push_back(
        absl::StrCat("M ", hi == INT64_MAX ? absl::StrCat(">=", lo) : absl::StrCat(lo, "-", hi),
                     ": ", buckets[i].kernel.empty() ? "none" : buckets[i].kernel));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace

absl::StatusOr<LoadRequest> load_request_from_header(const v1::LayerHeader& h) {
  LoadRequest r;
  r.name = h.name();
  r.spec.n = h.n();
  r.spec.k = h.k();
  ASSIGN_OR_RETURN(r.spec.scheme, scheme_from_proto(h.scheme()));
  ASSIGN_OR_RETURN(r.spec.weight_scale, floats_from_tensor(h.weight_scale(), "weight_scale",
                                                           &r.spec.weight_scale_shape));
  r.spec.logical_widths.assign(h.logical_widths().begin(), h.logical_widths().end());
  // A bias message with neither data nor shape is no bias; one whose shape asks for values it
  // does not hold is an error, not a layer silently served without its bias.
  if (h.has_bias() && (!h.bias().data().empty() || h.bias().shape_size() > 0)) {
    std::vector<int64_t> bias_shape;
    ASSIGN_OR_RETURN(r.spec.bias, floats_from_tensor(h.bias(), "bias", &bias_shape));
    if (bias_shape.size() > 1) {
      return absl::InvalidArgumentError("bias must be one-dimensional [N]");
    }
  }
  r.spec.has_input_scale = h.has_input_scale();
  r.spec.input_scale = h.input_scale();
  r.spec.has_input_zero_point = h.has_input_zero_point();
  r.spec.input_zero_point = h.input_zero_point();
  r.forced_kernel = h.forced_kernel();
  r.replace = h.replace();
  r.weight_sha256 = h.weight_sha256();
  if (h.has_max_batch_rows()) {
    if (h.max_batch_rows() < 1 || h.max_batch_rows() > kMaxBatchRows) {
      return absl::InvalidArgumentError(absl::StrCat("max_batch_rows must be in 1..", kMaxBatchRows,
                                                     ", got ", h.max_batch_rows()));
    }
    r.max_batch_rows = h.max_batch_rows();
  }
  if (h.has_max_queue_delay_us()) {
    if (h.max_queue_delay_us() < 0 || h.max_queue_delay_us() > kMaxQueueDelayUs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_queue_delay_us must be in 0..", kMaxQueueDelayUs, ", got ", h.max_queue_delay_us()));
    }
    r.max_queue_delay_us = h.max_queue_delay_us();
  }
  return r;
}

std::string load_summary(const LoadResult& result) {
  const Layer& layer = result.layer();
  return absl::StrCat(result.replaced ? "replaced" : "loaded", " layer '", layer.name(), "' ",
                      layer.config().n, "x", layer.config().k, " ",
                      scheme_name(layer.config().scheme), " on ", layer.device(), " in ",
                      result.load_time_us / 1000, " ms; kernels: ", bucket_summary(layer));
}

void fill_layer_info(const ServedLayer& served, v1::LayerInfo* info) {
  const Layer& layer = *served.layer;
  const LayerConfig& c = layer.config();
  info->set_max_batch_rows(served.queue->options().max_batch_rows);
  info->set_max_queue_delay_us(served.queue->options().max_queue_delay_us);
  info->set_queue_depth(served.queue->depth());
  info->set_name(layer.name());
  info->set_n(c.n);
  info->set_k(c.k);
  info->set_scheme(scheme_to_proto(c.scheme));
  info->set_has_bias(c.has_bias);
  for (int64_t w : layer.options().logical_widths) info->add_logical_widths(w);
  info->set_input_scale(c.input_scale);
  info->set_input_zero_point(c.input_zero_point);
  info->set_weight_bytes(c.n * c.k);
  info->set_total_bytes(layer.total_bytes());
  info->set_device(layer.device());
  info->set_forced_kernel(layer.options().forced_kernel);
  info->set_weight_sha256(layer.options().weight_sha256);
  info->set_loaded_unix_ms(layer.loaded_unix_ms());
  for (const BucketInfo& b : layer.buckets()) {
    v1::BucketChoice* bc = info->add_buckets();
    bc->set_m_min(b.bucket.lo);
    bc->set_m_max(b.bucket.hi == INT64_MAX ? 0 : b.bucket.hi);
    bc->set_kernel(b.kernel);
    fill_verdicts(b.explanation, bc->mutable_explanation());
  }
}

// One call of the service, counted in flight from its start (before its handler runs) until its
// end (its answer sent, or the call cancelled). A unary call's interceptor also times its answer's
// send, from the status's send (its handler has returned) to the call's end, for the slots.
class QLinearService::CallInterceptor final : public grpc::experimental::Interceptor {
 public:
  CallInterceptor(QLinearService* service, bool unary) : service_(service), unary_(unary) {
    service_->in_flight_.fetch_add(1);
  }
  ~CallInterceptor() override {
    {
      absl::MutexLock lock(&service_->calls_mu_);
      if (service_->sending_calls_.erase(this) > 0) service_->sending_.fetch_sub(1);
    }
    service_->in_flight_.fetch_sub(1);
  }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (unary_ && methods->QueryInterceptionHookPoint(
                      grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      absl::MutexLock lock(&service_->calls_mu_);
      sending_since_ns_ = steady_now_ns();
      if (service_->sending_calls_.insert(this).second) service_->sending_.fetch_add(1);
    }
    methods->Proceed();
  }
  // Under calls_mu_: whether the answer has been sent since before `ns`.
  bool sending_since_before(int64_t ns) const { return sending_since_ns_ <= ns; }

 private:
  QLinearService* const service_;
  const bool unary_;
  int64_t sending_since_ns_ = 0;
};

class QLinearService::InFlightCounter final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit InFlightCounter(QLinearService* service) : service_(service) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // The service's own calls only: health checks, watches and reflection hold no work.
    constexpr absl::string_view kPrefix = "/qlinear.v1.QLinear/";
    if (info->method() == nullptr || !absl::StartsWith(info->method(), kPrefix)) return nullptr;
    // The synchronous calls that take a slot: InferStream's messages, on the callback API, hold
    // no thread while their answers are written.
    const absl::string_view method = absl::string_view(info->method()).substr(kPrefix.size());
    return new CallInterceptor(service_,
                               method == "Infer" || method == "Echo" || method == "LoadLayer");
  }

 private:
  QLinearService* const service_;
};

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
QLinearService::in_flight_counter() {
  return std::make_unique<InFlightCounter>(this);
}

namespace {
// Whether take_slot counts a request naming `layer` by layer.
bool counted_by_layer(const CallSlots& slots, absl::string_view layer) {
  return slots.max_per_layer > 0 && !layer.empty() && validate_layer_name(layer).ok();
}
}  // namespace

void QLinearService::release_slot(absl::string_view layer) {
  if (counted_by_layer(slots_, layer)) {
    absl::MutexLock lock(&layers_mu_);
    auto it = layer_slots_.find(layer);
    if (it != layer_slots_.end() && --it->second <= 0) layer_slots_.erase(it);
  }
  slots_used_.fetch_sub(1, std::memory_order_relaxed);
}

int QLinearService::slow_sends() {
  const int64_t before = steady_now_ns() - absl::ToInt64Nanoseconds(kSlowSend);
  absl::MutexLock lock(&calls_mu_);
  int n = 0;
  for (const CallInterceptor* call : sending_calls_) n += call->sending_since_before(before);
  return n;
}

grpc::Status QLinearService::unavailable_if_draining() const {
  if (draining_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down");
  }
  return grpc::Status::OK;
}

CallSlots call_slots_for(int threads) {
  const int kept = std::clamp(threads / 8, kMinThreadsKept, 16);
  const int max_calls = std::max(1, threads - kept);
  const int per_layer = max_calls > 1 ? max_calls - std::max(1, max_calls / 8) : max_calls;
  return CallSlots{max_calls, threads, per_layer};
}

grpc::Status QLinearService::take_slot(absl::string_view layer) {
  const int used = slots_used_.fetch_add(1, std::memory_order_relaxed);
  if (slots_.max_calls <= 0) return grpc::Status::OK;
  // Answers still being sent hold threads too; the slow ones count (see CallSlots). The calls are
  // looked through only where their sends could fill the slots.
  const int slow =
      used < slots_.max_calls && used + sending_.load() >= slots_.max_calls ? slow_sends() : 0;
  const auto kept = [&] {
    return absl::StrCat(" (qlinear-server --threads=", slots_.threads, " keeps ",
                        slots_.threads - slots_.max_calls,
                        " threads for health checks and layer management); retry later");
  };
  if (used + slow >= slots_.max_calls) {
    slots_used_.fetch_sub(1, std::memory_order_relaxed);
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("server busy: all ", slots_.max_calls,
                     " slots for inference requests and uploads are taken",
                     slow > 0 ? absl::StrCat(", ", slow,
                                             " of them by answers their clients have been slow to "
                                             "read")
                              : "",
                     kept()));
  }
  if (counted_by_layer(slots_, layer)) {
    absl::MutexLock lock(&layers_mu_);
    int& held = layer_slots_[layer];
    if (held >= slots_.max_per_layer) {
      slots_used_.fetch_sub(1, std::memory_order_relaxed);
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("server busy: layer '", layer, "' has ", held, " requests in flight, ",
                       "the most one layer may hold of the ", slots_.max_calls,
                       " slots for inference requests and uploads (the others are kept for other "
                       "layers and uploads)",
                       kept()));
    }
    ++held;
  }
  return grpc::Status::OK;
}

grpc::Status QLinearService::refused(grpc::Status s) const {
  if (Metrics* m = engine_->metrics()) {
    m->request_failed("", "", from_grpc_status(s));
  }
  return s;
}

grpc::Status QLinearService::LoadLayer(grpc::ServerContext* ctx,
                                       grpc::ServerReader<v1::LoadLayerRequest>* reader,
                                       v1::LoadLayerResponse* response) {
  if (auto s = unavailable_if_draining(); !s.ok()) return s;
  if (grpc::Status s = take_slot(); !s.ok()) return s;
  absl::Cleanup slot = [this] { release_slot(); };
  // Watched until its last message: a client that stops sending is cancelled (it would hold this
  // thread, and after the header the layer's N*K buffer).
  std::unique_ptr<UploadWatchdog::Watch> watch = upload_watchdog_.watch(ctx);
  auto idle_status = [&] {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        absl::StrCat("upload received no weight bytes for ",
                                     absl::FormatDuration(upload_watchdog_.idle_limit()),
                                     " (qlinear-server --upload-idle-timeout-ms); nothing kept"));
  };
  v1::LoadLayerRequest msg;
  const bool got_header = reader->Read(&msg);
  // Not watched while the header is checked and the layer's buffer allocated (a large one takes
  // a while): the client is waiting for the server then.
  if (watch->finish()) return idle_status();
  if (!got_header) {
    if (ctx->IsCancelled()) {  // (a client that gave up before its header reached the server)
      log_info("upload cancelled before its header arrived; nothing kept");
      return grpc::Status(grpc::StatusCode::CANCELLED, "upload cancelled");
    }
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "upload ended before its header");
  }
  if (msg.part_case() != v1::LoadLayerRequest::kHeader) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first message of an upload must be the header");
  }
  auto request = load_request_from_header(msg.header());
  if (!request.ok()) return to_grpc_status(request.status());
  const std::string name = request->name;
  auto upload = engine_->begin_upload(*std::move(request));
  if (!upload.ok()) return to_grpc_status(upload.status());
  watch = upload_watchdog_.watch(ctx);
  while (reader->Read(&msg)) {
    if (msg.part_case() != v1::LoadLayerRequest::kWeightChunk) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "only weight_chunk messages may follow the header");
    }
    // Only bytes count as activity: empty chunks would keep an upload that never ends alive.
    if (!msg.weight_chunk().empty()) watch->touch();
    if (absl::Status s = (*upload)->append(msg.weight_chunk()); !s.ok()) return to_grpc_status(s);
  }
  const bool idle = watch->finish();  // building the layer may take long; the client waits now
  if (idle || ctx->IsCancelled()) {
    log_info(absl::StrCat(
        "upload of layer '", name, "' ",
        idle ? absl::StrCat("idle for ", absl::FormatDuration(upload_watchdog_.idle_limit()),
                            ", cancelled")
             : "cancelled",
        " after ", (*upload)->received(), " of ", (*upload)->expected(), " bytes; nothing kept"));
    return idle ? idle_status() : grpc::Status(grpc::StatusCode::CANCELLED, "upload cancelled");
  }
  // Checked again just before the layer is published: building it (checksum, packing, timing)
  // can take seconds, and a client that cancels or passes its deadline meanwhile is told the
  // upload failed.
  auto result = (*upload)->commit([ctx] { return ctx->IsCancelled(); });
  if (!result.ok()) {
    log_info(absl::StrCat("load of layer '", name, "' failed: ", result.status().ToString()));
    return to_grpc_status(result.status());
  }
  log_info(load_summary(*result));
  fill_layer_info(*result->served, response->mutable_layer());
  response->set_replaced(result->replaced);
  response->set_load_time_us(result->load_time_us);
  return grpc::Status::OK;
}

grpc::Status QLinearService::UnloadLayer(grpc::ServerContext*,
                                         const v1::UnloadLayerRequest* request,
                                         v1::UnloadLayerResponse*) {
  if (auto s = unavailable_if_draining(); !s.ok()) return s;
  if (absl::Status s = validate_layer_name(request->name()); !s.ok()) return to_grpc_status(s);
  absl::Status s = engine_->unload(request->name());
  if (s.ok()) log_info(absl::StrCat("unloaded layer '", request->name(), "'"));
  return to_grpc_status(s);
}

grpc::Status QLinearService::ListLayers(grpc::ServerContext*, const v1::ListLayersRequest*,
                                        v1::ListLayersResponse* response) {
  for (const auto& served : engine_->store().list()) {
    fill_layer_info(*served, response->add_layers());
  }
  return grpc::Status::OK;
}

grpc::Status QLinearService::DescribeLayer(grpc::ServerContext*,
                                           const v1::DescribeLayerRequest* request,
                                           v1::LayerInfo* response) {
  if (absl::Status s = validate_layer_name(request->name()); !s.ok()) return to_grpc_status(s);
  auto served = engine_->store().get(request->name());
  if (!served.ok()) return to_grpc_status(served.status());
  fill_layer_info(**served, response);
  return grpc::Status::OK;
}

absl::Status QLinearService::infer_one(grpc::ServerContextBase* ctx,
                                       const v1::InferRequest& request,
                                       v1::InferResponse* response) {
  const int64_t t0 = now_us();
  response->set_request_id(echoed_request_id(request));
  InferInput in;
  absl::Status parsed = [&]() -> absl::Status {
    if (request.request_id().size() > kMaxRequestIdBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id is ", request.request_id().size(), " bytes, above the limit of ",
                       kMaxRequestIdBytes, " (answered with its first ", kEchoedBadIdBytes,
                       " bytes, whole characters)"));
    }
    RETURN_IF_ERROR(validate_layer_name(request.layer()));
    in.layer = request.layer();
    ASSIGN_OR_RETURN(in.x_dtype, dtype_from_proto(request.x_dtype(), "x_dtype"));
    in.m = request.m();
    in.x = request.x();
    if (request.output_dtype() == v1::DTYPE_UNSPECIFIED) {
      in.y_dtype = in.x_dtype;
    } else {
      ASSIGN_OR_RETURN(in.y_dtype, dtype_from_proto(request.output_dtype(), "output_dtype"));
    }
    in.forced_kernel = request.forced_kernel();
    in.explain = request.explain();
    in.return_scales = request.return_scales();
    return absl::OkStatus();
  }();
  if (!parsed.ok()) {
    // The engine counts what reaches it; count what is rejected before that here.
    if (Metrics* m = engine_->metrics()) m->request_failed("", "", parsed);
    return parsed;
  }
  InferOutput out;
  CallContext call;
  // From gRPC's own deadline, not ServerContext::deadline(), whose conversion to a time_point
  // overflows for deadlines past the year 2262 (which some clients send for "none"). A deadline
  // more than a year away is none.
  const gpr_timespec raw = ctx->raw_deadline();
  if (gpr_time_cmp(raw, gpr_inf_future(raw.clock_type)) != 0) {
    const gpr_timespec left = gpr_time_sub(gpr_convert_clock_type(raw, GPR_CLOCK_MONOTONIC),
                                           gpr_now(GPR_CLOCK_MONOTONIC));
    if (left.tv_sec < int64_t{366} * 86400) {
      call.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(left.tv_sec) +
                      std::chrono::nanoseconds(left.tv_nsec);
    }
  }
  call.is_cancelled = [ctx] { return ctx->IsCancelled(); };
  RETURN_IF_ERROR(engine_->infer(in, call, response->mutable_y(), &out));
  if (!in.return_scales) {
    out.sa.clear();
    out.azp.clear();
  }
  response->set_y_dtype(dtype_to_proto(in.y_dtype));
  response->set_m(in.m);
  response->set_n(out.n);
  v1::InferMetadata* md = response->mutable_metadata();
  md->set_kernel(out.kernel);
  md->set_device(out.device);
  fill_verdicts(out.explanation, md->mutable_selection());
  md->set_batch_requests(static_cast<int32_t>(out.batch_requests));
  md->set_batch_rows(out.batch_rows);
  md->mutable_sa()->Add(out.sa.begin(), out.sa.end());
  md->mutable_azp()->Add(out.azp.begin(), out.azp.end());
  v1::Timings* t = md->mutable_timings();
  t->set_queue_us(out.queue_ns / 1000);
  t->set_quantize_us(out.timings.quantize_ns / 1000);
  t->set_gemm_us(out.timings.gemm_ns / 1000);
  t->set_copy_us(out.timings.copy_ns / 1000);
  t->set_total_us(now_us() - t0);
  // (Engine::validate keeps kResponseMetadataBytes of the limit for the metadata: the selection
  // explanation, a few KB, and the request id, at most kMaxRequestIdBytes.)
  return absl::OkStatus();
}

grpc::Status QLinearService::Infer(grpc::ServerContext* ctx, const v1::InferRequest* request,
                                   v1::InferResponse* response) {
  if (auto s = unavailable_if_draining(); !s.ok()) return refused(s);
  if (grpc::Status s = take_slot(request->layer()); !s.ok()) return refused(s);
  absl::Cleanup slot = [this, request] { release_slot(request->layer()); };
  absl::Status s = infer_one(ctx, *request, response);
  if (!s.ok()) response->Clear();
  return to_grpc_status(s);
}

// One InferStream: reads a message, runs it on the service's WorkerPool, writes its answer, reads
// the next. One operation is outstanding at a time (a read, the message's work or a write), so the
// members need no lock. A stream waiting for its client's next message holds no thread and no
// call slot, and is not in flight (see calls_in_flight).
class QLinearService::StreamReactor final
    : public grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse> {
 public:
  StreamReactor(QLinearService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx) {
    if (Metrics* m = service_->engine_->metrics()) m->stream_opened();
    if (grpc::Status s = service_->unavailable_if_draining(); !s.ok()) {
      Finish(service_->refused(s));
      return;
    }
    read_next();
  }

  void OnReadDone(bool ok) override {
    service_->in_flight_.fetch_add(1);
    service_->idle_streams_.fetch_sub(1);
    if (!ok) {  // the client half-closed, went away, or the call was cancelled
      finish();
      return;
    }
    // Once the server drains, a stream ends at its next message, which is not run: the client
    // takes it and what follows elsewhere, and the drain does not wait for a stream that stays.
    if (grpc::Status s = service_->unavailable_if_draining(); !s.ok()) {
      Finish(service_->refused(grpc::Status(
          s.error_code(), absl::StrCat(s.error_message(), "; request '",
                                       utf8_prefix(request_.request_id(), kEchoedBadIdBytes),
                                       "' and any after it on this stream were not run"))));
      return;
    }
    // Every slot taken: this message is answered RESOURCE_EXHAUSTED, and the stream goes on.
    if (grpc::Status s = service_->take_slot(request_.layer()); !s.ok()) {
      service_->refused(s);
      answer_error(from_grpc_status(s));
      StartWrite(&response_);
      return;
    }
    service_->stream_workers_.run([this] { run_message(); });
  }

  void OnWriteDone(bool ok) override {
    // A client that went away or cancelled fails this write or the next read.
    if (!ok) {
      finish();
      return;
    }
    read_next();
  }

  void OnDone() override {
    if (Metrics* m = service_->engine_->metrics()) m->stream_closed();
    delete this;
  }

 private:
  void read_next() {
    service_->idle_streams_.fetch_add(1);
    service_->in_flight_.fetch_sub(1);
    StartRead(&request_);
  }

  void run_message() {
    {
      absl::Cleanup slot = [this] { service_->release_slot(request_.layer()); };
      // Clear() keeps y's allocation: the engine sizes y without a fill (resize_for_overwrite)
      // and the kernel overwrites all of it. A failed request's response is cleared below, so no
      // stale y goes out.
      response_.Clear();
      // The stream's first answer carries the selection explanation: the first message's, or,
      // where that fails, the first that succeeds.
      if (first_) request_.set_explain(true);
      const absl::Status s = service_->infer_one(ctx_, request_, &response_);
      if (s.ok()) {
        first_ = false;
      } else {
        answer_error(s);
      }
    }
    StartWrite(&response_);
  }

  // The message's answer is `s`, with its request id.
  void answer_error(const absl::Status& s) {
    response_.Clear();
    response_.set_request_id(echoed_request_id(request_));
    response_.set_status_code(static_cast<int>(s.code()));
    response_.set_status_message(bounded_status_message(s.message()));
  }

  void finish() {
    Finish(ctx_->IsCancelled() ? grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled")
                               : grpc::Status::OK);
  }

  QLinearService* const service_;
  grpc::CallbackServerContext* const ctx_;
  v1::InferRequest request_;
  v1::InferResponse response_;
  bool first_ = true;
};

grpc::ServerBidiReactor<v1::InferRequest, v1::InferResponse>* QLinearService::InferStream(
    grpc::CallbackServerContext* ctx) {
  return new StreamReactor(this, ctx);
}

// An EchoResponse's bytes besides its payload: the field's tag and length.
constexpr int64_t kEchoFramingBytes = 16;

grpc::Status QLinearService::Echo(grpc::ServerContext*, const v1::EchoRequest* request,
                                  v1::EchoResponse* response) {
  if (!enable_echo_) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "Echo is off; start qlinear-server with --enable-echo");
  }
  if (auto s = unavailable_if_draining(); !s.ok()) return s;
  // A slot as an inference call takes: Echo stands for one in load tests, and its payload, as
  // large as a y, holds a thread alike.
  if (grpc::Status s = take_slot(); !s.ok()) return s;
  absl::Cleanup slot = [this] { release_slot(); };
  // A payload over the send limit could not be sent: it is refused before it is allocated.
  const int64_t most =
      std::min(engine_->options().max_output_bytes - kEchoFramingBytes, int64_t{1} << 30);
  if (request->response_bytes() < 0 || request->response_bytes() > most) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("response_bytes must be in 0..", most,
                                     " (the message limit less the response's framing, at most "
                                     "2^30), got ",
                                     request->response_bytes()));
  }
  response->mutable_payload()->assign(static_cast<size_t>(request->response_bytes()), '\0');
  return grpc::Status::OK;
}

grpc::Status QLinearService::ListKernels(grpc::ServerContext*, const v1::ListKernelsRequest*,
                                         v1::ListKernelsResponse* response) {
  const Registry& reg = engine_->registry();
  const HostInfo& host = engine_->host();
  int prio = 0;
  for (const Kernel* k : reg.kernels()) {
    v1::KernelInfo* ki = response->add_kernels();
    ki->set_name(std::string(k->name()));
    ki->set_priority(prio++);
    absl::Status s = reg.usable(*k, host);
    ki->set_supported(s.ok());
    ki->set_reason(std::string(s.message()));
    ki->set_disabled(reg.is_disabled(k->name()));
    ki->set_preferred_m_min(k->preferred_m().min);
    ki->set_preferred_m_max(k->preferred_m().max == INT64_MAX ? 0 : k->preferred_m().max);
    if (ki->disabled()) response->add_disabled(std::string(k->name()));
  }
  response->set_cpu(host.cpu_description());
  response->set_gpu(host.gpu_description());
  response->set_server_version(version_string());
  return grpc::Status::OK;
}

}  // namespace qlinear
