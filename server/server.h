// A running qlinear server: registry, engine, gRPC service, health and reflection. Used by
// qlinear-server's main and by the end-to-end tests (which start it on port 0).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/registry.h"
#include "server/core/engine.h"
#include "server/core/metrics.h"
#include "server/core/periodic.h"
#include "server/metrics_http.h"
#include "server/qlinear_service.h"
#include "server/tls.h"

namespace qlinear {

// The widest demo layer (--demo-n); its K is at most kMaxK.
inline constexpr int64_t kMaxDemoN = 1 << 20;

struct ServerOptions {
  std::string address = "0.0.0.0";
  int port = 50051;         // 0 picks a free port
  int max_threads = 256;    // gRPC worker threads (call slots: call_slots_for)
  int max_message_mb = 64;  // largest request or response message
  bool demo_layer = true;   // load the deterministic layer "demo" at start-up
  int64_t demo_n = 4096;    // 1-kMaxDemoN
  int64_t demo_k = 4096;    // 1-kMaxK
  // A layer manifest (common/layer_manifest.h) whose layers are loaded at start-up, after the
  // demo layer and before the server listens; empty: none. The first layer that fails to load
  // fails the start-up with its reason.
  std::string layer_manifest;
  // Asked between the manifest's layers; true stops the start-up (CANCELLED), e.g. on SIGTERM.
  std::function<bool()> stop_requested;
  std::vector<std::string> disabled_kernels;
  bool autotune = true;      // measure each bucket's GPU kernels at load and keep the fastest
  bool share_tuning = true;  // later layers of a shape take what the first one's load timed
  bool quiet = false;        // no log lines (tests)
  BatchOptions batching;     // defaults for every layer
  int metrics_port = 0;      // Prometheus text exposition on http://address:port/metrics; 0 = off
  bool enable_echo = false;  // the Echo RPC (transport floor for load tests)
  bool require_gpu = false;  // fail to start unless a CUDA kernel can serve here
  // Connection management (needed behind load balancers); 0 leaves gRPC's default.
  int64_t keepalive_time_ms = 0;
  int64_t keepalive_timeout_ms = 0;
  int64_t max_connection_age_ms = 0;
  int64_t max_connection_age_grace_ms = 0;
  // An upload that receives no message for this long is cancelled and its buffer freed; 0: never.
  int64_t upload_idle_timeout_ms = 120000;
  // /healthz fails while a batch on a GPU has been executing for longer than this (a kernel that
  // never returns holds its layer's queue for good, and only a restart frees it); 0: never.
  // (CPU batches are not watched: BatchQueue::running_since.)
  std::chrono::milliseconds liveness_batch_timeout{std::chrono::seconds(60)};
  // TLS on the gRPC port (the metrics port stays plain HTTP); off unless a certificate is given.
  ServerTlsOptions tls;
  // How often the TLS files are read again for a new certificate, key or client CA set (served
  // from the next connection on where it passes the start-up checks); 0: read once, at start-up.
  std::chrono::milliseconds tls_reload_interval{std::chrono::seconds(60)};
  // On a GPU: what a stream context holds past the start-up reservation (--gpu-staging-mb), grown
  // for a larger request, is released once no request has needed it for this long; 0: kept for
  // good. The stream contexts are the process's: with several servers in one process (tests),
  // each trims them with its own time.
  std::chrono::milliseconds gpu_staging_idle{std::chrono::seconds(30)};
};

// How long a drain waits with no call in flight before it ends the calls still open: longer than a
// request takes to reach the server from a client that wrote it as the drain began (which is then
// refused unrun, with a message saying so), and than a last answer's bytes take to leave.
inline constexpr std::chrono::milliseconds kDrainIdleSettle{200};
// How often a drain looks at the calls in flight.
inline constexpr std::chrono::milliseconds kDrainPoll{10};

class QLinearServer {
 public:
  static absl::StatusOr<std::unique_ptr<QLinearServer>> start(const ServerOptions& options);
  ~QLinearServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  Metrics& metrics() { return *metrics_; }
  Engine& engine() { return *engine_; }
  const Registry& registry() const { return registry_; }

  // Graceful stop: health turns NOT_SERVING, new calls get UNAVAILABLE, calls in flight get up
  // to `grace` to finish, then the server stops. Calls open without work in flight (a stream
  // waiting for its client's next message) do not hold it: once none has had work in flight for
  // kDrainIdleSettle, they end with UNAVAILABLE.
  void shutdown(std::chrono::milliseconds grace);
  // Health turns NOT_SERVING; every call is still served (the stop before a shutdown, while load
  // balancers take the server out). A device fault (kernels/core/device_fault.h) does the same
  // for good, and fails /healthz, so that the process is restarted.
  void stop_serving_health();
  void wait();
  // The service's calls with work in flight, and its streams waiting for their client's next
  // message (QLinearService::calls_in_flight, idle_streams).
  int calls_in_flight() const { return service_->calls_in_flight(); }
  int idle_streams() const { return service_->idle_streams(); }
  // Reads the TLS files again now (as every --tls-reload-interval-s does), logging and counting
  // what it finds as the polling does; returns a short summary ("TLS files unchanged", "TLS
  // files reloaded", ...; "no TLS files to read (plaintext)" without TLS). For SIGHUP.
  std::string reload_tls();

 private:
  QLinearServer() = default;
  void tls_event(const TlsReloadEvent& e);  // logs and counts a reload's event
  Registry registry_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // when --metrics-port is set
  int metrics_port_ = 0;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<QLinearService> service_;
  // On a GPU: trims the stream contexts' staging and sets its gauges (gpu_staging_idle).
  std::unique_ptr<Periodic> housekeeping_;
  // With TLS: what the gRPC port's credentials ask for the certificate (it outlives server_).
  std::shared_ptr<TlsReloader> tls_reloader_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool stopped_ = false;
  int device_fault_listener_ = 0;  // turns health NOT_SERVING on a device fault; 0: none
  // What /readyz says besides a device fault: starting until the gRPC port listens, then serving,
  // then stopping from the stop signal on (as the gRPC health status).
  enum class Readiness { kStarting, kServing, kStopping };
  std::atomic<Readiness> readiness_{Readiness::kStarting};
};

}  // namespace qlinear
