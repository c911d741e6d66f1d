// TLS for the gRPC port: the server's certificate and key, and optionally the certificate
// authorities whose client certificates it requires (mutual TLS). The files are read and checked
// once, at start-up; a new certificate takes a restart.
#pragma once

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace qlinear {

struct ServerTlsOptions {
  std::string cert_file;       // PEM: the server's certificate, then any intermediates
  std::string key_file;        // PEM: its private key
  std::string client_ca_file;  // PEM: require client certificates issued by these; empty: none

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

struct ServerCredentials {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // For the log: "TLS with CN=server (no intermediates; valid until 2027-12-06 02:00:00 UTC);
  // client certificates required, issued by ca.pem (1 certificate)", or "plaintext, no TLS".
  std::string summary;
  int64_t certificate_expiry_unix = 0;  // the served certificate's end of validity; 0: no TLS
};

// INVALID_ARGUMENT where the flags do not go together: a certificate without its key or the
// reverse, or client CAs without TLS.
absl::Status check_server_tls_flags(const ServerTlsOptions& tls);

// Plaintext credentials when `tls` is not enabled. Otherwise reads and checks the files: the
// certificate and key are both given, each holds PEM of its kind, the key is the certificate's,
// the client CA file holds at least one certificate. INVALID_ARGUMENT (a missing flag, a file that
// is not what it should be) or NOT_FOUND / PERMISSION_DENIED (a file that cannot be read), naming
// the flag and the file.
absl::StatusOr<ServerCredentials> make_server_credentials(const ServerTlsOptions& tls);

}  // namespace qlinear
