#include "server/tls.h"

#include <grpcpp/security/server_credentials.h>

#include "absl/strings/str_cat.h"
#include "common/pem.h"

namespace qlinear {

absl::Status check_server_tls_flags(const ServerTlsOptions& tls) {
  if (!tls.enabled() && !tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca needs --tls-cert and --tls-key (client certificates are asked for over "
        "TLS only)");
  }
  if (tls.enabled() && (tls.cert_file.empty() || tls.key_file.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(tls.cert_file.empty() ? "--tls-key" : "--tls-cert", " needs ",
                     tls.cert_file.empty() ? "--tls-cert" : "--tls-key",
                     ": TLS takes the server's certificate and its private key"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerCredentials> make_server_credentials(const ServerTlsOptions& tls) {
  if (absl::Status s = check_server_tls_flags(tls); !s.ok()) return s;
  if (!tls.enabled()) {
    return ServerCredentials{grpc::InsecureServerCredentials(), "plaintext, no TLS"};
  }
  absl::StatusOr<PemIdentity> identity = read_pem_identity(tls.cert_file, tls.key_file);
  if (!identity.ok()) return identity.status();
  const PemCertificates* cert = &identity->certificates;
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({identity->key, cert->pem});
  std::string clients = "no client certificates asked for";
  if (!tls.client_ca_file.empty()) {
    absl::StatusOr<PemCertificates> ca =
        read_pem_certificates("--tls-client-ca", tls.client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = ca->pem;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    clients = absl::StrCat("client certificates required, issued by ", tls.client_ca_file, " (",
                           ca->count, " certificate", ca->count == 1 ? "" : "s", ")");
  }
  ServerCredentials out;
  out.credentials = grpc::SslServerCredentials(options);
  out.certificate_expiry_unix = cert->not_after_unix;
  out.summary = absl::StrCat(
      "TLS with ", cert->subject.empty() ? "a certificate" : cert->subject, " (",
      cert->count == 1
          ? "no intermediates"
          : absl::StrCat(cert->count - 1, " intermediate", cert->count == 2 ? "" : "s"),
      cert->expired ? "; EXPIRED on " : "; valid until ", cert->not_after, "); ", clients);
  return out;
}

}  // namespace qlinear
