// Shared pieces of qlinear-cli: exit codes, error reporting, subcommand option parsing, the
// conversions between the wire enums and their command-line names, and plain-text tables.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/qlinear_client.h"
#include "common/args.h"
#include "common/random.h"
#include "kernels/core/dtype.h"
#include "kernels/core/layer.h"
#include "qlinear/v1/qlinear.pb.h"

namespace qlinear::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // an RPC failed, the server is not serving, a mismatch
inline constexpr int kExitUsage = 2;    // bad command line

inline constexpr char kDefaultServer[] = "localhost:50051";
inline constexpr int64_t kDefaultTimeoutMs = 60000;

// What every subcommand receives: its own arguments argv[first..argc) and the global settings.
struct CommandArgs {
  int argc = 0;
  char** argv = nullptr;
  int first = 0;
  std::string* server = nullptr;  // HOST:PORT; a subcommand's --server overrides it
  int max_message_mb = 64;        // the largest message the client sends or takes, in MiB
  // --timeout-s: each call's deadline (0: none); an upload's only where given.
  std::chrono::milliseconds timeout{kDefaultTimeoutMs};
  bool timeout_given = false;
  // --tls and its files: null for plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string tls_server_name;  // --tls-server-name
};

using CommandFn = int (*)(const CommandArgs&);

struct Command {
  const char* name;
  const char* summary;
  CommandFn run;
};

// The subcommands, in the order the overview lists them.
const std::vector<Command>& commands();

int cmd_health(const CommandArgs& args);
int cmd_kernels(const CommandArgs& args);
int cmd_layers(const CommandArgs& args);
int cmd_describe(const CommandArgs& args);
int cmd_load(const CommandArgs& args);
int cmd_unload(const CommandArgs& args);
int cmd_manifest(const CommandArgs& args);
int cmd_infer(const CommandArgs& args);
int cmd_smoke(const CommandArgs& args);
int cmd_bench(const CommandArgs& args);

// Prints "qlinear-cli: <CODE>: <message>" to stderr and returns kExitFailure. A connection
// refused at the TLS layer gets a hint of the likely cause, told by set_transport().
int fail(const absl::Status& status);
// How this command connects: over TLS, with a client certificate.
void set_transport(bool tls, bool client_certificate);
// Prints "qlinear-cli: INVALID_ARGUMENT: <message>" to stderr and returns kExitUsage.
int usage_error(absl::string_view message);

// Parses a subcommand's options with `parser` (to which it adds --server). Returns -1 when the
// command should run; otherwise the exit code to return (0 after printing --help, 2 on a usage
// error). `positional` names the required positional arguments (e.g. {"NAME"}); no others are
// accepted.
int parse_command_line(ArgParser& parser, const CommandArgs& args,
                       const std::vector<std::string>& positional = {});

// `options` with the global --max-message-mb, --timeout-s (an upload's deadline only where
// --timeout-s was given) and TLS settings.
ClientOptions client_options(const CommandArgs& args, ClientOptions options = {});
// A client of --server with client_options(args, options).
std::unique_ptr<Client> make_client(const CommandArgs& args, ClientOptions options = {});

// While alive, the first SIGINT (Ctrl-C) sets sigint_received() instead of ending the program,
// and a second one ends it (the default action again): for commands that stop early, clean up
// what they made on the server and report. One at a time.
class CatchSigint {
 public:
  CatchSigint();   // clears sigint_received()
  ~CatchSigint();  // the previous action again
  CatchSigint(const CatchSigint&) = delete;
  CatchSigint& operator=(const CatchSigint&) = delete;

  // The one alive, or null.
  static CatchSigint* active();
  // Gives SIGINT its previous action until resume(), which catches it again unless one came
  // meanwhile: a wait in which the command has nothing to stop or tidy, where a Ctrl-C should
  // end it at once.
  void pause();
  void resume();

 private:
  struct sigaction old_ {};
  bool installed_ = false;
  bool paused_ = false;
};
// Whether a SIGINT came while a CatchSigint was alive (async-signal-safe to read).
bool sigint_received();

// "<pid>-<8 random hex digits>": the end of the name of a layer a command uploads for itself
// (smoke's, bench's). The pid alone tells the processes of one host apart, not those of hosts or
// containers (where the CLI is often pid 1) sharing a server. Valid in a layer name.
std::string layer_name_suffix();

// Uploads larger than this show an UploadProgress line.
inline constexpr int64_t kProgressThreshold = int64_t{4} << 20;

// Seconds between an upload's progress lines where stderr is not a terminal: $QLINEAR_PROGRESS_S
// (a number of seconds, 0 for none), else 10.
inline constexpr double kDefaultProgressLogSeconds = 10;
double progress_log_seconds();

// An upload's progress on stderr: "upload NAME: 12.0 MiB / 64.0 MiB (18%), 45.1 MiB/s". On a
// terminal one line, redrawn at most every 100 ms. Elsewhere (a log, CI), where a line redrawn
// with carriage returns is noise, a whole line every progress_log_seconds() and a last one when
// the bytes are all sent, for an upload that ran that long (a shorter one prints nothing).
class UploadProgress {
 public:
  explicit UploadProgress(std::string name);
  // After each chunk: `sent` of `total` bytes.
  void update(int64_t sent, int64_t total);
  // Ends a line the upload left unfinished, so that an error printed next starts its own.
  void end_line();

 private:
  void print(int64_t sent, int64_t total, std::chrono::steady_clock::time_point now,
             const char* start, const char* end);

  const bool tty_;
  const double log_seconds_;
  bool open_line_ = false;
  std::string name_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_{};
};

// Uploads `weights` under `header` (named `name` in the progress line), with an UploadProgress
// line where they are over kProgressThreshold; a Ctrl-C caught by a CatchSigint meanwhile stops it
// (CANCELLED, nothing loaded: sigint_received() then tells why). With `end_while_built`, the
// CatchSigint pauses once every byte is sent, while the server builds the layer: a Ctrl-C then
// ends the program, and the server, its call cancelled, keeps nothing (for `load`, which has
// nothing to tidy; `smoke` and `bench` rather let the build end, then unload what they loaded).
absl::StatusOr<v1::LoadLayerResponse> upload_with_progress(Client& client, v1::LayerHeader header,
                                                           absl::Span<const int8_t> weights,
                                                           bool end_while_built = false);

// Command-line names of the wire enums: "dynamic_symmetric", "bf16", ...
std::string scheme_cli_name(v1::Scheme s);
absl::StatusOr<v1::Scheme> parse_scheme(absl::string_view name);
std::string dtype_cli_name(v1::DType t);
// "bf16" | "fp16" | "fp32" (also "bfloat16", "float16", "float32").
absl::StatusOr<v1::DType> parse_dtype(absl::string_view name);
DType core_dtype(v1::DType t);  // t must be a concrete dtype
v1::DType proto_dtype(DType t);

// "1", "2-16", ">=1025" from inclusive bounds (m_max 0 = unbounded).
std::string m_range(int64_t m_min, int64_t m_max);
// "cpu.reference (selected; cpu.avx512_vnni: <reason>; ...)": the selected kernel, then why each
// candidate before it in priority order was skipped.
std::string selection_summary(
    const google::protobuf::RepeatedPtrField<v1::CandidateVerdict>& verdicts);
// One line per candidate, in order: "<indent>name  selected" or "<indent>name  skipped: reason".
void print_selection(const google::protobuf::RepeatedPtrField<v1::CandidateVerdict>& verdicts,
                     absl::string_view indent);
// "16.0 MiB".
std::string human_bytes(int64_t bytes);
// Compact kernel choice of a layer: adjacent buckets with the same kernel are merged,
// e.g. "1-16 cuda.stream_s8, >=17 cuda.cutlass_sm90".
std::string bucket_summary(const v1::LayerInfo& info);

// x [count] uniform in [-1, 1) from `rng`, converted to `dtype` (one RNE rounding).
std::string random_activations(SplitMix64& rng, int64_t count, DType dtype);

// Left-aligned plain-text table; the last column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(FILE* out) const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace qlinear::cli
