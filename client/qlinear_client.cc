#include "client/qlinear_client.h"

#include <google/protobuf/io/coded_stream.h>

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/pem.h"
#include "common/sha256.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kernels/core/status.h"

namespace qlinear {

absl::Status from_grpc_status(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

int64_t max_send_bytes(int64_t max_message_mb) {
  // (Clamped before the shift: 4096 MiB is past INT_MAX already.)
  return std::min<int64_t>(std::clamp<int64_t>(max_message_mb, 0, 4096) << 20, INT_MAX);
}

absl::Status check_message_size(absl::string_view what, size_t bytes, int64_t limit,
                                absl::string_view remedy) {
  if (bytes <= static_cast<uint64_t>(std::max<int64_t>(limit, 0))) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " is ", bytes, " bytes, over the ", limit, " bytes a message may have",
                   limit >= INT_MAX ? " (protobuf's bound)" : "", "; ", remedy));
}

namespace {

// What to do about a request too large to send.
constexpr absl::string_view kFewerRows =
    "send fewer rows per request, or raise --max-message-mb (on the server too)";

// Sets the call's deadline `timeout` from now (0: none). A timeout past the latest time the
// clock holds (centuries away) is none too: now + timeout would wrap around into the past, and
// every call would fail at once with DEADLINE_EXCEEDED.
void set_timeout(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return;
  const auto now = std::chrono::system_clock::now();
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::time_point::max() - now);
  if (timeout >= room) return;
  ctx->set_deadline(now + timeout);
}

// A failed call's status; one past its deadline says which deadline that was.
absl::Status call_status(const grpc::Status& s, std::chrono::milliseconds deadline) {
  if (s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED || deadline.count() <= 0) {
    return from_grpc_status(s);
  }
  return absl::DeadlineExceededError(absl::StrCat("no answer within the call's deadline of ",
                                                  absl::FormatDuration(absl::FromChrono(deadline)),
                                                  " (", s.error_message(), ")"));
}

}  // namespace

bool InferStream::write(const v1::InferRequest& request) {
  if (!refused_.ok()) return false;
  refused_ =
      check_message_size(absl::StrCat("request '", request.request_id(), "' (M=", request.m(), ")"),
                         request.ByteSizeLong(), max_send_bytes_, kFewerRows);
  if (!refused_.ok()) {
    ctx_.TryCancel();
    return false;
  }
  return rw_->Write(request);
}
bool InferStream::read(v1::InferResponse* response) { return rw_->Read(response); }
bool InferStream::writes_done() { return rw_->WritesDone(); }
absl::Status InferStream::finish() {
  const grpc::Status s = rw_->Finish();
  return refused_.ok() ? call_status(s, timeout_) : refused_;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls_channel_credentials(
    const ClientTlsFiles& files) {
  grpc::SslCredentialsOptions options;
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.cert_file.empty() ? "--tls-key" : "--tls-cert", " needs ",
                     files.cert_file.empty() ? "--tls-cert" : "--tls-key",
                     ": a client certificate goes with its private key"));
  }
  if (!files.ca_file.empty()) {
    absl::StatusOr<PemCertificates> ca = read_pem_certificates("--tls-ca", files.ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = ca->pem;
  }
  if (!files.cert_file.empty()) {
    absl::StatusOr<PemIdentity> identity = read_pem_identity(files.cert_file, files.key_file);
    if (!identity.ok()) return identity.status();
    options.pem_cert_chain = identity->certificates.pem;
    options.pem_private_key = identity->key;
  }
  return grpc::SslCredentials(options);
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& target, const ClientOptions& options,
                                            grpc::ChannelArguments args) {
  const int limit = static_cast<int>(max_send_bytes(options.max_message_mb));
  args.SetMaxReceiveMessageSize(limit);
  args.SetMaxSendMessageSize(limit);
  if (options.credentials != nullptr && !options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(
      target,
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials(),
      args);
}

Client::Client(const std::string& target, ClientOptions options) : options_(options) {
  channel_ = make_channel(target, options_);
  stub_ = v1::QLinear::NewStub(channel_);
}

void Client::prepare(grpc::ClientContext* ctx) const { set_timeout(ctx, options_.call_timeout); }

absl::Status Client::check_size(const google::protobuf::Message& msg, absl::string_view what,
                                absl::string_view remedy) const {
  return check_message_size(what, msg.ByteSizeLong(), max_send_bytes(options_.max_message_mb),
                            remedy);
}

absl::StatusOr<bool> Client::health(const std::string& service) {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  RETURN_IF_ERROR(check_size(req, "the health check request", "name a shorter service"));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::ClientContext ctx;
  prepare(&ctx);
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return call_status(s, options_.call_timeout);
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

absl::StatusOr<v1::ListKernelsResponse> Client::list_kernels() {
  grpc::ClientContext ctx;
  prepare(&ctx);
  v1::ListKernelsResponse resp;
  grpc::Status s = stub_->ListKernels(&ctx, v1::ListKernelsRequest(), &resp);
  if (!s.ok()) return call_status(s, options_.call_timeout);
  return resp;
}

absl::StatusOr<v1::ListLayersResponse> Client::list_layers() {
  grpc::ClientContext ctx;
  prepare(&ctx);
  v1::ListLayersResponse resp;
  grpc::Status s = stub_->ListLayers(&ctx, v1::ListLayersRequest(), &resp);
  if (!s.ok()) return call_status(s, options_.call_timeout);
  return resp;
}

absl::StatusOr<v1::LayerInfo> Client::describe_layer(const std::string& name) {
  grpc::ClientContext ctx;
  prepare(&ctx);
  v1::DescribeLayerRequest req;
  req.set_name(name);
  RETURN_IF_ERROR(check_size(req, "the DescribeLayer request", "name a shorter layer"));
  v1::LayerInfo resp;
  grpc::Status s = stub_->DescribeLayer(&ctx, req, &resp);
  if (!s.ok()) return call_status(s, options_.call_timeout);
  return resp;
}

absl::Status Client::unload_layer(const std::string& name) {
  grpc::ClientContext ctx;
  prepare(&ctx);
  v1::UnloadLayerRequest req;
  req.set_name(name);
  RETURN_IF_ERROR(check_size(req, "the UnloadLayer request", "name a shorter layer"));
  v1::UnloadLayerResponse resp;
  return call_status(stub_->UnloadLayer(&ctx, req, &resp), options_.call_timeout);
}

absl::StatusOr<v1::LoadLayerResponse> Client::load_layer(
    v1::LayerHeader header, absl::Span<const int8_t> weights,
    const std::function<void(int64_t, int64_t)>& progress) {
  if (!progress) return upload(std::move(header), weights, nullptr);
  return upload(std::move(header), weights, [&progress](int64_t sent, int64_t total) {
    progress(sent, total);
    return true;
  });
}

absl::StatusOr<v1::LoadLayerResponse> Client::upload(
    v1::LayerHeader header, absl::Span<const int8_t> weights,
    const std::function<bool(int64_t, int64_t)>& keep_going) {
  if (header.weight_sha256().empty()) {
    header.set_weight_sha256(sha256_hex(weights.data(), weights.size()));
  }
  // Both kinds of message are checked before the upload starts: the header carries the weight
  // scale and the bias ([N] each), a chunk its bytes.
  v1::LoadLayerRequest msg;
  *msg.mutable_header() = std::move(header);
  RETURN_IF_ERROR(check_size(
      msg, "the LoadLayer header (the layer's settings, weight scale and bias)",
      "raise --max-message-mb (on the server too), or load a layer of fewer output features"));
  const int64_t total = static_cast<int64_t>(weights.size());
  const int64_t chunk = std::max<int64_t>(1, options_.upload_chunk_bytes);
  if (total > 0) {
    // A chunk's message: the field's tag (one byte), its length and its bytes.
    const uint64_t len = static_cast<uint64_t>(std::min(chunk, total));
    RETURN_IF_ERROR(check_message_size(
        "a LoadLayer weight chunk",
        1 + google::protobuf::io::CodedOutputStream::VarintSize64(len) + len,
        max_send_bytes(options_.max_message_mb), "upload in smaller chunks (--chunk-mb)"));
  }
  const std::string name = msg.header().name();
  grpc::ClientContext ctx;
  set_timeout(&ctx, options_.upload_timeout);
  v1::LoadLayerResponse resp;
  auto writer = stub_->LoadLayer(&ctx, &resp);
  bool ok = writer->Write(msg);
  for (int64_t off = 0; ok && off < total; off += chunk) {
    const int64_t len = std::min(chunk, total - off);
    msg.set_weight_chunk(reinterpret_cast<const char*>(weights.data()) + off,
                         static_cast<size_t>(len));
    ok = writer->Write(msg);
    if (ok && keep_going && !keep_going(off + len, total)) {
      // Cancelled before WritesDone: the server sees an upload that never ended and drops it,
      // even when every byte was sent.
      ctx.TryCancel();
      writer->Finish();
      return absl::CancelledError(absl::StrCat("the upload of layer '", name,
                                               "' was stopped after ", off + len, " of ", total,
                                               " bytes; nothing was loaded"));
    }
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!s.ok()) return call_status(s, options_.upload_timeout);
  return resp;
}

absl::StatusOr<v1::InferResponse> Client::infer(const v1::InferRequest& request,
                                                std::chrono::milliseconds timeout) {
  RETURN_IF_ERROR(
      check_size(request, absl::StrCat("the request (M=", request.m(), ")"), kFewerRows));
  grpc::ClientContext ctx;
  if (timeout.count() == 0) timeout = options_.call_timeout;
  set_timeout(&ctx, timeout);
  v1::InferResponse resp;
  grpc::Status s = stub_->Infer(&ctx, request, &resp);
  if (!s.ok()) return call_status(s, timeout);
  return resp;
}

std::unique_ptr<InferStream> Client::open_stream(std::chrono::milliseconds timeout) {
  std::unique_ptr<InferStream> st(new InferStream);
  set_timeout(&st->ctx_, timeout);
  st->timeout_ = timeout;
  st->max_send_bytes_ = max_send_bytes(options_.max_message_mb);
  st->rw_ = stub_->InferStream(&st->ctx_);
  return st;
}

}  // namespace qlinear
