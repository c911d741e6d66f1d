// qlinear-server: serves INT8 W8A8 quantized linear layers over gRPC.
//
// Usage: qlinear-server [--address=0.0.0.0] [--port=50051] [--no-demo-layer] ...
// SIGINT/SIGTERM stop it gracefully: health goes NOT_SERVING (with --shutdown-delay-ms, calls are
// still served that long), new calls get UNAVAILABLE, queued and running calls finish (up to
// --drain-timeout-ms; calls open with nothing in flight, such as a stream between requests, end
// once no call has work in flight), then it exits 0. Received while the
// layers of --layer-manifest load, they stop the start-up once the layer being loaded is done
// (exit 0). SIGHUP reads the TLS files again at once (as --tls-reload-interval-s does).
#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/str_cat.h"
#include "common/args.h"
#include "common/version.h"
#include "kernels/core/layer.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/registry.h"
#include "server/core/batcher.h"
#include "server/log.h"
#include "server/qlinear_service.h"
#include "server/server.h"

int main(int argc, char** argv) {
  // Before anything else: this may re-execute the program with OpenMP's spin set for cpu.onednn.
  const std::string openmp_note = qlinear::cpu::apply_openmp_spin_default(argv);
  // A crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) prints the faulting thread's symbolized
  // stack to stderr before the process dies, for the operator's report. (SIGTERM stays blocked
  // below and is taken by sigwait: the handler never sees it.)
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  // Block the stop signals, and SIGHUP (which reloads the TLS files instead of ending the
  // process), in every thread; this thread waits for them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigset_t waited_signals = stop_signals;
  sigaddset(&waited_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &waited_signals, nullptr);

  qlinear::ServerOptions o;
  std::string address = o.address;
  int64_t port = o.port, threads = o.max_threads, max_message_mb = o.max_message_mb;
  int64_t demo_n = o.demo_n, demo_k = o.demo_k, drain_timeout_ms = 10000, shutdown_delay_ms = 0;
  bool demo_layer = true;
  bool autotune = o.autotune;
  bool share_tuning = o.share_tuning;
  bool cuda_graphs = true;
  int64_t gpu_staging_mb = 64;
  int64_t gpu_staging_idle_s =
      std::chrono::duration_cast<std::chrono::seconds>(o.gpu_staging_idle).count();
  std::string disabled, layer_manifest;
  int64_t max_batch_rows = o.batching.max_batch_rows;
  int64_t max_queue_delay_us = o.batching.max_queue_delay_us;
  int64_t max_queue_requests = o.batching.max_queue_requests;
  int64_t metrics_port = 0;
  bool enable_echo = false;
  bool require_gpu = false;
  int64_t keepalive_time_ms = 0, keepalive_timeout_ms = 0;
  int64_t max_connection_age_ms = 0, max_connection_age_grace_ms = 0;
  int64_t upload_idle_timeout_ms = o.upload_idle_timeout_ms;
  std::string tls_cert, tls_key, tls_client_ca;
  int64_t tls_reload_interval_s = 60;
  int64_t liveness_batch_timeout_s =
      std::chrono::duration_cast<std::chrono::seconds>(o.liveness_batch_timeout).count();
  qlinear::ArgParser args(
      "qlinear-server [options]",
      "Serves INT8 W8A8 quantized linear layers over gRPC (service qlinear.v1.QLinear, plus\n"
      "grpc.health.v1.Health and server reflection). Layers are uploaded with qlinear-cli load\n"
      "or any gRPC client, or loaded at start-up from a layer manifest (--layer-manifest).\n\n"
      "Environment: QLINEAR_DISABLED_KERNELS=a,b turns kernels off (added to --disabled-kernels).");
  args.add("address", &address, "Address to listen on");
  args.add("port", &port, "Port to listen on (0 picks a free one)");
  args.add(
      "threads", &threads,
      "Maximum gRPC worker threads; all but an eighth of them (4-16 kept) are the call slots that "
      "uploads, Infer calls and stream messages running take (a stream between messages "
      "takes none)");
  args.add("max-message-mb", &max_message_mb, "Largest request/response message in MiB");
  args.add("demo-layer", &demo_layer, "Load the deterministic demo layer 'demo' at start-up");
  args.add("demo-n", &demo_n, "Output features of the demo layer");
  args.add("demo-k", &demo_k, "Input features of the demo layer");
  args.add("layer-manifest", &layer_manifest,
           "JSON file naming layers and their .npy files (see the README): every layer is "
           "loaded at start-up, before the server listens, and the first that fails stops it");
  args.add("disabled-kernels", &disabled, "Comma-separated kernel names to turn off");
  args.add("autotune", &autotune,
           "At load, time each M bucket's GPU kernels (or, without one in the lead, its CPU "
           "kernels) on the layer and rank the fastest first (--autotune=false: the priority "
           "order alone decides)");
  args.add("share-tuning", &share_tuning,
           "Time a layer's choices at load (autotune, and the GPU kernels' own tiles and rings) "
           "once per shape: later layers of the same N, K, scheme and bias take the first one's "
           "(--share-tuning=false: every layer times its own)");
  args.add("cuda-graphs", &cuda_graphs,
           "Replay GPU calls of up to 64 rows from CUDA graphs, timed as a whole on the host "
           "clock (--cuda-graphs=false: queue each call's copies and kernels one by one, timed "
           "stage by stage)");
  args.add("gpu-staging-mb", &gpu_staging_mb,
           "Pinned host memory, and as much GPU memory, that each of the 4 GPU stream contexts "
           "reserves at start-up for requests' copies, in MiB: a request that needs more grows "
           "its context's buffers once, at a cost of milliseconds (0 = allocate on demand)");
  args.add("gpu-staging-idle-s", &gpu_staging_idle_s,
           "Seconds after the last request that needed it that a GPU stream context gives back "
           "what it grew past --gpu-staging-mb (all of it where that reservation failed; 0 = "
           "kept for good)");
  args.add("drain-timeout-ms", &drain_timeout_ms,
           "On SIGINT/SIGTERM, how long queued and running calls may take to finish (calls open "
           "with nothing in flight, such as a stream between requests, end as soon as no call "
           "has work in flight)");
  args.add("shutdown-delay-ms", &shutdown_delay_ms,
           "On SIGINT/SIGTERM, how long health reports NOT_SERVING while every call is still "
           "served, before the drain (for load balancers and Kubernetes endpoints to stop sending "
           "new connections; a second signal ends it)");
  args.add("max-batch-rows", &max_batch_rows,
           "Dynamic batching: most rows coalesced into one GEMM per layer (1 = off)");
  args.add("max-queue-delay-us", &max_queue_delay_us,
           "Dynamic batching: longest a request waits for company (0 = batch only what is "
           "already queued)");
  args.add("max-queue-requests", &max_queue_requests,
           "Requests a layer's queue holds before answering RESOURCE_EXHAUSTED");
  args.add("metrics-port", &metrics_port,
           "Serve Prometheus metrics on http://ADDRESS:PORT/metrics, liveness on /healthz and "
           "readiness on /readyz (0 = off)");
  args.add("enable-echo", &enable_echo, "Offer the Echo RPC (transport floor for load tests)");
  args.add("require-gpu", &require_gpu,
           "Exit 1 at start-up, saying why, unless a CUDA kernel can serve on this host (a GPU "
           "deployment never serves on the CPU instead)");
  args.add("keepalive-time-ms", &keepalive_time_ms,
           "Send HTTP/2 keepalive pings this often (0 = gRPC default)");
  args.add("keepalive-timeout-ms", &keepalive_timeout_ms,
           "Close a connection whose ping is not answered in this time (0 = default)");
  args.add("max-connection-age-ms", &max_connection_age_ms,
           "Ask clients to reconnect after this long, so load balancers can rebalance (0 = never)");
  args.add("max-connection-age-grace-ms", &max_connection_age_grace_ms,
           "Time calls get to finish on a connection past its maximum age (0 = default)");
  args.add(
      "upload-idle-timeout-ms", &upload_idle_timeout_ms,
      "Cancel an upload that receives no weight bytes for this long (its header awaited, or only "
      "empty chunks), freeing its weight buffer and thread (0 = never)");
  args.add("liveness-batch-timeout-s", &liveness_batch_timeout_s,
           "With --metrics-port, /healthz fails while a batch on a GPU has been executing longer "
           "than this, in seconds (a GPU kernel that never returns holds its layer for good; CPU "
           "batches are not watched; 0 = never)");
  args.add("tls-cert", &tls_cert,
           "Serve gRPC over TLS with this PEM certificate (and any intermediates after it); "
           "needs --tls-key. The files are read at start-up, then every --tls-reload-interval-s "
           "and on SIGHUP");
  args.add("tls-key", &tls_key, "The PEM private key of --tls-cert (not encrypted)");
  args.add("tls-client-ca", &tls_client_ca,
           "Mutual TLS: require every client to present a certificate issued by one of these PEM "
           "certificate authorities");
  args.add("tls-reload-interval-s", &tls_reload_interval_s,
           "How often the TLS files are read again: a changed certificate, key or client CA set "
           "that passes the start-up checks is served from the next connection on; one that "
           "fails them is logged and the port keeps serving what it has (0 = at start-up only; "
           "SIGHUP reads them at once either way)");
  bool show_version = false;
  args.add_action("version", &show_version, "Print the version (and the commit built) and exit");
  if (absl::Status s = args.parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "qlinear-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (args.help_requested()) {
    std::printf("%s", args.help().c_str());
    return 0;
  }
  if (show_version) {
    std::printf("qlinear-server %s\n", qlinear::version_string().c_str());
    return 0;
  }
  if (!args.positional().empty()) {
    std::fprintf(stderr, "qlinear-server: unexpected argument '%s' (see --help)\n",
                 args.positional()[0].c_str());
    return 2;
  }
  // Each flag's range, checked in turn: the first one out of range is named with its value.
  const struct {
    bool bad;
    const char* flag;
    int64_t value;
    const char* range;
  } ranges[] = {
      {port < 0 || port > 65535, "port", port, "0-65535"},
      {metrics_port < 0 || metrics_port > 65535, "metrics-port", metrics_port, "0-65535"},
      {threads < qlinear::kMinServerThreads || threads > 65536, "threads", threads, "5-65536"},
      {demo_n < 1 || demo_n > qlinear::kMaxDemoN, "demo-n", demo_n, "1-1048576"},
      {demo_k < 1 || demo_k > qlinear::kMaxK, "demo-k", demo_k, "1-131071"},
      {max_message_mb < 1 || max_message_mb > 2047, "max-message-mb", max_message_mb, "1-2047"},
      {max_batch_rows < 1 || max_batch_rows > qlinear::kMaxBatchRows, "max-batch-rows",
       max_batch_rows, "1-65536"},
      {max_queue_delay_us < 0 || max_queue_delay_us > qlinear::kMaxQueueDelayUs,
       "max-queue-delay-us", max_queue_delay_us, "0-10000000"},
      {max_queue_requests < 1, "max-queue-requests", max_queue_requests, ">= 1"},
      // (Added to the clock for the drain's deadline: a larger value could overflow it.)
      {drain_timeout_ms < 0 || drain_timeout_ms > 86'400'000, "drain-timeout-ms", drain_timeout_ms,
       "0-86400000"},
      {shutdown_delay_ms < 0 || shutdown_delay_ms > 3'600'000, "shutdown-delay-ms",
       shutdown_delay_ms, "0-3600000"},
      {upload_idle_timeout_ms < 0, "upload-idle-timeout-ms", upload_idle_timeout_ms, ">= 0"},
      {liveness_batch_timeout_s < 0 || liveness_batch_timeout_s > 86400, "liveness-batch-timeout-s",
       liveness_batch_timeout_s, "0-86400"},
      {tls_reload_interval_s < 0 || tls_reload_interval_s > 86400, "tls-reload-interval-s",
       tls_reload_interval_s, "0-86400"},
      {gpu_staging_idle_s < 0 || gpu_staging_idle_s > 86400, "gpu-staging-idle-s",
       gpu_staging_idle_s, "0-86400"},
      // gRPC takes these as int.
      {keepalive_time_ms < 0 || keepalive_time_ms > INT32_MAX, "keepalive-time-ms",
       keepalive_time_ms, "0-2147483647"},
      {keepalive_timeout_ms < 0 || keepalive_timeout_ms > INT32_MAX, "keepalive-timeout-ms",
       keepalive_timeout_ms, "0-2147483647"},
      {max_connection_age_ms < 0 || max_connection_age_ms > INT32_MAX, "max-connection-age-ms",
       max_connection_age_ms, "0-2147483647"},
      {max_connection_age_grace_ms < 0 || max_connection_age_grace_ms > INT32_MAX,
       "max-connection-age-grace-ms", max_connection_age_grace_ms, "0-2147483647"},
  };
  for (const auto& r : ranges) {
    if (r.bad) {
      std::fprintf(stderr, "qlinear-server: --%s must be %s, got %lld\n", r.flag, r.range,
                   static_cast<long long>(r.value));
      return 2;
    }
  }
  o.address = address;
  o.port = static_cast<int>(port);
  o.max_threads = static_cast<int>(threads);
  o.max_message_mb = static_cast<int>(max_message_mb);
  o.demo_layer = demo_layer;
  o.demo_n = demo_n;
  o.demo_k = demo_k;
  o.layer_manifest = layer_manifest;
  // A stop signal waits, blocked, for the sigwait below; the manifest's loading asks for it
  // between layers.
  o.stop_requested = [] {
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) != 0) return false;
    return sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1;
  };
  o.disabled_kernels = qlinear::parse_kernel_list(disabled);
  o.autotune = autotune;
  o.share_tuning = share_tuning;
  o.batching.max_batch_rows = max_batch_rows;
  o.batching.max_queue_delay_us = max_queue_delay_us;
  o.batching.max_queue_requests = max_queue_requests;
  o.metrics_port = static_cast<int>(metrics_port);
  o.enable_echo = enable_echo;
  o.require_gpu = require_gpu;
  o.keepalive_time_ms = keepalive_time_ms;
  o.keepalive_timeout_ms = keepalive_timeout_ms;
  o.max_connection_age_ms = max_connection_age_ms;
  o.max_connection_age_grace_ms = max_connection_age_grace_ms;
  o.upload_idle_timeout_ms = upload_idle_timeout_ms;
  o.liveness_batch_timeout = std::chrono::seconds(liveness_batch_timeout_s);
  o.tls = {tls_cert, tls_key, tls_client_ca};
  o.tls_reload_interval = std::chrono::seconds(tls_reload_interval_s);
  o.gpu_staging_idle = std::chrono::seconds(gpu_staging_idle_s);
  if (absl::Status s = qlinear::check_server_tls_flags(o.tls); !s.ok()) {
    std::fprintf(stderr, "qlinear-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (const char* env = std::getenv("QLINEAR_DISABLED_KERNELS")) {
    for (auto& k : qlinear::parse_kernel_list(env)) o.disabled_kernels.push_back(k);
  }

  if (!openmp_note.empty()) qlinear::log_info(openmp_note);
  qlinear::enable_cuda_graphs(cuda_graphs);
  if (gpu_staging_mb < 0 || gpu_staging_mb > (int64_t{1} << 20)) {
    std::fprintf(stderr, "qlinear-server: --gpu-staging-mb must be in 0..1048576, got %lld\n",
                 static_cast<long long>(gpu_staging_mb));
    return 2;
  }
  if (auto reserved = qlinear::reserve_gpu_staging(gpu_staging_mb << 20); !reserved.ok()) {
    // Not fatal: the contexts then allocate on demand, as with --gpu-staging-mb=0.
    qlinear::log_info(absl::StrCat("could not reserve the GPU staging (", gpu_staging_mb,
                                   " MiB per stream context): ", reserved.status().message(),
                                   "; buffers will be allocated on demand"));
  } else if (*reserved > 0) {
    qlinear::log_info(absl::StrCat("reserved ", *reserved >> 20,
                                   " MiB of GPU staging (pinned host and device memory, ",
                                   gpu_staging_mb, " MiB each per stream context)"));
  }
  auto server = qlinear::QLinearServer::start(o);
  if (absl::IsCancelled(server.status()) && o.stop_requested()) {
    qlinear::log_info(absl::StrCat(
        "received a stop signal while starting: ", server.status().message(), "; stopped"));
    return 0;
  }
  if (!server.ok()) {
    std::fprintf(stderr, "qlinear-server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  int sig = 0;
  for (;;) {
    sigwait(&waited_signals, &sig);
    if (sig != SIGHUP) break;
    qlinear::log_info(absl::StrCat("received SIGHUP: ", (*server)->reload_tls()));
  }
  const char* sig_name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  if (shutdown_delay_ms > 0) {
    qlinear::log_info(absl::StrCat("received ", sig_name,
                                   "; health NOT_SERVING, still serving for ", shutdown_delay_ms,
                                   " ms before the drain"));
    (*server)->stop_serving_health();
    const timespec delay{static_cast<time_t>(shutdown_delay_ms / 1000),
                         static_cast<long>(shutdown_delay_ms % 1000 * 1'000'000)};
    if (sigtimedwait(&stop_signals, nullptr, &delay) > 0) {
      qlinear::log_info("received a second stop signal; the delay ends");
    }
  }
  qlinear::log_info(
      absl::StrCat("received ", sig_name, "; draining (up to ", drain_timeout_ms, " ms)"));
  (*server)->shutdown(std::chrono::milliseconds(drain_timeout_ms));
  (*server)->wait();
  qlinear::log_info("stopped");
  return 0;
}
