// Serves the Prometheus text exposition of a registry at http://ADDRESS:PORT/metrics, a liveness
// check at /healthz (200 while the process runs, 503 once a device fault is recorded:
// kernels/core/device_fault.h, or while the liveness check given says why not) and a readiness
// check at /readyz (200 while the gRPC port serves, 503 while it starts or stops or after a device
// fault: what grpc.health.v1 says, for probes that cannot speak gRPC over TLS). Neither check goes
// through gRPC's threads.
//
// A deliberately small HTTP/1.0 responder on one thread: scrapes are rare and tiny, and
// prometheus-cpp's civetweb exposer starts its threads with a fixed 100 KiB stack, which is less
// than the static TLS of a process that links cuBLASLt, so its threads fail to start there.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace qlinear {

class MetricsHttpServer {
 public:
  // Says why the process is not alive ("" while it is), for /healthz besides a device fault.
  // Called on the responder's thread, which it must not outlive the callee's state of.
  using LivenessCheck = std::function<std::string()>;

  // Binds and starts serving; port 0 picks a free port (see port()).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> start(
      const std::string& address, int port, std::shared_ptr<prometheus::Registry> registry,
      LivenessCheck liveness = nullptr);
  ~MetricsHttpServer();
  int port() const { return port_; }
  // What /readyz answers: kStarting until the gRPC port listens, then kServing, then kStopping
  // from the stop signal on.
  enum class Readiness { kStarting, kServing, kStopping };
  void set_readiness(Readiness r) { readiness_.store(r); }

 private:
  MetricsHttpServer() = default;
  void serve();
  void answer(int fd);

  std::shared_ptr<prometheus::Registry> registry_;
  LivenessCheck liveness_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<Readiness> readiness_{Readiness::kStarting};
  std::thread thread_;
};

}  // namespace qlinear
