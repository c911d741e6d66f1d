// The per-layer gauges of Metrics: owned by the layer loaded under a name, so that updates from a
// replaced or unloaded layer never write over its successor's values, never bring back a layer's
// gauges once it is gone, and never touch a gauge while it is being removed.
#include "server/core/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/version.h"

namespace qlinear {
namespace {

bool has(const std::string& text, const std::string& series) {
  return text.find(series) != std::string::npos;
}

// The build's version and commit, as labels of a constant 1.
TEST(MetricsTest, NamesTheBuild) {
  Metrics m;
  const std::string line = std::string("\nqlinear_build_info{commit=\"") + build_commit() +
                           "\",version=\"" + version() + "\"} 1\n";
  EXPECT_NE(m.serialize().find(line), std::string::npos) << m.serialize();
}

// The GPU staging gauges: absent until set (a host without a GPU never sets them), then the
// latest values, by memory.
TEST(MetricsTest, GpuStagingBytesAppearOnceSet) {
  Metrics m;
  EXPECT_FALSE(has(m.serialize(), "qlinear_gpu_staging_bytes")) << m.serialize();
  m.gpu_staging_bytes(268435456, 301989888);
  EXPECT_TRUE(has(m.serialize(), "\nqlinear_gpu_staging_bytes{memory=\"host_pinned\"} 268435456\n"))
      << m.serialize();
  EXPECT_TRUE(has(m.serialize(), "\nqlinear_gpu_staging_bytes{memory=\"device\"} 301989888\n"))
      << m.serialize();
  m.gpu_staging_bytes(0, 1024);
  EXPECT_TRUE(has(m.serialize(), "\nqlinear_gpu_staging_bytes{memory=\"host_pinned\"} 0\n"))
      << m.serialize();
  EXPECT_TRUE(has(m.serialize(), "\nqlinear_gpu_staging_bytes{memory=\"device\"} 1024\n"))
      << m.serialize();
}

TEST(MetricsTest, AnUnloadedLayersUpdatesDoNotBringItsGaugesBack) {
  Metrics m;
  int a = 0;
  m.layer_loaded(&a, "l", "cpu", 100);
  m.queue_depth(&a, "l", 3);
  std::string text = m.serialize();
  EXPECT_TRUE(has(text, "qlinear_layers_loaded 1\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_layer_bytes{device=\"cpu\",layer=\"l\"} 100\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_queue_depth{layer=\"l\"} 3\n")) << text;

  m.layer_unloaded(&a, "l");
  // Its queue drains, and a request prepares a kernel on it, after the unload.
  m.queue_depth(&a, "l", 2);
  m.layer_bytes(&a, "l", 200);
  text = m.serialize();
  EXPECT_TRUE(has(text, "qlinear_layers_loaded 0\n")) << text;
  EXPECT_FALSE(has(text, "qlinear_layer_bytes{")) << text;
  EXPECT_FALSE(has(text, "qlinear_queue_depth{")) << text;
  // Unloading it again changes nothing.
  m.layer_unloaded(&a, "l");
  EXPECT_TRUE(has(m.serialize(), "qlinear_layers_loaded 0\n"));
}

TEST(MetricsTest, AReplacedLayersUpdatesAreDropped) {
  Metrics m;
  int a = 0, b = 0;
  m.layer_loaded(&a, "l", "cpu", 100);
  m.queue_depth(&a, "l", 3);
  m.layer_loaded(&b, "l", "cpu", 50);  // a replace: the new layer's queue is empty
  std::string text = m.serialize();
  EXPECT_TRUE(has(text, "qlinear_layers_loaded 1\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_layer_bytes{device=\"cpu\",layer=\"l\"} 50\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_queue_depth{layer=\"l\"} 0\n")) << text;

  // The replaced layer's queue and kernels go on reporting for a while: dropped.
  m.queue_depth(&a, "l", 7);
  m.layer_bytes(&a, "l", 999);
  m.layer_unloaded(&a, "l");
  text = m.serialize();
  EXPECT_TRUE(has(text, "qlinear_layers_loaded 1\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_layer_bytes{device=\"cpu\",layer=\"l\"} 50\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_queue_depth{layer=\"l\"} 0\n")) << text;

  m.queue_depth(&b, "l", 2);
  m.layer_bytes(&b, "l", 40);  // reported late by an earlier preparation: bytes only grow
  text = m.serialize();
  EXPECT_TRUE(has(text, "qlinear_queue_depth{layer=\"l\"} 2\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_layer_bytes{device=\"cpu\",layer=\"l\"} 50\n")) << text;
  m.layer_bytes(&b, "l", 70);
  EXPECT_TRUE(has(m.serialize(), "qlinear_layer_bytes{device=\"cpu\",layer=\"l\"} 70\n"));

  // Replaced by a layer on another device: one bytes series, the new device's.
  int c = 0;
  m.layer_loaded(&c, "l", "cuda:0", 10);
  text = m.serialize();
  EXPECT_FALSE(has(text, "device=\"cpu\"")) << text;
  EXPECT_TRUE(has(text, "qlinear_layer_bytes{device=\"cuda:0\",layer=\"l\"} 10\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_layers_loaded 1\n")) << text;
  m.layer_unloaded(&c, "l");
  text = m.serialize();
  EXPECT_FALSE(has(text, "qlinear_layer_bytes{")) << text;
  EXPECT_TRUE(has(text, "qlinear_layers_loaded 0\n")) << text;
}

// Queues and on-demand preparations report while the layer is loaded, replaced and unloaded over
// and over (the server's ConcurrentInferenceWhileLayersChange, at the metrics' level). A write to
// a gauge an unload removed lands in freed heap memory: where the gauge was looked up and then
// written without the lock (the form before the owners), this pattern crashed a plain build
// within seconds (SIGSEGV, or glibc's "malloc(): unaligned fastbin chunk detected"). (Not
// AddressSanitizer's to catch: prometheus-cpp's Gauge::Set is not instrumented.)
TEST(MetricsTest, UpdatesRaceLoadsReplacesAndUnloads) {
  Metrics m;
  constexpr int kOwners = 3;
  int owners[kOwners] = {};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const void* owner = &owners[(t + i) % kOwners];
        m.queue_depth(owner, "l", i % 5);
        if (i % 7 == 0) m.layer_bytes(owner, "l", 1000 + i % 100);
      }
    });
  }
  for (int i = 0; i < 3000; ++i) {
    const void* owner = &owners[i % kOwners];
    m.layer_loaded(owner, "l", i % 2 == 0 ? "cpu" : "cuda:0", 1000);
    if (i % 3 == 2) m.layer_unloaded(owner, "l");
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  // The last iteration (i = 2999) unloaded: nothing of the layer is left.
  const std::string text = m.serialize();
  EXPECT_TRUE(has(text, "qlinear_layers_loaded 0\n")) << text;
  EXPECT_FALSE(has(text, "qlinear_layer_bytes{")) << text;
  EXPECT_FALSE(has(text, "qlinear_queue_depth{")) << text;
}

// Only the first names get series of their own; later names share layer="<other>", so that
// layers loaded under ever new names cannot grow the metrics without bound. A name within the cap
// keeps its series (and goes on counting) after an unload and a new load.
TEST(MetricsTest, LayerNamesPastTheCapShareOneLabel) {
  Metrics m(/*max_layer_labels=*/2);
  const absl::Status failed = absl::InvalidArgumentError("x");
  m.layer_series("a")->queued(0.001);
  m.layer_series("b")->queued(0.001);
  auto c = m.layer_series("c");
  c->queued(0.001);
  m.layer_series("d")->queued(0.001);
  m.request_failed("e", "cpu.reference", failed);
  m.request_failed("", "", failed);  // a request to no loaded layer keeps the empty label
  m.layer_series("a")->queued(0.001);
  const std::string text = m.serialize();
  EXPECT_TRUE(has(text, "qlinear_queue_duration_seconds_count{layer=\"a\"} 2\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_queue_duration_seconds_count{layer=\"b\"} 1\n")) << text;
  EXPECT_TRUE(has(text, "qlinear_queue_duration_seconds_count{layer=\"<other>\"} 2\n")) << text;
  EXPECT_TRUE(has(
      text, "qlinear_request_failures_total{layer=\"<other>\",reason=\"INVALID_ARGUMENT\"} 1\n"))
      << text;
  EXPECT_TRUE(
      has(text, "qlinear_request_failures_total{layer=\"\",reason=\"INVALID_ARGUMENT\"} 1\n"))
      << text;
  for (const char* name : {"c", "d", "e"}) {
    EXPECT_FALSE(has(text, std::string("layer=\"") + name + "\"")) << name << "\n" << text;
  }
}

}  // namespace
}  // namespace qlinear
