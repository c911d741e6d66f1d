#include "client/cli/cli.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/layer_manifest.h"

namespace qlinear::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> list = {
      {"health", "Check that the server is serving (grpc.health.v1); can wait for it", cmd_health},
      {"kernels", "List the server's kernels in priority order, with why each can or cannot run",
       cmd_kernels},
      {"layers", "List the loaded layers", cmd_layers},
      {"describe", "Show everything about one layer, with the kernel choice per M bucket",
       cmd_describe},
      {"load", "Upload a layer: random, or from .npy / raw files; or a layer manifest's layers",
       cmd_load},
      {"manifest", "Write the layer manifest of a W8A8 safetensors checkpoint (no server)",
       cmd_manifest},
      {"unload", "Remove a layer", cmd_unload},
      {"infer", "Run one request and summarize the output and its metadata", cmd_infer},
      {"smoke", "End-to-end check of every scheme, bit-for-bit against a local reference",
       cmd_smoke},
      {"bench", "Load benchmark: concurrent streams or unary callers, latency and throughput",
       cmd_bench},
  };
  return list;
}

namespace {
// How the command connects, for the hints of fail().
bool g_tls = false;
bool g_client_certificate = false;

// A hint for a connection refused at the TLS layer: gRPC's own messages name the symptom only.
std::string transport_hint(const absl::Status& status) {
  const absl::string_view m = status.message();
  // Only a connection that could not be made: a call cut off by a server that stops says
  // "Socket closed" too.
  if (!absl::IsUnavailable(status) || !absl::StrContains(m, "failed to connect")) return "";
  if (absl::StrContains(m, "wrong version number")) {
    return " (the server speaks plaintext: connect without --tls and its files)";
  }
  if (absl::StrContains(m, "Socket closed")) {
    if (!g_tls) return " (if the server serves TLS, connect with --tls or --tls-ca)";
    if (!g_client_certificate) {
      return " (if the server asks for client certificates, give --tls-cert and --tls-key)";
    }
    return " (if the server asks for client certificates, it may not accept this one)";
  }
  if (absl::StrContains(m, "not in peer certificate")) {
    return " (the server's certificate does not bear the name connected to: give --tls-server-name "
           "with a name it bears)";
  }
  if (absl::StrContains(m, "certificate verify failed")) {
    return " (the server's certificate is not issued by --tls-ca, or by the default roots "
           "without it)";
  }
  return "";
}
}  // namespace

namespace {
volatile std::sig_atomic_t g_sigint = 0;
extern "C" void on_sigint(int) { g_sigint = 1; }
CatchSigint* g_active = nullptr;

void catch_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
}
}  // namespace

CatchSigint::CatchSigint() {
  g_sigint = 0;
  g_active = this;
  sigaction(SIGINT, nullptr, &old_);
  // A job that a script started in the background ignores SIGINT, and goes on ignoring it.
  if (old_.sa_handler == SIG_IGN) return;
  installed_ = true;
  catch_sigint();
}

CatchSigint::~CatchSigint() {
  sigaction(SIGINT, &old_, nullptr);
  g_active = nullptr;
}

CatchSigint* CatchSigint::active() { return g_active; }

void CatchSigint::pause() {
  if (!installed_ || paused_) return;
  paused_ = true;
  sigaction(SIGINT, &old_, nullptr);
}

void CatchSigint::resume() {
  if (!paused_) return;
  paused_ = false;
  // (One that came before the pause reset the action itself: SA_RESETHAND.)
  if (!sigint_received()) catch_sigint();
}

bool sigint_received() { return g_sigint != 0; }

double progress_log_seconds() {
  static const double seconds = [] {
    const char* env = std::getenv("QLINEAR_PROGRESS_S");
    double s = kDefaultProgressLogSeconds;
    if (env == nullptr || *env == '\0') return s;
    if (!absl::SimpleAtod(env, &s) || !(s >= 0) || s > 86400) {
      std::fprintf(stderr,
                   "qlinear-cli: ignoring QLINEAR_PROGRESS_S='%s' (seconds, 0-86400); upload "
                   "progress lines every %g s\n",
                   env, kDefaultProgressLogSeconds);
      return kDefaultProgressLogSeconds;
    }
    return s;
  }();
  return seconds;
}

UploadProgress::UploadProgress(std::string name)
    : tty_(isatty(fileno(stderr)) == 1),
      log_seconds_(tty_ ? 0 : progress_log_seconds()),
      name_(std::move(name)),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void UploadProgress::print(int64_t sent, int64_t total, std::chrono::steady_clock::time_point now,
                           const char* start, const char* end) {
  const double rate = static_cast<double>(sent) /
                      std::max(1e-6, std::chrono::duration<double>(now - start_).count());
  std::fprintf(stderr, "%supload %s: %s / %s (%d%%), %s/s%s", start, name_.c_str(),
               human_bytes(sent).c_str(), human_bytes(total).c_str(),
               static_cast<int>(100 * sent / std::max<int64_t>(1, total)),
               human_bytes(static_cast<int64_t>(rate)).c_str(), end);
  std::fflush(stderr);
}

void UploadProgress::update(int64_t sent, int64_t total) {
  const auto now = std::chrono::steady_clock::now();
  const bool done = sent >= total;
  if (!tty_) {
    if (log_seconds_ <= 0) return;
    const auto every = std::chrono::duration<double>(log_seconds_);
    // The last line only where the upload ran a whole interval: a shorter one prints nothing.
    if (done ? now - start_ < every : now - last_ < every) return;
    last_ = now;
    print(sent, total, now, "", "\n");
    return;
  }
  if (!done && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  open_line_ = !done;
  print(sent, total, now, "\r", done ? "   \n" : "   ");
}

void UploadProgress::end_line() {
  if (open_line_) std::fprintf(stderr, "\n");
  open_line_ = false;
}

absl::StatusOr<v1::LoadLayerResponse> upload_with_progress(Client& client, v1::LayerHeader header,
                                                           absl::Span<const int8_t> weights,
                                                           bool end_while_built) {
  UploadProgress progress(header.name());
  const bool show = static_cast<int64_t>(weights.size()) > kProgressThreshold;
  CatchSigint* const sigint = end_while_built ? CatchSigint::active() : nullptr;
  auto resp = client.load_layer(std::move(header), weights, [&](int64_t sent, int64_t total) {
    if (show) progress.update(sent, total);
    // (Paused before the flag is read: a Ctrl-C just before it stops the upload, one after it
    // ends the program.)
    if (sent >= total && sigint != nullptr) sigint->pause();
    return !sigint_received();
  });
  if (sigint != nullptr) sigint->resume();
  if (!resp.ok()) progress.end_line();
  return resp;
}

std::string layer_name_suffix() {
  std::random_device entropy;  // the OS's: nothing another process would draw alike
  return absl::StrFormat("%d-%08x", static_cast<int>(getpid()), static_cast<uint32_t>(entropy()));
}

void set_transport(bool tls, bool client_certificate) {
  g_tls = tls;
  g_client_certificate = client_certificate;
}

int fail(const absl::Status& status) {
  std::fprintf(stderr, "qlinear-cli: %s: %s%s\n", absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str(), transport_hint(status).c_str());
  return kExitFailure;
}

int usage_error(absl::string_view message) {
  std::fprintf(stderr, "qlinear-cli: INVALID_ARGUMENT: %s\n", std::string(message).c_str());
  return kExitUsage;
}

int parse_command_line(ArgParser& parser, const CommandArgs& args,
                       const std::vector<std::string>& positional) {
  parser.add("server", args.server, "Server address HOST:PORT");
  if (absl::Status s = parser.parse(args.argc, args.argv, args.first); !s.ok()) {
    return usage_error(s.message());
  }
  if (parser.help_requested()) {
    std::printf("%s", parser.help().c_str());
    return kExitOk;
  }
  const auto& pos = parser.positional();
  if (pos.size() > positional.size()) {
    return usage_error(
        absl::StrCat("unexpected argument '", pos[positional.size()], "' (see --help)"));
  }
  if (pos.size() < positional.size()) {
    return usage_error(absl::StrCat("missing ", positional[pos.size()], " (see --help)"));
  }
  return -1;
}

ClientOptions client_options(const CommandArgs& args, ClientOptions options) {
  options.max_message_mb = args.max_message_mb;
  options.call_timeout = args.timeout;
  if (args.timeout_given) options.upload_timeout = args.timeout;
  options.credentials = args.credentials;
  options.tls_server_name = args.tls_server_name;
  return options;
}

std::unique_ptr<Client> make_client(const CommandArgs& args, ClientOptions options) {
  return std::make_unique<Client>(*args.server, client_options(args, std::move(options)));
}

std::string scheme_cli_name(v1::Scheme s) {
  switch (s) {
    case v1::SCHEME_UNSPECIFIED:
    case v1::SCHEME_DYNAMIC_SYMMETRIC:
      return "dynamic_symmetric";
    case v1::SCHEME_STATIC_SYMMETRIC:
      return "static_symmetric";
    case v1::SCHEME_DYNAMIC_ASYMMETRIC:
      return "dynamic_asymmetric";
    case v1::SCHEME_STATIC_ASYMMETRIC:
      return "static_asymmetric";
    default:
      return absl::StrCat("scheme(", static_cast<int>(s), ")");
  }
}

absl::StatusOr<v1::Scheme> parse_scheme(absl::string_view name) { return parse_scheme_name(name); }

std::string dtype_cli_name(v1::DType t) {
  switch (t) {
    case v1::DTYPE_FP32:
      return "fp32";
    case v1::DTYPE_FP16:
      return "fp16";
    case v1::DTYPE_BF16:
      return "bf16";
    default:
      return absl::StrCat("dtype(", static_cast<int>(t), ")");
  }
}

absl::StatusOr<v1::DType> parse_dtype(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "bf16" || n == "bfloat16") return v1::DTYPE_BF16;
  if (n == "fp16" || n == "float16" || n == "f16") return v1::DTYPE_FP16;
  if (n == "fp32" || n == "float32" || n == "f32") return v1::DTYPE_FP32;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "'; expected bf16, fp16 or fp32"));
}

DType core_dtype(v1::DType t) {
  switch (t) {
    case v1::DTYPE_FP32:
      return DType::kF32;
    case v1::DTYPE_FP16:
      return DType::kF16;
    default:
      return DType::kBF16;
  }
}

v1::DType proto_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return v1::DTYPE_FP32;
    case DType::kF16:
      return v1::DTYPE_FP16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

std::string m_range(int64_t m_min, int64_t m_max) {
  if (m_max == 0) return absl::StrCat(">=", m_min);
  if (m_min == m_max) return absl::StrCat(m_min);
  return absl::StrCat(m_min, "-", m_max);
}

std::string selection_summary(
    const google::protobuf::RepeatedPtrField<v1::CandidateVerdict>& verdicts) {
  std::string selected = "none";
  std::string why;  // a selected kernel's reason: what autotune measured, when it ranked
  std::vector<std::string> skipped;
  for (const auto& v : verdicts) {
    if (v.selected()) {
      selected = v.kernel();
      if (!v.reason().empty()) why = absl::StrCat(": ", v.reason());
      break;  // the candidates after it lost on priority (or measured time) alone
    }
    skipped.push_back(absl::StrCat(v.kernel(), ": ", v.reason()));
  }
  if (verdicts.empty()) return "(no explanation)";
  return absl::StrCat(selected, " (", selected == "none" ? "nothing fits" : "selected", why,
                      skipped.empty() ? "" : "; ", absl::StrJoin(skipped, "; "), ")");
}

void print_selection(const google::protobuf::RepeatedPtrField<v1::CandidateVerdict>& verdicts,
                     absl::string_view indent) {
  size_t width = 0;
  for (const auto& v : verdicts) width = std::max(width, v.kernel().size());
  for (const auto& v : verdicts) {
    // A selected kernel has a reason only when autotune ranked it: what was measured.
    const std::string verdict = !v.selected()        ? absl::StrCat("skipped: ", v.reason())
                                : v.reason().empty() ? std::string("selected")
                                                     : absl::StrCat("selected: ", v.reason());
    std::printf("%.*s%-*s  %s\n", static_cast<int>(indent.size()), indent.data(),
                static_cast<int>(width), v.kernel().c_str(), verdict.c_str());
  }
}

std::string human_bytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, units[u]);
}

std::string bucket_summary(const v1::LayerInfo& info) {
  std::vector<std::string> parts;
  int64_t lo = 0, hi = 0;
  std::string kernel;
  auto flush = [&] {
    if (!kernel.empty()) parts.push_back(absl::StrCat(m_range(lo, hi), " ", kernel));
  };
  for (const v1::BucketChoice& b : info.buckets()) {
    const std::string k = b.kernel().empty() ? "none" : b.kernel();
    if (k == kernel && b.m_min() == hi + 1) {
      hi = b.m_max();
      continue;
    }
    flush();
    kernel = k;
    lo = b.m_min();
    hi = b.m_max();
  }
  flush();
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

std::string random_activations(SplitMix64& rng, int64_t count, DType dtype) {
  std::string out(static_cast<size_t>(count) * dtype_size(dtype), '\0');
  for (int64_t i = 0; i < count; ++i) {
    store_from_f32(out.data(), dtype, static_cast<size_t>(i), rng.uniform(-1.f, 1.f));
  }
  return out;
}

void Table::print(FILE* out) const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  }
}

}  // namespace qlinear::cli
