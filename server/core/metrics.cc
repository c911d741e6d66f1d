#include "server/core/metrics.h"

#include <algorithm>
#include <sstream>

#include "absl/status/status.h"
#include "common/version.h"
#include "prometheus/text_serializer.h"

namespace qlinear {
namespace {

// 10 us .. ~10 s, x2 per bucket. Built once: histograms are looked up on every request.
const prometheus::Histogram::BucketBoundaries& seconds_buckets() {
  static const prometheus::Histogram::BucketBoundaries b = [] {
    prometheus::Histogram::BucketBoundaries v;
    for (double x = 10e-6; x < 12.0; x *= 2) v.push_back(x);
    return v;
  }();
  return b;
}

// 1 .. 4096 rows/requests, x2 per bucket.
const prometheus::Histogram::BucketBoundaries& count_buckets() {
  static const prometheus::Histogram::BucketBoundaries b = [] {
    prometheus::Histogram::BucketBoundaries v;
    for (double x = 1; x <= 4096; x *= 2) v.push_back(x);
    return v;
  }();
  return b;
}

std::string code_name(const absl::Status& s) { return absl::StatusCodeToString(s.code()); }

}  // namespace

Metrics::Metrics(size_t max_layer_labels)
    : max_layer_labels_(max_layer_labels),
      registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("qlinear_requests_total")
                    .Help("Inference requests answered, by layer, kernel and status code")
                    .Register(*registry_)),
      failures_(prometheus::BuildCounter()
                    .Name("qlinear_request_failures_total")
                    .Help("Inference requests that failed, by layer and reason (status code)")
                    .Register(*registry_)),
      rows_(prometheus::BuildCounter()
                .Name("qlinear_rows_total")
                .Help("Activation rows (tokens) computed, by layer")
                .Register(*registry_)),
      request_seconds_(prometheus::BuildHistogram()
                           .Name("qlinear_request_duration_seconds")
                           .Help("Server time per inference request, receipt to response")
                           .Register(*registry_)),
      queue_seconds_(prometheus::BuildHistogram()
                         .Name("qlinear_queue_duration_seconds")
                         .Help("Time requests waited in the batching queue")
                         .Register(*registry_)),
      compute_seconds_(prometheus::BuildHistogram()
                           .Name("qlinear_compute_duration_seconds")
                           .Help("Kernel time per batch, by phase (quantize, gemm, and copy: "
                                 "a GPU's host staging copies, 0 on CPU kernels)")
                           .Register(*registry_)),
      batch_rows_(prometheus::BuildHistogram()
                      .Name("qlinear_batch_rows")
                      .Help("Rows per executed batch")
                      .Register(*registry_)),
      batch_requests_(prometheus::BuildHistogram()
                          .Name("qlinear_batch_requests")
                          .Help("Requests coalesced per executed batch")
                          .Register(*registry_)),
      queue_depth_(prometheus::BuildGauge()
                       .Name("qlinear_queue_depth")
                       .Help("Requests waiting in a layer's queue")
                       .Register(*registry_)),
      layers_loaded_(prometheus::BuildGauge()
                         .Name("qlinear_layers_loaded")
                         .Help("Layers currently loaded")
                         .Register(*registry_)),
      layer_bytes_(prometheus::BuildGauge()
                       .Name("qlinear_layer_bytes")
                       .Help("Memory held by a loaded layer (weights, scales, packed copies), by "
                             "device")
                       .Register(*registry_)),
      device_fault_(prometheus::BuildGauge()
                        .Name("qlinear_device_fault")
                        .Help("1 once a GPU's CUDA context is lost (the process must restart)")
                        .Register(*registry_)),
      streams_open_(prometheus::BuildGauge()
                        .Name("qlinear_infer_streams_open")
                        .Help("InferStreams open, between messages or running one")
                        .Register(*registry_)
                        .Add({})) {
  layers_loaded_.Add({}).Set(0);
  device_fault_.Add({}).Set(0);
  prometheus::BuildGauge()
      .Name("qlinear_build_info")
      .Help("1, labelled with the version and the commit of the build serving")
      .Register(*registry_)
      .Add({{"version", version()}, {"commit", build_commit()}})
      .Set(1);
}

void Metrics::device_fault() { device_fault_.Add({}).Set(1); }

void Metrics::stream_opened() { streams_open_.Increment(); }

void Metrics::stream_closed() { streams_open_.Decrement(); }

Metrics::TlsSeries& Metrics::tls_series() {
  absl::MutexLock lock(&tls_mu_);
  if (tls_ == nullptr) {
    auto& reloads = prometheus::BuildCounter()
                        .Name("qlinear_tls_reloads_total")
                        .Help(
                            "Changes of the TLS files found, by result: loaded (served from the "
                            "next connection on) or rejected (the served certificate kept)")
                        .Register(*registry_);
    tls_ = std::make_unique<TlsSeries>(TlsSeries{
        &prometheus::BuildGauge()
             .Name("qlinear_tls_certificate_expiry_timestamp_seconds")
             .Help("When the certificate the gRPC port serves stops being valid (Unix time)")
             .Register(*registry_)
             .Add({}),
        &reloads.Add({{"result", "loaded"}}), &reloads.Add({{"result", "rejected"}}),
        &prometheus::BuildGauge()
             .Name("qlinear_tls_reload_failing")
             .Help("1 while the TLS files hold a set that failed the checks (the gRPC port "
                   "serves the one loaded before)")
             .Register(*registry_)
             .Add({})});
  }
  return *tls_;
}

void Metrics::tls_certificate_expiry(int64_t unix_seconds) {
  tls_series().expiry->Set(static_cast<double>(unix_seconds));
}

void Metrics::tls_reload(bool loaded) {
  TlsSeries& t = tls_series();
  t.failing->Set(loaded ? 0 : 1);  // before the count, which a reader may wait on
  (loaded ? t.loaded : t.rejected)->Increment();
}

void Metrics::tls_reload_failing(bool failing) { tls_series().failing->Set(failing ? 1 : 0); }

void Metrics::gpu_staging_bytes(int64_t host_pinned, int64_t device) {
  absl::MutexLock lock(&staging_mu_);
  if (staging_host_ == nullptr) {
    auto& family = prometheus::BuildGauge()
                       .Name("qlinear_gpu_staging_bytes")
                       .Help(
                           "Memory the GPU serving path's stream contexts hold for requests' "
                           "copies, by memory: host_pinned or device (--gpu-staging-mb is kept; "
                           "more is released --gpu-staging-idle-s after the last request that "
                           "needed it)")
                       .Register(*registry_);
    staging_host_ = &family.Add({{"memory", "host_pinned"}});
    staging_device_ = &family.Add({{"memory", "device"}});
  }
  staging_host_->Set(static_cast<double>(host_pinned));
  staging_device_->Set(static_cast<double>(device));
}

Metrics::LayerSeries::LayerSeries(Metrics* metrics, const std::string& layer)
    : metrics_(metrics),
      layer_(layer),
      rows_(metrics->rows_.Add({{"layer", layer}})),
      request_seconds_(metrics->request_seconds_.Add({{"layer", layer}}, seconds_buckets())),
      queue_seconds_(metrics->queue_seconds_.Add({{"layer", layer}}, seconds_buckets())),
      batch_rows_(metrics->batch_rows_.Add({{"layer", layer}}, count_buckets())),
      batch_requests_(metrics->batch_requests_.Add({{"layer", layer}}, count_buckets())) {}

std::string Metrics::layer_label(const std::string& layer) {
  if (layer.empty()) return layer;  // failures of requests to no loaded layer
  absl::MutexLock lock(&labels_mu_);
  if (layer_labels_.contains(layer)) return layer;
  if (layer_labels_.size() < max_layer_labels_) {
    layer_labels_.insert(layer);
    return layer;
  }
  return kOtherLayers;
}

std::unique_ptr<Metrics::LayerSeries> Metrics::layer_series(const std::string& layer) {
  return std::unique_ptr<LayerSeries>(new LayerSeries(this, layer_label(layer)));
}

const Metrics::LayerSeries::PerKernel& Metrics::LayerSeries::per_kernel(const std::string& kernel) {
  absl::MutexLock lock(&mu_);
  for (const auto& k : kernels_) {
    if (k->kernel == kernel) return *k;
  }
  auto k = std::make_unique<PerKernel>();
  k->kernel = kernel;
  k->requests_ok =
      &metrics_->requests_.Add({{"layer", layer_}, {"kernel", kernel}, {"code", "OK"}});
  k->quantize_seconds = &metrics_->compute_seconds_.Add(
      {{"layer", layer_}, {"kernel", kernel}, {"phase", "quantize"}}, seconds_buckets());
  k->gemm_seconds = &metrics_->compute_seconds_.Add(
      {{"layer", layer_}, {"kernel", kernel}, {"phase", "gemm"}}, seconds_buckets());
  k->copy_seconds = &metrics_->compute_seconds_.Add(
      {{"layer", layer_}, {"kernel", kernel}, {"phase", "copy"}}, seconds_buckets());
  kernels_.push_back(std::move(k));
  return *kernels_.back();
}

void Metrics::LayerSeries::request_ok(const std::string& kernel, int64_t rows, double total_s) {
  per_kernel(kernel).requests_ok->Increment();
  rows_.Increment(static_cast<double>(rows));
  request_seconds_.Observe(total_s);
}

void Metrics::LayerSeries::batch_done(const std::string& kernel, int64_t requests, int64_t rows,
                                      double quantize_s, double gemm_s, double copy_s) {
  batch_rows_.Observe(static_cast<double>(rows));
  batch_requests_.Observe(static_cast<double>(requests));
  const PerKernel& k = per_kernel(kernel);
  k.quantize_seconds->Observe(quantize_s);
  k.gemm_seconds->Observe(gemm_s);
  k.copy_seconds->Observe(copy_s);
}

void Metrics::LayerSeries::queued(double queue_s) { queue_seconds_.Observe(queue_s); }

void Metrics::request_failed(const std::string& layer, const std::string& kernel,
                             const absl::Status& status) {
  const std::string label = layer_label(layer);
  requests_.Add({{"layer", label}, {"kernel", kernel}, {"code", code_name(status)}}).Increment();
  failures_.Add({{"layer", label}, {"reason", code_name(status)}}).Increment();
}

void Metrics::layer_loaded(const void* owner, const std::string& layer, const std::string& device,
                           int64_t bytes) {
  absl::MutexLock lock(&gauges_mu_);
  auto [it, first] = gauges_.try_emplace(layer);
  LayerGauges& g = it->second;
  if (first) {
    layers_loaded_.Add({}).Increment();
    g.depth = &queue_depth_.Add({{"layer", layer}});
  } else if (g.device != device) {
    // Replaced by a layer on another device: the old device's series goes.
    layer_bytes_.Remove(g.bytes);
    g.bytes = nullptr;
  }
  if (g.bytes == nullptr) g.bytes = &layer_bytes_.Add({{"layer", layer}, {"device", device}});
  g.owner = owner;
  g.device = device;
  g.bytes->Set(static_cast<double>(bytes));
  g.depth->Set(0);
}

void Metrics::layer_unloaded(const void* owner, const std::string& layer) {
  absl::MutexLock lock(&gauges_mu_);
  const auto it = gauges_.find(layer);
  if (it == gauges_.end() || it->second.owner != owner) return;
  // Dropped, so that scrapes do not show layers that are gone.
  layer_bytes_.Remove(it->second.bytes);
  queue_depth_.Remove(it->second.depth);
  gauges_.erase(it);
  layers_loaded_.Add({}).Decrement();
}

void Metrics::queue_depth(const void* owner, const std::string& layer, int64_t depth) {
  absl::MutexLock lock(&gauges_mu_);
  const auto it = gauges_.find(layer);
  if (it != gauges_.end() && it->second.owner == owner) {
    it->second.depth->Set(static_cast<double>(depth));
  }
}

void Metrics::layer_bytes(const void* owner, const std::string& layer, int64_t bytes) {
  absl::MutexLock lock(&gauges_mu_);
  const auto it = gauges_.find(layer);
  if (it != gauges_.end() && it->second.owner == owner) {
    prometheus::Gauge& g = *it->second.bytes;
    g.Set(std::max(g.Value(), static_cast<double>(bytes)));
  }
}

std::string Metrics::serialize() const {
  prometheus::TextSerializer s;
  std::ostringstream out;
  s.Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace qlinear
