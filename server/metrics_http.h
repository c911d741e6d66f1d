// Serves the Prometheus text exposition of a registry at http://ADDRESS:PORT/metrics, a liveness
// check at /healthz and a readiness check at /readyz, each 200 unless the check the owner gives
// says why not (503 with the reason). Neither goes through gRPC's threads: a liveness probe is
// answered while calls hold every one of them, and readiness where probes cannot speak gRPC over
// TLS.
//
// A deliberately small HTTP/1.0 responder on one thread, which serves up to 64 clients at once
// (each with 2 s to send its request head and 5 s to take the answer, then up to 1 s in which what
// it still sends is read and dropped, so that closing does not reset the connection under an
// answer it has yet to read; one more ends the one nearest its deadline): scrapes are rare and tiny, and prometheus-cpp's civetweb exposer starts
// its threads with a fixed 100 KiB stack, which is less than the static TLS of a process that
// links cuBLASLt, so its threads fail to start there.
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
  // Says why the process is not alive (/healthz) or not ready (/readyz), "" when it is. Called on
  // the responder's thread, which must not outlive what the check reads. None: always 200.
  using Check = std::function<std::string()>;

  // Binds and starts serving; port 0 picks a free port (see port()).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> start(
      const std::string& address, int port, std::shared_ptr<prometheus::Registry> registry,
      Check liveness = nullptr, Check readiness = nullptr);
  ~MetricsHttpServer();
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  void serve();
  // The whole HTTP answer to a request head.
  std::string response_to(const std::string& head) const;

  std::shared_ptr<prometheus::Registry> registry_;
  Check liveness_;
  Check readiness_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace qlinear
