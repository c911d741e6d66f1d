// Prometheus metrics of the serving core (prometheus-cpp). The server exposes `registry()` over
// HTTP on --metrics-port; tests read it with prometheus::TextSerializer. All methods are
// thread-safe. Names follow the Prometheus conventions (base units, _total for counters).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace qlinear {

class Metrics {
 public:
  // The counters and histograms of a layer name stay after it is unloaded, so that they go on
  // counting when the name is loaded again (a Prometheus counter never goes back). So that a
  // client loading layers under ever new names cannot grow them without bound, only the first
  // `max_layer_labels` names get series of their own; later names share the label value
  // kOtherLayers. The gauges are per loaded layer and removed with it.
  static constexpr size_t kDefaultMaxLayerLabels = 4096;
  static constexpr const char* kOtherLayers = "<other>";  // never a layer name
  explicit Metrics(size_t max_layer_labels = kDefaultMaxLayerLabels);
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // The series one layer's answered requests and batches update, found once: a lookup by labels
  // builds a label map, hashes it and takes its family's lock, and a request made seven of them
  // (with them a request at M = 1 on the H200 host took 36 us of server time, against 29 us
  // now). Thread-safe; valid as long as the Metrics object (these series are never removed).
  class LayerSeries {
   public:
    // One request answered OK on `kernel`: its rows and server-side time in seconds.
    void request_ok(const std::string& kernel, int64_t rows, double total_s);
    // One executed batch on `kernel`; copy_s: its host copies to and from a GPU's staging memory
    // (RunTimings::copy_ns; 0 on CPU kernels).
    void batch_done(const std::string& kernel, int64_t requests, int64_t rows, double quantize_s,
                    double gemm_s, double copy_s);
    void queued(double queue_s);

   private:
    friend class Metrics;
    struct PerKernel {
      std::string kernel;
      prometheus::Counter* requests_ok;
      prometheus::Histogram* quantize_seconds;
      prometheus::Histogram* gemm_seconds;
      prometheus::Histogram* copy_seconds;
    };
    LayerSeries(Metrics* metrics, const std::string& layer);
    const PerKernel& per_kernel(const std::string& kernel);

    Metrics* const metrics_;
    const std::string layer_;
    prometheus::Counter& rows_;
    prometheus::Histogram& request_seconds_;
    prometheus::Histogram& queue_seconds_;
    prometheus::Histogram& batch_rows_;
    prometheus::Histogram& batch_requests_;
    absl::Mutex mu_;
    std::vector<std::unique_ptr<PerKernel>> kernels_ ABSL_GUARDED_BY(mu_);  // a few per layer
  };
  std::unique_ptr<LayerSeries> layer_series(const std::string& layer);

  // One failed request (`status` not OK), counted by label lookup: failures come from any layer
  // name a client sends, loaded or not (answered requests go through LayerSeries::request_ok).
  void request_failed(const std::string& layer, const std::string& kernel,
                      const absl::Status& status);

  // The per-layer gauges (queue depth; bytes, by device) belong to the layer loaded under a name,
  // named here by `owner` (its Layer's address). An update from another owner is dropped: a
  // replaced or unloaded layer whose queue still drains, or whose kernel a request prepared on
  // demand, does not write over its successor's values or bring back the gauges of a layer that
  // is gone. Loading, replacing and unloading change the gauges under the lock the updates take,
  // so that no update writes to a gauge being removed.
  //
  // `owner` is now the layer loaded as `layer` (replacing the previous one, if any), on `device`,
  // holding `bytes`; its queue is empty.
  void layer_loaded(const void* owner, const std::string& layer, const std::string& device,
                    int64_t bytes);
  // The layer `owner` loaded as `layer` is gone: its gauges are removed (nothing if another owner
  // replaced it).
  void layer_unloaded(const void* owner, const std::string& layer);
  void queue_depth(const void* owner, const std::string& layer, int64_t depth);
  // The layer's bytes after a kernel was prepared for it on demand. A layer's bytes only grow
  // while it is loaded, so a smaller value (from a preparation that finished earlier but reported
  // later) is ignored.
  void layer_bytes(const void* owner, const std::string& layer, int64_t bytes);
  // qlinear_device_fault: 1 once a device fault is recorded (kernels/core/device_fault.h).
  void device_fault();
  // qlinear_infer_streams_open: the InferStreams open, between messages or running one (they
  // hold no thread or call slot between messages, so nothing else bounds them but gRPC's
  // connection limits).
  void stream_opened();
  void stream_closed();
  // qlinear_tls_certificate_expiry_timestamp_seconds: when the served certificate's validity
  // ends (Unix time), to alert on before it does. Set at start-up and at each reload.
  void tls_certificate_expiry(int64_t unix_seconds);
  // A reload of the TLS files: qlinear_tls_reloads_total{result="loaded"|"rejected"} counts it,
  // and qlinear_tls_reload_failing is 1 from a rejected set until one is loaded or the files
  // hold the served set again (tls_reload_failing(false)).
  void tls_reload(bool loaded);
  void tls_reload_failing(bool failing);
  // qlinear_gpu_staging_bytes{memory="host_pinned"|"device"}: what the CUDA serving path's
  // stream contexts hold for requests' copies (registered from the first call: GPU hosts only).
  void gpu_staging_bytes(int64_t host_pinned, int64_t device);
  // Text exposition of everything (for tests and debugging).
  std::string serialize() const;

 private:
  // The label value of `layer`'s counters and histograms: its name, or kOtherLayers past the cap.
  std::string layer_label(const std::string& layer);
  const size_t max_layer_labels_;
  absl::Mutex labels_mu_;
  absl::flat_hash_set<std::string> layer_labels_ ABSL_GUARDED_BY(labels_mu_);
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
  prometheus::Family<prometheus::Gauge>& device_fault_;
  prometheus::Gauge& streams_open_;
  // The TLS series, registered with TLS only (the first tls_* call).
  struct TlsSeries {
    prometheus::Gauge* expiry;
    prometheus::Counter* loaded;
    prometheus::Counter* rejected;
    prometheus::Gauge* failing;
  };
  TlsSeries& tls_series();
  absl::Mutex tls_mu_;
  std::unique_ptr<TlsSeries> tls_ ABSL_GUARDED_BY(tls_mu_);

  absl::Mutex staging_mu_;
  prometheus::Gauge* staging_host_ ABSL_GUARDED_BY(staging_mu_) = nullptr;
  prometheus::Gauge* staging_device_ ABSL_GUARDED_BY(staging_mu_) = nullptr;

  // The gauges of one loaded layer, owned by the Layer at `owner`.
  struct LayerGauges {
    const void* owner = nullptr;
    std::string device;
    prometheus::Gauge* bytes = nullptr;
    prometheus::Gauge* depth = nullptr;
  };
  absl::Mutex gauges_mu_;
  absl::flat_hash_map<std::string, LayerGauges> gauges_ ABSL_GUARDED_BY(gauges_mu_);
};

}  // namespace qlinear
