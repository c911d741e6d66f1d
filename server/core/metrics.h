// Prometheus metrics of the serving core (prometheus-cpp). The server exposes `registry()` over
// HTTP on --metrics-port; tests read it with prometheus::TextSerializer. All methods are
// thread-safe. Names follow the Prometheus conventions (base units, _total for counters).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace qlinear {

class Metrics {
 public:
  Metrics();
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // One finished request: its status, rows, and server-side times in seconds.
  void request_done(const std::string& layer, const std::string& kernel, const absl::Status& status,
                    int64_t rows, double total_s);
  // One executed batch on `kernel`.
  void batch_done(const std::string& layer, const std::string& kernel, int64_t requests,
                  int64_t rows, double quantize_s, double gemm_s);
  void queued(const std::string& layer, double queue_s);
  void queue_depth(const std::string& layer, int64_t depth);
  void layer_loaded(const std::string& layer, const std::string& device, int64_t bytes);
  void layer_unloaded(const std::string& layer, const std::string& device);
  // The layer's bytes after a kernel was prepared for it on demand.
  void layer_bytes(const std::string& layer, const std::string& device, int64_t bytes);
  // Text exposition of everything (for tests and debugging).
  std::string serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Family<prometheus::Counter>& rows_;
  prometheus::Family<prometheus::Histogram>& request_seconds_;
  prometheus::Family<prometheus::Histogram>& queue_seconds_;
  prometheus::Family<prometheus::Histogram>& compute_seconds_;
  prometheus::Family<prometheus::Histogram>& batch_rows_;
  prometheus::Family<prometheus::Histogram>& batch_requests_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Gauge>& layers_loaded_;
  prometheus::Family<prometheus::Gauge>& layer_bytes_;
};

}  // namespace qlinear
