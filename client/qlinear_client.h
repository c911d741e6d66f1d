// C++ client library for qlinear.v1: a thin, synchronous wrapper over the generated stub that
// handles chunked uploads with checksums, streams and status conversion. Thread-safe: one Client
// may be used from many threads (each call is independent; an InferStream belongs to one thread
// at a time).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "qlinear/v1/qlinear.grpc.pb.h"

namespace qlinear {

// grpc::Status -> absl::Status (the codes are the same).
absl::Status from_grpc_status(const grpc::Status& s);

// A weight_chunk message's bytes besides its chunk: the field's tag and length, with room to
// spare. A chunk of a whole message limit is sent this much short of it.
inline constexpr int64_t kChunkFramingBytes = 64;

// The largest message, in bytes, that a client of `max_message_mb` MiB sends: that limit, and
// never more than protobuf serializes (INT_MAX bytes; a larger message aborts gRPC's serializer).
int64_t max_send_bytes(int64_t max_message_mb);

// OK when `what`, a message of `bytes` (its ByteSizeLong()), fits `limit` bytes; else
// RESOURCE_EXHAUSTED naming it, its size and the limit, and `remedy` (what to do instead).
absl::Status check_message_size(absl::string_view what, size_t bytes, int64_t limit,
                                absl::string_view remedy);

struct ClientOptions {
  // The largest message sent or taken, in MiB. Every message is checked before it is sent: one
  // larger fails its call with RESOURCE_EXHAUSTED (and protobuf's own 2 GiB bound holds too).
  int max_message_mb = 64;
  // Deadline of every unary call, Infer included (0 = none). A timeout longer than the clock can
  // count from now (centuries) is none as well, never a deadline wrapped into the past.
  std::chrono::milliseconds call_timeout{0};
  // Deadline of a whole LoadLayer upload (0 = none; centuries are none, as for call_timeout).
  std::chrono::milliseconds upload_timeout{0};
  // Size of each weight_chunk in an upload: by default 1 MiB less its message's framing, so that
  // a chunk fits a server whose --max-message-mb is 1.
  int64_t upload_chunk_bytes = (int64_t{1} << 20) - kChunkFramingBytes;
  // How the channel is secured: null for plaintext, or tls_channel_credentials()'s.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Over TLS, the name the server's certificate must bear where it is not the target's host (a
  // server reached by IP address or through a tunnel); empty: the target's host.
  std::string tls_server_name;
};

// The files of a TLS client, all PEM and optional: `ca_file` the certificate authorities that
// verify the server (empty: gRPC's default roots, $GRPC_DEFAULT_SSL_ROOTS_FILE_PATH where set,
// else the system's certificate store, else the roots built into gRPC); `cert_file` and
// `key_file` the client's own certificate and key, for a server that asks for one (mutual TLS).
struct ClientTlsFiles {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// Reads and checks the files (each holds PEM of its kind, the key is the certificate's, neither
// comes without the other) and returns TLS channel credentials. Errors name the flag ("--tls-ca",
// "--tls-cert", "--tls-key") and the file.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls_channel_credentials(
    const ClientTlsFiles& files);

// A channel to `target` with `options`' credentials, server name and message sizes, on top of
// `args`.
std::shared_ptr<grpc::Channel> make_channel(const std::string& target, const ClientOptions& options,
                                            grpc::ChannelArguments args = {});

class InferStream {
 public:
  // Sends one request; false once the stream is broken (then call finish()). A request larger
  // than the client's message limit is not sent: the stream is cancelled and finish() returns
  // RESOURCE_EXHAUSTED.
  bool write(const v1::InferRequest& request);
  // Receives the next response in request order; false at the end of the stream.
  bool read(v1::InferResponse* response);
  // No more requests; responses still in flight can be read.
  bool writes_done();
  // The stream's final status (call after read() returned false).
  absl::Status finish();
  // Cancels the call.
  void cancel() { ctx_.TryCancel(); }

 private:
  friend class Client;
  grpc::ClientContext ctx_;
  std::chrono::milliseconds timeout_{0};  // the stream's deadline (0: none)
  int64_t max_send_bytes_ = 0;
  absl::Status refused_;  // a request write() did not send, for finish()
  std::unique_ptr<grpc::ClientReaderWriter<v1::InferRequest, v1::InferResponse>> rw_;
};

class Client {
 public:
  // `target` is host:port, e.g. "localhost:50051".
  explicit Client(const std::string& target, ClientOptions options = {});

  // grpc.health.v1 Check for `service` ("" = the whole server): true when SERVING.
  absl::StatusOr<bool> health(const std::string& service = "");
  absl::StatusOr<v1::ListKernelsResponse> list_kernels();
  absl::StatusOr<v1::ListLayersResponse> list_layers();
  absl::StatusOr<v1::LayerInfo> describe_layer(const std::string& name);
  absl::Status unload_layer(const std::string& name);

  // Uploads `weights` ([N, K] int8) under `header`. An empty header.weight_sha256 is filled in
  // from the bytes. `progress(sent, total)` is called after each chunk when given.
  absl::StatusOr<v1::LoadLayerResponse> load_layer(
      v1::LayerHeader header, absl::Span<const int8_t> weights,
      const std::function<void(int64_t, int64_t)>& progress = nullptr);
  // The same with a progress callback that can stop the upload: `keep_going(sent, total)` is
  // called after each chunk, and when it returns false the call is cancelled before the upload's
  // end (the server keeps nothing of it) and load_layer returns CANCELLED. Taken for any callable
  // that returns bool, so that such a lambda does not go to the overload above, which would drop
  // its answer.
  template <typename KeepGoing,
            std::enable_if_t<
                std::is_same_v<std::invoke_result_t<KeepGoing&, int64_t, int64_t>, bool>, int> = 0>
  absl::StatusOr<v1::LoadLayerResponse> load_layer(v1::LayerHeader header,
                                                   absl::Span<const int8_t> weights,
                                                   KeepGoing&& keep_going) {
    return upload(std::move(header), weights,
                  std::function<bool(int64_t, int64_t)>(std::forward<KeepGoing>(keep_going)));
  }

  // `timeout` 0: the options' call_timeout (centuries: none). A request larger than the message
  // limit is RESOURCE_EXHAUSTED, unsent.
  absl::StatusOr<v1::InferResponse> infer(const v1::InferRequest& request,
                                          std::chrono::milliseconds timeout = {});
  // A stream that ends with DEADLINE_EXCEEDED after `timeout` (0 or centuries: none).
  std::unique_ptr<InferStream> open_stream(std::chrono::milliseconds timeout = {});

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  v1::QLinear::Stub& stub() { return *stub_; }

 private:
  void prepare(grpc::ClientContext* ctx) const;
  // Both load_layer()s: `keep_going` may be null.
  absl::StatusOr<v1::LoadLayerResponse> upload(
      v1::LayerHeader header, absl::Span<const int8_t> weights,
      const std::function<bool(int64_t, int64_t)>& keep_going);
  // check_message_size() against this client's limit.
  absl::Status check_size(const google::protobuf::Message& msg, absl::string_view what,
                          absl::string_view remedy) const;
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::QLinear::Stub> stub_;
};

}  // namespace qlinear
