#include "server/tls.h"

#include <grpc/grpc.h>

#include <algorithm>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

// One reading of the files, checked.
struct TlsMaterial {
  PemIdentity identity;
  PemCertificates client_cas;  // empty pem: no client certificates asked for
  std::string summary;

  bool same_files(const TlsMaterial& o) const {
    return identity.key == o.identity.key &&
           identity.certificates.pem == o.identity.certificates.pem &&
           client_cas.pem == o.client_cas.pem;
  }
};

namespace {

absl::StatusOr<std::unique_ptr<TlsMaterial>> read_material(const ServerTlsOptions& tls) {
  auto m = std::make_unique<TlsMaterial>();
  absl::StatusOr<PemIdentity> identity = read_pem_identity(tls.cert_file, tls.key_file);
  if (!identity.ok()) return identity.status();
  m->identity = *std::move(identity);
  std::string clients = "no client certificates asked for";
  if (!tls.client_ca_file.empty()) {
    absl::StatusOr<PemCertificates> ca =
        read_pem_certificates("--tls-client-ca", tls.client_ca_file);
    if (!ca.ok()) return ca.status();
    m->client_cas = *std::move(ca);
    clients =
        absl::StrCat("client certificates required, issued by ", tls.client_ca_file, " (",
                     m->client_cas.count, " certificate", m->client_cas.count == 1 ? "" : "s", ")");
  }
  const PemCertificates& cert = m->identity.certificates;
  m->summary = absl::StrCat(
      "TLS with ", cert.subject.empty() ? "a certificate" : cert.subject, " (",
      cert.count == 1 ? "no intermediates"
                      : absl::StrCat(cert.count - 1, " intermediate", cert.count == 2 ? "" : "s"),
      cert.expired ? "; EXPIRED on " : "; valid until ", cert.not_after, "); ", clients);
  return m;
}

// Why a certificate that passes the checks is still not served in place of `served`: while the
// served one is valid, a new one that has expired or is not valid yet would fail every handshake
// from the next connection on. Empty where it may be served. (A served certificate that is itself
// out of its validity is replaced by any: clients refuse it already.)
std::string outside_validity(const std::string& cert_file, const PemCertificates& next,
                             const PemCertificates& served) {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  if (served.not_before_unix > now || now > served.not_after_unix) return "";
  const std::string what = absl::StrCat("--tls-cert ", cert_file, ": its certificate (",
                                        next.subject.empty() ? "no subject" : next.subject, ")");
  if (next.expired) return absl::StrCat(what, " expired on ", next.not_after);
  if (next.not_yet_valid) return absl::StrCat(what, " is not valid before ", next.not_before);
  return "";
}

}  // namespace

absl::StatusOr<std::shared_ptr<TlsReloader>> TlsReloader::create(const ServerTlsOptions& tls) {
  if (absl::Status s = check_server_tls_flags(tls); !s.ok()) return s;
  if (!tls.enabled()) return absl::InvalidArgumentError("TLS needs --tls-cert and --tls-key");
  absl::StatusOr<std::unique_ptr<TlsMaterial>> m = read_material(tls);
  if (!m.ok()) return m.status();
  std::shared_ptr<TlsReloader> r(new TlsReloader(tls));
  absl::MutexLock lock(&r->mu_);
  r->served_ = *std::move(m);
  r->generation_ = 1;
  return r;
}

TlsReloader::TlsReloader(ServerTlsOptions tls) : tls_(std::move(tls)) {}

TlsReloader::~TlsReloader() { stop_polling(); }

void TlsReloader::stop_polling() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (poller_.joinable()) poller_.join();
}

void TlsReloader::set_listener(Listener listener) { listener_ = std::move(listener); }

std::string TlsReloader::rejection() const {
  absl::MutexLock lock(&mu_);
  return rejected_;
}

std::optional<TlsReloadEvent> TlsReloader::check_now() {
  absl::MutexLock check(&check_mu_);
  std::optional<TlsReloadEvent> e = check_locked();
  if (e.has_value() && listener_) listener_(*e);
  return e;
}

std::optional<TlsReloadEvent> TlsReloader::check_locked() {
  absl::StatusOr<std::unique_ptr<TlsMaterial>> m = read_material(tls_);
  // The certificate is read before the key: a Secret swapped in between pairs the old
  // certificate with the new key, and the next reading finds them matched.
  if (!m.ok()) m = read_material(tls_);
  absl::MutexLock lock(&mu_);
  TlsReloadEvent e;
  const bool read = m.ok();
  int64_t retry_at = 0;
  if (m.ok() && !(*m)->same_files(*served_)) {
    const PemCertificates& next = (*m)->identity.certificates;
    const std::string why = outside_validity(tls_.cert_file, next, served_->identity.certificates);
    if (!why.empty()) {
      if (!next.expired && next.not_yet_valid && next.not_before_unix > 0) {
        retry_at = next.not_before_unix + 1;
      }
      m = absl::FailedPreconditionError(why);
    }
  }
  // (A reading that failed keeps a retry set before: the files may still hold that certificate.)
  if (read && retry_at != retry_at_unix_) {
    retry_at_unix_ = retry_at;
    retry_changed_ = true;
  }
  if (!m.ok()) {
    const std::string why(m.status().message());
    if (why == rejected_) return std::nullopt;
    rejected_ = why;
    e.kind = TlsReloadEvent::kRejected;
    e.message = why;
  } else if ((*m)->same_files(*served_)) {
    if (rejected_.empty()) return std::nullopt;
    rejected_.clear();
    e.kind = TlsReloadEvent::kRestored;
    e.message = served_->summary;
  } else {
    rejected_.clear();
    served_ = *std::move(m);
    ++generation_;
    e.kind = TlsReloadEvent::kLoaded;
    e.message = served_->summary;
  }
  e.certificate_expiry_unix = served_->identity.certificates.not_after_unix;
  return e;
}

absl::Status TlsReloader::start_polling(absl::Duration interval) try {
  poller_ = std::thread([this, interval] {
    absl::Time next_poll = absl::Now() + interval;
    absl::Time last_retry = absl::InfinitePast();
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        const absl::Time poll =
            interval > absl::ZeroDuration() ? next_poll : absl::InfiniteFuture();
        // (A retry that finds the certificate still not valid waits a second for the next.)
        const absl::Time retry =
            retry_at_unix_ > 0
                ? std::max(absl::FromUnixSeconds(retry_at_unix_), last_retry + absl::Seconds(1))
                : absl::InfiniteFuture();
        // (An infinite deadline waits for the condition alone.)
        const bool woken = mu_.AwaitWithDeadline(absl::Condition(this, &TlsReloader::poller_wakes),
                                                 std::min(poll, retry));
        if (stop_) return;
        if (woken) {  // a retry time set or cleared by a check: wait again with it
          retry_changed_ = false;
          continue;
        }
        const absl::Time now = absl::Now();
        if (now >= retry) last_retry = now;
        if (now >= next_poll) next_poll = now + interval;
      }
      check_now();
    }
  });
  return absl::OkStatus();
} catch (const std::system_error& e) {
  return absl::ResourceExhaustedError(
      absl::StrCat("the TLS files' reloading thread could not be started (", e.what(), ")"));
}

std::string TlsReloader::summary() const {
  absl::MutexLock lock(&mu_);
  return served_->summary;
}

int64_t TlsReloader::certificate_expiry_unix() const {
  absl::MutexLock lock(&mu_);
  return served_->identity.certificates.not_after_unix;
}

grpc_ssl_certificate_config_reload_status TlsReloader::fetch(
    void* self, grpc_ssl_server_certificate_config** config) {
  auto* r = static_cast<TlsReloader*>(self);
  absl::MutexLock lock(&r->mu_);
  // gRPC asks once when the port is added (one port, one ask that must answer) and then at every
  // new connection: the set is built only when it is new to gRPC.
  if (r->delivered_ == r->generation_) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  const TlsMaterial& m = *r->served_;
  grpc_ssl_pem_key_cert_pair pair{m.identity.key.c_str(), m.identity.certificates.pem.c_str()};
  // gRPC asserts that a fetched set has client CAs. Without --tls-client-ca no client certificate
  // is asked for, so none is checked against them: the server's own chain stands in.
  const std::string& cas =
      m.client_cas.pem.empty() ? m.identity.certificates.pem : m.client_cas.pem;
  *config = grpc_ssl_server_certificate_config_create(cas.c_str(), &pair, 1);
  if (*config == nullptr) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
  r->delivered_ = r->generation_;
  return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

namespace {

// grpc::ServerCredentials over C-core credentials whose certificates come from a TlsReloader
// (grpc_ssl_server_credentials_create_options_using_config_fetcher, which gRPC's C++ API does not
// wrap). The server adds its port through AddPortToServer.
class FetchingServerCredentials final : public grpc::ServerCredentials {
 public:
  // (Made after the base class has initialised gRPC.)
  FetchingServerCredentials(grpc_ssl_client_certificate_request_type clients,
                            grpc_ssl_server_certificate_config_callback fetch,
                            std::shared_ptr<TlsReloader> reloader)
      : c_(grpc_ssl_server_credentials_create_with_options(
            grpc_ssl_server_credentials_create_options_using_config_fetcher(clients, fetch,
                                                                            reloader.get()))),
        reloader_(std::move(reloader)) {}
  ~FetchingServerCredentials() override { grpc_server_credentials_release(c_); }

  // (No server of this project sets one.)
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), c_);
  }

  grpc_server_credentials* const c_;
  const std::shared_ptr<TlsReloader> reloader_;  // the callback's data lives as long as these
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> TlsReloader::credentials() {
  return std::make_shared<FetchingServerCredentials>(
      tls_.client_ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                  : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
      &TlsReloader::fetch, shared_from_this());
}

absl::StatusOr<ServerCredentials> make_server_credentials(const ServerTlsOptions& tls) {
  if (absl::Status s = check_server_tls_flags(tls); !s.ok()) return s;
  if (!tls.enabled()) {
    return ServerCredentials{grpc::InsecureServerCredentials(), "plaintext, no TLS", 0, nullptr};
  }
  absl::StatusOr<std::shared_ptr<TlsReloader>> reloader = TlsReloader::create(tls);
  if (!reloader.ok()) return reloader.status();
  ServerCredentials out;
  out.reloader = *std::move(reloader);
  out.credentials = out.reloader->credentials();
  out.summary = out.reloader->summary();
  out.certificate_expiry_unix = out.reloader->certificate_expiry_unix();
  return out;
}

}  // namespace qlinear
