// qlinear-cli: the command-line client of a qlinear server. It checks health, lists kernels and
// layers, uploads layers (random ones, or .npy / raw files from a checkpoint), runs requests and,
// with `smoke`, checks a server end to end against a local copy of the reference kernel.
//
// Usage: qlinear-cli [--server HOST:PORT] <command> [options]
//        qlinear-cli help [<command>]
// The server defaults to $QLINEAR_SERVER, else localhost:50051. Exit status: 0 ok, 1 failure
// (an RPC error, a server that is not serving, a mismatch), 2 usage error (a bad command line, a
// TLS file missing or unusable).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "common/args.h"
#include "common/version.h"

namespace qlinear::cli {
namespace {

std::string overview() {
  std::string out =
      "qlinear-cli: command-line client for the qlinear INT8 W8A8 inference server.\n\n"
      "Usage: qlinear-cli [--server HOST:PORT] [--max-message-mb N] [--timeout-s S] [--tls ...] "
      "<command> [options]\n"
      "       qlinear-cli help [<command>]\n\n"
      "Commands:\n";
  for (const Command& c : commands()) {
    std::string name = c.name;
    name.resize(12, ' ');
    out += absl::StrCat("  ", name, c.summary, "\n");
  }
  out += absl::StrCat(
      "  help        Show this overview, or a command's options\n\n", "Global options:\n",
      "  --server=HOST:PORT  Server address (default: $QLINEAR_SERVER, else ", kDefaultServer,
      ")\n",
      "  --max-message-mb=N  Largest message the client sends or takes, in MiB "
      "(1-2047, default 64;\n"
      "                      as large as the server's --max-message-mb for "
      "larger outputs)\n",
      "  --timeout-s=S       Deadline of each call, in seconds (0-86400, 0: none; "
      "default 60;\n"
      "                      also of each smoke scheme's stream and each bench "
      "request; an upload,\n"
      "                      `load` or smoke's and bench's own layers, has none "
      "unless given)\n",
      "  --tls               Connect over TLS, verifying the server with gRPC's "
      "default roots\n"
      "                      ($GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, else the "
      "system's; implied by\n"
      "                      any --tls-* option)\n",
      "  --tls-ca=FILE       PEM certificate authorities that verify the server "
      "instead\n",
      "  --tls-cert=FILE     PEM client certificate, for a server that asks for "
      "one (mutual TLS;\n"
      "                      with --tls-key)\n",
      "  --tls-key=FILE      PEM private key of --tls-cert (not encrypted)\n",
      "  --tls-server-name=NAME\n"
      "                      Name the server's certificate must bear, where the "
      "server's address\n"
      "                      is not it (an IP address, a tunnel)\n"
      "                      ($QLINEAR_TLS_CA, $QLINEAR_TLS_CERT, $QLINEAR_TLS_KEY "
      "and\n"
      "                      $QLINEAR_TLS_SERVER_NAME give the --tls-* defaults)\n",
      "  --version           Print the version (and the commit built) and exit\n",
      "  --help              Show this overview\n\n",
      "An upload over 4 MiB shows its progress on a terminal, elsewhere a line every "
      "$QLINEAR_PROGRESS_S\n"
      "seconds (default 10, 0: none).\n\n",
      "Run `qlinear-cli <command> --help` for the options of a command.\n",
      "Exit status: 0 ok, 1 failure (RPC error, not serving, mismatch), "
      "2 usage error (bad command line, TLS file missing or unusable).\n");
  return out;
}

const Command* find_command(const std::string& name) {
  for (const Command& c : commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

int run(int argc, char** argv) {
  std::string server = kDefaultServer;
  if (const char* env = std::getenv("QLINEAR_SERVER"); env != nullptr && *env != '\0') {
    server = env;
  }
  // Global options come before the command; all but --tls, --version and --help take a value.
  int cmd = 1;
  bool timeout_given = false;
  while (cmd < argc && argv[cmd][0] == '-') {
    const bool timeout = std::strcmp(argv[cmd], "--timeout-s") == 0;
    timeout_given = timeout_given || timeout || std::strncmp(argv[cmd], "--timeout-s=", 12) == 0;
    bool valued = timeout;
    for (const char* flag : {"--server", "--max-message-mb", "--tls-ca", "--tls-cert", "--tls-key",
                             "--tls-server-name"}) {
      valued = valued || std::strcmp(argv[cmd], flag) == 0;
    }
    cmd += valued ? 2 : 1;
  }
  int64_t max_message_mb = 64;
  double timeout_s = kDefaultTimeoutMs / 1000.0;
  ArgParser globals(
      "qlinear-cli [--server HOST:PORT] [--max-message-mb N] [--timeout-s S] [--tls ...] <command> "
      "[options]",
      "");
  globals.add("server", &server, "Server address HOST:PORT");
  globals.add("max-message-mb", &max_message_mb, "Largest message sent or received, in MiB");
  globals.add("timeout-s", &timeout_s, "Deadline of each call, in seconds (0: none)");
  bool tls = false;
  ClientTlsFiles tls_files;
  std::string tls_server_name;
  // Defaults from the environment, as $QLINEAR_SERVER: a container's clients set them once.
  for (auto [name, value] : {std::pair{"QLINEAR_TLS_CA", &tls_files.ca_file},
                             std::pair{"QLINEAR_TLS_CERT", &tls_files.cert_file},
                             std::pair{"QLINEAR_TLS_KEY", &tls_files.key_file},
                             std::pair{"QLINEAR_TLS_SERVER_NAME", &tls_server_name}}) {
    if (const char* env = std::getenv(name); env != nullptr) *value = env;
  }
  globals.add("tls", &tls, "Connect over TLS");
  globals.add("tls-ca", &tls_files.ca_file, "PEM certificate authorities that verify the server");
  globals.add("tls-cert", &tls_files.cert_file, "PEM client certificate (mutual TLS)");
  globals.add("tls-key", &tls_files.key_file, "PEM private key of --tls-cert");
  globals.add("tls-server-name", &tls_server_name, "Name the server's certificate must bear");
  bool show_version = false;
  globals.add_action("version", &show_version, "Print the version and exit");
  if (absl::Status s = globals.parse(std::min(cmd, argc), argv, 1); !s.ok()) {
    return usage_error(s.message());
  }
  // What the parser left over before the command started with '-' without being an option
  // ("-x"): an unknown option, not one to ignore.
  if (!globals.positional().empty()) {
    return usage_error(
        absl::StrCat("unknown option ", globals.positional()[0], " (see qlinear-cli help)"));
  }
  if (show_version) {
    std::printf("qlinear-cli %s\n", version_string().c_str());
    return kExitOk;
  }
  if (max_message_mb < 1 || max_message_mb > 2047) {
    return usage_error(absl::StrCat("--max-message-mb must be in 1..2047, got ", max_message_mb));
  }
  if (!(timeout_s >= 0 && timeout_s <= 86400)) {
    return usage_error(absl::StrCat("--timeout-s must be in 0..86400 seconds, got ", timeout_s));
  }
  if (globals.help_requested()) {
    std::printf("%s", overview().c_str());
    return kExitOk;
  }
  if (cmd >= argc) {
    std::fprintf(stderr, "%s", overview().c_str());
    return kExitUsage;
  }
  std::string name = argv[cmd];
  CommandArgs args;
  args.argc = argc;
  args.argv = argv;
  args.first = cmd + 1;
  args.server = &server;
  args.max_message_mb = static_cast<int>(max_message_mb);
  // (A positive deadline under a millisecond is one millisecond, not none.)
  args.timeout = std::chrono::milliseconds(
      timeout_s > 0 ? std::max<int64_t>(1, std::llround(timeout_s * 1000)) : 0);
  args.timeout_given = timeout_given;
  if (name == "help") {
    if (cmd + 1 >= argc) {
      std::printf("%s", overview().c_str());
      return kExitOk;
    }
    const Command* c = find_command(argv[cmd + 1]);
    if (c == nullptr) {
      return usage_error(
          absl::StrCat("unknown command '", argv[cmd + 1], "' (see qlinear-cli help)"));
    }
    static char help_flag[] = "--help";
    char* help_argv[] = {argv[0], help_flag};
    args.argc = 2;
    args.argv = help_argv;
    args.first = 1;
    return c->run(args);
  }
  const Command* c = find_command(name);
  if (c == nullptr) {
    return usage_error(absl::StrCat("unknown command '", name, "' (see qlinear-cli help)"));
  }
  // Any TLS file or name implies --tls; the files are read and checked here, before any call. A
  // file that is missing or not what its flag takes is a bad command line alike (exit 2), the
  // message keeping its code (NOT_FOUND, INVALID_ARGUMENT, ...).
  if (tls || !tls_files.ca_file.empty() || !tls_files.cert_file.empty() ||
      !tls_files.key_file.empty() || !tls_server_name.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        tls_channel_credentials(tls_files);
    if (!credentials.ok()) {
      fail(credentials.status());
      return kExitUsage;
    }
    args.credentials = *std::move(credentials);
    args.tls_server_name = tls_server_name;
    set_transport(true, !tls_files.cert_file.empty());
  }
  return c->run(args);
}

}  // namespace
}  // namespace qlinear::cli

int main(int argc, char** argv) {
  // Sizes come from flags and files: one too large to allocate ends the command with its reason.
  try {
    return qlinear::cli::run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "qlinear-cli: out of memory; ask for fewer rows or a smaller layer\n");
  } catch (const std::length_error&) {
    std::fprintf(stderr,
                 "qlinear-cli: a size too large to allocate; ask for fewer rows or a "
                 "smaller layer\n");
  }
  return qlinear::cli::kExitFailure;
}
