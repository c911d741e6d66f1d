#include "server/server.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/layer_manifest.h"
#include "common/version.h"
#include "grpc/health/v1/health.pb.h"
#include "kernels/core/device_fault.h"
#include "kernels/core/status.h"
#include "server/core/demo_layer.h"
#include "server/core/host_memory.h"
#include "server/log.h"
#include "server/metrics_http.h"

namespace qlinear {
namespace {

// An address as given ("0.0.0.0", "::", "[::1]", "localhost") without the brackets of an IPv6
// literal, as the metrics socket resolves it.
std::string bare_host(const std::string& address) {
  if (address.size() >= 2 && address.front() == '[' && address.back() == ']') {
    return address.substr(1, address.size() - 2);
  }
  return address;
}

// "host:port" as gRPC listens on it, and as logs and errors name it: an IPv6 literal in brackets
// ("[::]:50051"; "::" and a port joined bare would be ":::50051", which gRPC cannot split).
std::string host_port(const std::string& address, int port) {
  const std::string host = bare_host(address);
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

// The manifest at o.layer_manifest, checked before any layer loads: its JSON, every entry, and
// that each tensor it names is there (so that a mistake in the last entry is not found after the
// others have loaded).
absl::StatusOr<std::vector<ManifestLayer>> read_manifest(const ServerOptions& o,
                                                         SafetensorsHeaderCache* headers) {
  const std::string& path = o.layer_manifest;
  ASSIGN_OR_RETURN(std::vector<ManifestLayer> layers, read_layer_manifest(path));
  if (absl::Status s = check_manifest_tensors(layers, headers); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return layers;
}

// Loads the manifest's layers one after another, each as an upload of its header and weights
// would be, logging each. The first failure ends it, named.
absl::Status load_manifest(Engine& engine, const ServerOptions& o,
                           const std::vector<ManifestLayer>& layers,
                           SafetensorsHeaderCache* headers) {
  const std::string& path = o.layer_manifest;
  log_info(absl::StrCat("loading ", layers.size(), " layer", layers.size() == 1 ? "" : "s",
                        " from the manifest ", path));
  const auto start = std::chrono::steady_clock::now();
  int64_t bytes = 0;
  for (size_t i = 0; i <= layers.size(); ++i) {
    if (o.stop_requested && o.stop_requested()) {
      return absl::CancelledError(absl::StrCat("stopped while loading the manifest ", path,
                                               ", after ", i, " of ", layers.size(), " layers"));
    }
    if (i == layers.size()) break;
    const ManifestLayer& l = layers[i];
    auto failed = [&](const absl::Status& s) {
      return absl::Status(s.code(), absl::StrCat(path, ": ", l.describe(), ": ", s.message()));
    };
    // Reading a file zero-fills its buffers first, so a layer larger than the memory left would
    // meet the OOM killer (a container's limit) rather than fail: it is refused up front, as an
    // upload's header is.
    absl::StatusOr<int64_t> need = manifest_layer_read_bytes(l, headers);
    if (!need.ok()) return failed(need.status());
    if (const int64_t avail = available_memory_bytes(); avail >= 0 && *need > avail) {
      return failed(absl::ResourceExhaustedError(
          absl::StrCat("reading its weights takes ", *need, " bytes of host memory; only ", avail,
                       " are available (", kAvailableMemorySource, ")")));
    }
    v1::LayerHeader header;
    std::vector<int8_t> weights;
    if (absl::Status s = read_manifest_layer(l, &header, &weights, headers); !s.ok()) {
      return failed(s);
    }
    absl::StatusOr<LoadRequest> request = load_request_from_header(header);
    if (!request.ok()) return failed(request.status());
    bytes += static_cast<int64_t>(weights.size());
    absl::StatusOr<LoadResult> r = engine.load(*std::move(request), std::move(weights));
    if (absl::IsAlreadyExists(r.status())) {
      // (Names are unique within a manifest: the one loaded before it is the demo layer.)
      return failed(absl::AlreadyExistsError(
          "the demo layer has this name; rename the entry, or start with --no-demo-layer"));
    }
    if (!r.ok()) return failed(r.status());
    log_info(absl::StrCat("[", i + 1, "/", layers.size(), "] ", load_summary(*r)));
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  log_info(absl::StrFormat("loaded %d layer%s (%.1f MiB of weights) from the manifest in %d ms",
                           layers.size(), layers.size() == 1 ? "" : "s",
                           static_cast<double>(bytes) / (1 << 20), ms));
  return absl::OkStatus();
}

bool any_cuda_kernel_usable(const Registry& registry, const HostInfo& host) {
  for (const Kernel* k : registry.kernels()) {
    if (kernel_family(*k) == "cuda" && registry.usable(*k, host).ok()) return true;
  }
  return false;
}

// The GPU's housekeeping: every quarter of `idle` (10 ms to 1 s), the stream contexts' staging
// that no request has needed for `idle` is released (logged), and its gauges are set.
absl::StatusOr<std::unique_ptr<Periodic>> start_gpu_housekeeping(std::chrono::milliseconds idle,
                                                                 Metrics& metrics) {
  const absl::Duration trim_after = absl::FromChrono(idle);
  const absl::Duration period =
      trim_after > absl::ZeroDuration()
          ? std::clamp(trim_after / 4, absl::Milliseconds(10), absl::Seconds(1))
          : absl::Seconds(1);
  return Periodic::start(period, [trim_after, &metrics] {
    if (trim_after > absl::ZeroDuration()) {
      if (const int64_t released = trim_gpu_staging(trim_after); released > 0) {
        log_info(absl::StrFormat(
            "released %.1f MiB of GPU staging (pinned host and GPU memory) that no request had "
            "needed for %s",
            static_cast<double>(released) / (1 << 20), absl::FormatDuration(trim_after)));
      }
    }
    const GpuStagingBytes b = gpu_staging_bytes();
    metrics.gpu_staging_bytes(b.host, b.device);
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<QLinearServer>> QLinearServer::start(const ServerOptions& o) {
  std::unique_ptr<QLinearServer> s(new QLinearServer);
  set_logging(!o.quiet);
  RETURN_IF_ERROR(register_builtin_kernels(&s->registry_));
  RETURN_IF_ERROR(s->registry_.set_disabled(o.disabled_kernels));
  // The TLS files are checked before any layer loads, so that a wrong one fails the start at once.
  ASSIGN_OR_RETURN(ServerCredentials credentials, make_server_credentials(o.tls));
  const HostInfo& host = host_info();
  const bool gpu = any_cuda_kernel_usable(s->registry_, host);
  if (o.require_gpu && !gpu) {
    // A GPU deployment that would otherwise serve on the CPU (a driver too old for CUDA 13, no
    // device passed into the container, a GPU this build has no code for) stops here instead.
    std::vector<std::string> why;
    for (const Kernel* k : s->registry_.kernels()) {
      if (kernel_family(*k) != "cuda") continue;
      why.push_back(absl::StrCat(k->name(), ": ", s->registry_.usable(*k, host).message()));
    }
    if (why.empty()) why.push_back("this build has no CUDA kernels (built without QLINEAR_CUDA)");
    return absl::FailedPreconditionError(
        absl::StrCat("--require-gpu: no CUDA kernel can serve on this host (",
                     host.gpu_description(), "): ", absl::StrJoin(why, "; ")));
  }
  EngineOptions eo;
  eo.max_output_bytes = int64_t{o.max_message_mb} << 20;
  eo.batching = o.batching;
  eo.autotune = o.autotune;
  eo.share_tuning = o.share_tuning;
  s->metrics_ = std::make_unique<Metrics>();
  s->engine_ = std::make_unique<Engine>(s->registry_, host, eo, s->metrics_.get());
  if (gpu) {
    ASSIGN_OR_RETURN(s->housekeeping_, start_gpu_housekeeping(o.gpu_staging_idle, *s->metrics_));
  }
  if (o.metrics_port > 0) {
    // (The responder is stopped before the engine goes: see the destructor.) A device fault fails
    // both checks: only a restart brings the GPU back.
    auto liveness = [engine = s->engine_.get(), limit = o.liveness_batch_timeout]() -> std::string {
      if (std::optional<std::string> fault = device_fault()) return "device fault: " + *fault;
      if (limit.count() <= 0) return "";
      const std::optional<Engine::RunningBatch> b = engine->longest_running_batch();
      if (!b.has_value() || b->running <= limit) return "";
      return absl::StrFormat(
          "stuck: a batch of layer '%s'%s has run for %.3f s, over the limit of %.3f s "
          "(--liveness-batch-timeout-s)",
          b->layer, b->retired ? " (since replaced or unloaded)" : "",
          std::chrono::duration<double>(b->running).count(),
          std::chrono::duration<double>(limit).count());
    };
    auto readiness = [self = s.get()]() -> std::string {
      if (std::optional<std::string> fault = device_fault()) return "device fault: " + *fault;
      switch (self->readiness_.load()) {
        case Readiness::kStarting:
          return "starting: layers are loading";
        case Readiness::kStopping:
          return "stopping: the server is shutting down";
        case Readiness::kServing:
          break;
      }
      return "";
    };
    ASSIGN_OR_RETURN(
        s->metrics_http_,
        MetricsHttpServer::start(bare_host(o.address), o.metrics_port, s->metrics_->registry(),
                                 std::move(liveness), std::move(readiness)));
    s->metrics_port_ = s->metrics_http_->port();
  }
  s->service_ = std::make_unique<QLinearService>(s->engine_.get(), o.enable_echo,
                                                 absl::Milliseconds(o.upload_idle_timeout_ms),
                                                 call_slots_for(o.max_threads));

  // The CPU kernels' pool starts here rather than on a request, so that a host whose limit of
  // threads narrows it says so at start-up.
  const std::string cpu_threads = start_cpu_kernel_threads();
  if (!o.quiet) {
    log_info(absl::StrCat("version ", version_string(), "; host: ", host.cpu_description(), "; ",
                          cpu_threads, "; ", host.gpu_description()));
    std::vector<std::string> names;
    for (const Kernel* k : s->registry_.kernels()) {
      absl::Status u = s->registry_.usable(*k, host);
      names.push_back(u.ok() ? std::string(k->name())
                             : absl::StrCat(k->name(), " (", u.message(), ")"));
    }
    log_info(absl::StrCat("kernels in priority order: ", absl::StrJoin(names, ", ")));
  }

  // The manifest is checked before the demo layer loads, its layers loaded after it.
  std::vector<ManifestLayer> manifest;
  SafetensorsHeaderCache headers;  // read once, by the check, for the loads
  if (!o.layer_manifest.empty()) {
    ASSIGN_OR_RETURN(manifest, read_manifest(o, &headers));
  }

  if (o.demo_layer) {
    // The demo's weights are drawn before the engine checks the layer, as an upload's are not: the
    // memory they take is checked here.
    if (o.demo_n < 1 || o.demo_n > kMaxDemoN || o.demo_k < 1 || o.demo_k > kMaxK) {
      return absl::InvalidArgumentError(absl::StrCat("the demo layer's n must be 1-", kMaxDemoN,
                                                     " and its k 1-", kMaxK, ", got ", o.demo_n,
                                                     "x", o.demo_k));
    }
    const int64_t bytes = o.demo_n * o.demo_k;
    if (const int64_t avail = available_memory_bytes(); avail >= 0 && bytes > avail) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the demo layer ", o.demo_n, "x", o.demo_k, " needs ", bytes,
          " bytes of host memory; only ", avail, " are available (", kAvailableMemorySource, ")"));
    }
    std::vector<int8_t> w;
    LoadRequest req = make_demo_layer_request("demo", o.demo_n, o.demo_k, kDemoSeed, &w);
    auto r = s->engine_->load(std::move(req), std::move(w));
    if (!r.ok()) return r.status();
    if (!o.quiet) {
      // With autotune, the selected kernel's verdict says what was measured.
      const BucketInfo& m1 = r->layer().buckets()[0];
      std::string why;
      for (const CandidateVerdict& v : m1.explanation) {
        if (v.selected && !v.reason.empty()) why = absl::StrCat(" (", v.reason, ")");
      }
      log_info(absl::StrCat("loaded demo layer 'demo' ", o.demo_n, "x", o.demo_k,
                            " dynamic_symmetric with bias (seed ", kDemoSeed, ") on ",
                            r->layer().device(), "; kernel for M=1: ", m1.kernel, why));
    }
  }

  if (!o.layer_manifest.empty()) {
    RETURN_IF_ERROR(load_manifest(*s->engine_, o, manifest, &headers));
  }

  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's built-in health service has no protobuf descriptor of its own; linking ours lets
  // reflection describe grpc.health.v1 so that grpcurl-style tools can call it.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(host_port(o.address, o.port), credentials.credentials, &s->port_);
  builder.RegisterService(s->service_.get());
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
    counters.push_back(s->service_->in_flight_counter());
    builder.experimental().SetInterceptorCreators(std::move(counters));
  }
  builder.SetMaxReceiveMessageSize(o.max_message_mb << 20);
  builder.SetMaxSendMessageSize(o.max_message_mb << 20);
  // gRPC sets SO_REUSEPORT by default: a second server on this port would then bind as well, and
  // the kernel would split new connections between two processes with different layers. Without
  // it, the second one fails to listen and says so.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (o.keepalive_time_ms > 0)
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, o.keepalive_time_ms);
  if (o.keepalive_timeout_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, o.keepalive_timeout_ms);
  }
  if (o.max_connection_age_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, o.max_connection_age_ms);
  }
  if (o.max_connection_age_grace_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, o.max_connection_age_grace_ms);
  }
  grpc::ResourceQuota quota("qlinear");
  quota.SetMaxThreads(o.max_threads);
  builder.SetResourceQuota(quota);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host_port(o.address, o.port),
                                               " (address in use, or not one of this host's?)"));
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  s->readiness_ = Readiness::kServing;
  // A device fault takes the server out of service: its GPU layers can only fail from then on.
  // (The metrics port's checks read the fault themselves.)
  QLinearServer* self = s.get();
  if (credentials.reloader != nullptr) {
    s->metrics_->tls_certificate_expiry(credentials.certificate_expiry_unix);
    s->tls_reloader_ = credentials.reloader;
    // A rotated certificate (a renewed Secret, say) is served from the next connection on; one
    // that fails the checks is logged and counted, and the port keeps serving the one it has.
    s->tls_reloader_->set_listener([self](const TlsReloadEvent& e) { self->tls_event(e); });
    // (Without an interval the thread only reads a certificate rejected as not valid yet again
    // once it is.)
    RETURN_IF_ERROR(s->tls_reloader_->start_polling(absl::FromChrono(o.tls_reload_interval)));
  }
  s->device_fault_listener_ = add_device_fault_listener([self](const std::string& what) {
    self->metrics_->device_fault();
    log_info(absl::StrCat("device fault: ", what, "; health NOT_SERVING",
                          self->metrics_port_ > 0 ? ", /healthz failing" : "",
                          ": restart the process"));
    self->server_->GetHealthCheckService()->SetServingStatus(false);
  });
  if (!o.quiet) {
    log_info(absl::StrCat(
        "listening on ", host_port(o.address, s->port_), " (", credentials.summary, ")",
        s->metrics_port_ > 0 ? absl::StrCat("; metrics on http://",
                                            host_port(o.address, s->metrics_port_), "/metrics")
                             : ""));
  }
  return s;
}

void QLinearServer::shutdown(std::chrono::milliseconds grace) {
  if (stopped_) return;
  stopped_ = true;
  stop_serving_health();
  service_->start_draining();
  const auto deadline = std::chrono::system_clock::now() + grace;
  // gRPC's shutdown starts here: clients are told to go elsewhere and no new call is taken. It
  // ends when every call has, or at the deadline, when server_->Shutdown cancels what is left. A
  // call that holds no work (an InferStream waiting for its client, a health Watch) would hold
  // the stop until the deadline: once the service has had none in flight for
  // kDrainIdleSettle, those are ended at once instead, as the deadline would end them (their
  // clients see UNAVAILABLE, which they retry elsewhere). gRPC allows a shutdown to notify
  // several queues; this one tells the wait below that every call has ended by itself.
  // (gRPC's C API: a C++ completion queue takes only its own kinds of tags.)
  grpc_completion_queue* ended = grpc_completion_queue_create_for_next(nullptr);
  int tag = 0;
  grpc_server_shutdown_and_notify(server_->c_server(), ended, &tag);
  const auto started = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> idle_since;
  for (;;) {
    const auto now = std::chrono::system_clock::now();
    if (now >= deadline) break;  // (server_->Shutdown cancels the calls left)
    const auto step = std::min(deadline, now + kDrainPoll);
    const grpc_event e = grpc_completion_queue_next(
        ended, grpc::TimePoint<std::chrono::system_clock::time_point>(step).raw_time(), nullptr);
    if (e.type == GRPC_OP_COMPLETE) break;
    if (service_->calls_in_flight() > 0) {
      idle_since.reset();
      continue;
    }
    const auto idle_now = std::chrono::steady_clock::now();
    if (!idle_since.has_value()) idle_since = idle_now;
    if (idle_now - *idle_since < kDrainIdleSettle) continue;
    const int idle_streams = service_->idle_streams();
    log_info(absl::StrCat(
        "no call in flight after ",
        std::chrono::duration_cast<std::chrono::milliseconds>(idle_now - started).count(),
        " ms of the drain; ending the calls still open (", idle_streams,
        idle_streams == 1 ? " stream waiting for its client's"
                          : " streams waiting for their clients'",
        " next message)"));
    grpc_server_cancel_all_calls(server_->c_server());
    break;
  }
  server_->Shutdown(deadline);
  grpc_completion_queue_shutdown(ended);
  while (grpc_completion_queue_next(ended, gpr_inf_future(GPR_CLOCK_REALTIME), nullptr).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(ended);
}

void QLinearServer::stop_serving_health() {
  server_->GetHealthCheckService()->SetServingStatus(false);
  readiness_ = Readiness::kStopping;
}

void QLinearServer::wait() { server_->Wait(); }

void QLinearServer::tls_event(const TlsReloadEvent& e) {
  switch (e.kind) {
    case TlsReloadEvent::kLoaded:
      metrics_->tls_reload(true);
      metrics_->tls_certificate_expiry(e.certificate_expiry_unix);
      log_info(absl::StrCat("TLS files reloaded: now serving ", e.message));
      break;
    case TlsReloadEvent::kRejected:
      metrics_->tls_reload(false);
      log_info(absl::StrCat("TLS files changed but not reloaded (", e.message,
                            "); still serving the certificate already loaded"));
      break;
    case TlsReloadEvent::kRestored:
      metrics_->tls_reload_failing(false);
      log_info("TLS files hold the served certificate again");
      break;
  }
}

std::string QLinearServer::reload_tls() {
  if (tls_reloader_ == nullptr) return "no TLS files to read (plaintext)";
  std::optional<TlsReloadEvent> e = tls_reloader_->check_now();  // (logged and counted)
  if (!e.has_value()) {
    const std::string why = tls_reloader_->rejection();
    return why.empty() ? "TLS files unchanged"
                       : absl::StrCat("TLS files still not reloaded (", why, ")");
  }
  switch (e->kind) {
    case TlsReloadEvent::kLoaded:
      return "TLS files reloaded";
    case TlsReloadEvent::kRejected:
      return "TLS files not reloaded";
    case TlsReloadEvent::kRestored:
      break;
  }
  return "TLS files hold the served certificate again";
}

QLinearServer::~QLinearServer() {
  housekeeping_.reset();  // (it sets gauges of metrics_)
  if (device_fault_listener_ != 0) remove_device_fault_listener(device_fault_listener_);
  // Its events reach the metrics and the log through this server.
  if (tls_reloader_ != nullptr) tls_reloader_->stop_polling();
  if (server_ != nullptr) {
    shutdown(std::chrono::milliseconds(0));
    server_->Wait();
  }
  metrics_http_.reset();  // its liveness check reads the engine, which goes next
}

}  // namespace qlinear
