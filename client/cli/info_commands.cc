// health, kernels, layers, describe: the read-only commands.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace qlinear::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string yes_no(bool b) { return b ? "yes" : "no"; }

std::string utc_time(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

int cmd_health(const CommandArgs& args) {
  int64_t wait_seconds = 0;
  std::string service;
  ArgParser p("qlinear-cli health [--wait-seconds N] [--service NAME]",
              "Asks the server's grpc.health.v1.Health service whether it is serving and prints\n"
              "SERVING or NOT_SERVING. Exits 1 when it is not serving or cannot be reached.\n"
              "With --wait-seconds, retries until it is serving or the time is up (for scripts\n"
              "that start a server).");
  p.add("wait-seconds", &wait_seconds, "Keep retrying for up to this many seconds");
  p.add("service", &service, "Service name to check (empty: the whole server)");
  if (int rc = parse_command_line(p, args); rc >= 0) return rc;
  if (wait_seconds < 0 || wait_seconds > 86400) {
    return usage_error("--wait-seconds must be in 0..86400");
  }

  // A channel of our own: gRPC's default reconnect backoff grows to minutes, which would make a
  // waiting check notice a freshly started server late. (The minimum backoff stays at its
  // default: gRPC also takes it as the least time a connection attempt is given, and 100 ms
  // cut off any server more than 50 ms away. A refused port still fails at once.)
  grpc::ChannelArguments ca;
  ca.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  ca.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  ca.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = make_channel(*args.server, client_options(args), ca);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);

  const auto end = Clock::now() + std::chrono::seconds(wait_seconds);
  grpc::Status last_error;
  grpc::health::v1::HealthCheckResponse resp;
  for (;;) {
    grpc::ClientContext ctx;
    auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(5);
    if (wait_seconds > 0) {
      ctx.set_wait_for_ready(true);
      deadline =
          std::min(deadline, std::chrono::system_clock::now() +
                                 std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                     std::max(end - Clock::now(), Clock::duration(0)) +
                                     std::chrono::milliseconds(100)));
    }
    ctx.set_deadline(deadline);
    resp.Clear();
    last_error = stub->Check(&ctx, req, &resp);
    if (last_error.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      std::printf("SERVING\n");
      return kExitOk;
    }
    if (Clock::now() >= end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (last_error.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && wait_seconds > 0) {
    // A wait that ran out hides why the channel could not connect (a refused port, a TLS
    // handshake that failed): one call that fails fast says it.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    const grpc::Status once = stub->Check(&ctx, req, &resp);
    if (once.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      std::printf("SERVING\n");  // it came up just now
      return kExitOk;
    }
    if (once.error_code() == grpc::StatusCode::UNAVAILABLE || once.ok()) last_error = once;
  }
  if (!last_error.ok()) {
    absl::Status s = from_grpc_status(last_error);
    return fail(absl::Status(
        s.code(),
        absl::StrCat(
            *args.server, ": ", s.message(),
            wait_seconds > 0 ? absl::StrCat(" (after waiting ", wait_seconds, " s)") : "")));
  }
  std::printf("%s\n",
              grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()).c_str());
  return kExitFailure;
}

int cmd_kernels(const CommandArgs& args) {
  std::string layer;
  ArgParser p("qlinear-cli kernels [--layer NAME]",
              "Lists every kernel the server has, in priority order (the first one that fits a\n"
              "layer wins), whether it can run on this host and why not, and the M range it is\n"
              "best at. With --layer, also shows which kernel that layer uses for each M bucket,\n"
              "and why the candidates before it were skipped.");
  p.add("layer", &layer, "Also show this layer's kernel choice per M bucket");
  if (int rc = parse_command_line(p, args); rc >= 0) return rc;
  auto client = make_client(args);
  auto kernels = client->list_kernels();
  if (!kernels.ok()) return fail(kernels.status());
  if (!kernels->server_version().empty()) {  // (older servers leave it out)
    std::printf("server: qlinear-server %s\n", kernels->server_version().c_str());
  }
  std::printf("host cpu: %s\n", kernels->cpu().c_str());
  std::printf("host gpu: %s\n", kernels->gpu().empty() ? "-" : kernels->gpu().c_str());
  if (!kernels->disabled().empty()) {
    std::printf("disabled: %s\n", absl::StrJoin(kernels->disabled(), ", ").c_str());
  }
  std::printf("\n");
  Table t({"PRIO", "KERNEL", "SUPPORTED", "DISABLED", "PREFERRED M", "REASON"});
  for (const v1::KernelInfo& k : kernels->kernels()) {
    t.add({absl::StrCat(k.priority()), k.name(), yes_no(k.supported()), yes_no(k.disabled()),
           m_range(k.preferred_m_min(), k.preferred_m_max()),
           k.reason().empty() ? "-" : k.reason()});
  }
  t.print(stdout);
  if (layer.empty()) return kExitOk;

  auto info = client->describe_layer(layer);
  if (!info.ok()) return fail(info.status());
  std::printf("\nlayer %s (N=%lld K=%lld %s, %s): kernel per M bucket\n", info->name().c_str(),
              static_cast<long long>(info->n()), static_cast<long long>(info->k()),
              scheme_cli_name(info->scheme()).c_str(), info->device().c_str());
  Table b({"M", "KERNEL", "WHY"});
  for (const v1::BucketChoice& c : info->buckets()) {
    b.add({m_range(c.m_min(), c.m_max()), c.kernel().empty() ? "none" : c.kernel(),
           selection_summary(c.explanation())});
  }
  b.print(stdout);
  return kExitOk;
}

int cmd_layers(const CommandArgs& args) {
  ArgParser p("qlinear-cli layers",
              "Lists the loaded layers: shape, scheme, bias, memory held (weights, scales, bias\n"
              "and every kernel's packed copy), device and the kernel per M bucket.");
  if (int rc = parse_command_line(p, args); rc >= 0) return rc;
  auto client = make_client(args);
  auto layers = client->list_layers();
  if (!layers.ok()) return fail(layers.status());
  if (layers->layers().empty()) {
    std::printf("no layers loaded\n");
    return kExitOk;
  }
  Table t({"NAME", "N", "K", "SCHEME", "BIAS", "BYTES", "DEVICE", "KERNEL PER M"});
  for (const v1::LayerInfo& l : layers->layers()) {
    t.add({l.name(), absl::StrCat(l.n()), absl::StrCat(l.k()), scheme_cli_name(l.scheme()),
           yes_no(l.has_bias()), human_bytes(l.total_bytes()), l.device(), bucket_summary(l)});
  }
  t.print(stdout);
  return kExitOk;
}

int cmd_describe(const CommandArgs& args) {
  ArgParser p("qlinear-cli describe NAME",
              "Shows everything the server knows about one layer: shape, scheme, scales, bias,\n"
              "memory, device, batching settings and queue, and the kernel chosen for each M\n"
              "bucket with the reason every other candidate was skipped.");
  if (int rc = parse_command_line(p, args, {"NAME"}); rc >= 0) return rc;
  auto client = make_client(args);
  auto info = client->describe_layer(p.positional()[0]);
  if (!info.ok()) return fail(info.status());
  const v1::LayerInfo& l = *info;
  const bool is_static =
      l.scheme() == v1::SCHEME_STATIC_SYMMETRIC || l.scheme() == v1::SCHEME_STATIC_ASYMMETRIC;
  auto row = [](const char* key, const std::string& value) {
    std::printf("%-17s%s\n", key, value.c_str());
  };
  row("name", l.name());
  row("shape",
      absl::StrCat("N=", l.n(), " K=", l.k(), "  (x [M, ", l.k(), "] -> y [M, ", l.n(), "])"));
  row("scheme", scheme_cli_name(l.scheme()));
  row("input scale", is_static ? absl::StrCat(l.input_scale()) : "- (per token)");
  row("input zero point", l.scheme() == v1::SCHEME_STATIC_ASYMMETRIC
                              ? absl::StrCat(l.input_zero_point())
                          : l.scheme() == v1::SCHEME_DYNAMIC_ASYMMETRIC ? "- (per token)"
                                                                        : "- (symmetric)");
  row("bias", yes_no(l.has_bias()));
  row("logical widths", l.logical_widths().empty()
                            ? "-"
                            : absl::StrCat("[", absl::StrJoin(l.logical_widths(), ", "), "]"));
  row("weight bytes", absl::StrCat(human_bytes(l.weight_bytes()), " (", l.weight_bytes(), ")"));
  row("total bytes", absl::StrCat(human_bytes(l.total_bytes()), " (", l.total_bytes(),
                                  "; scales, bias and packed copies included)"));
  row("device", l.device());
  row("batching", absl::StrCat("up to ", l.max_batch_rows(), " rows per GEMM",
                               l.max_batch_rows() <= 1 ? " (off)" : "", ", up to ",
                               l.max_queue_delay_us(), " us waiting for company"));
  row("queue depth", absl::StrCat(l.queue_depth(), " requests waiting"));
  row("forced kernel", l.forced_kernel().empty() ? "-" : l.forced_kernel());
  row("weight sha256", l.weight_sha256().empty() ? "-" : l.weight_sha256());
  row("loaded", l.loaded_unix_ms() > 0 ? utc_time(l.loaded_unix_ms()) : "-");
  std::printf("kernel per M bucket:\n");
  for (const v1::BucketChoice& b : l.buckets()) {
    std::printf("  M %-10s %s\n", m_range(b.m_min(), b.m_max()).c_str(),
                b.kernel().empty() ? "none" : b.kernel().c_str());
    print_selection(b.explanation(), "      ");
  }
  return kExitOk;
}

}  // namespace qlinear::cli
