// TLS for the gRPC port: the server's certificate and key, and optionally the certificate
// authorities whose client certificates it requires (mutual TLS). The files are read and checked
// at start-up, and again whenever TlsReloader is asked (every --tls-reload-interval-s): a new set
// that passes the same checks is served from the next connection on, one that does not is logged
// and the set already served kept, so that a rotation cannot take the port down.
#pragma once

#include <grpc/grpc_security.h>
#include <grpcpp/security/server_credentials.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace qlinear {

struct ServerTlsOptions {
  std::string cert_file;       // PEM: the server's certificate, then any intermediates
  std::string key_file;        // PEM: its private key
  std::string client_ca_file;  // PEM: require client certificates issued by these; empty: none

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// What a check of the TLS files found, when it changed anything.
struct TlsReloadEvent {
  enum Kind {
    kLoaded,    // a new set passed the checks: served from the next connection on
    kRejected,  // the files changed but fail the checks: the served set is kept
    kRestored,  // after a rejection, the files hold the served set again
  };
  Kind kind = kLoaded;
  // kLoaded: what is served now (as ServerCredentials::summary); kRejected: why not (naming the
  // flag and the file, as at start-up).
  std::string message;
  int64_t certificate_expiry_unix = 0;  // the served certificate's, after the event
};

struct TlsMaterial;  // one reading of the files, checked (tls.cc)

// Reads the TLS files again on request, and keeps what gRPC serves to new connections. Shared by
// the credentials it feeds (gRPC asks it at each new connection) and by whoever polls it.
class TlsReloader : public std::enable_shared_from_this<TlsReloader> {
 public:
  using Listener = std::function<void(const TlsReloadEvent&)>;

  // Reads and checks the files as make_server_credentials does (with its errors).
  static absl::StatusOr<std::shared_ptr<TlsReloader>> create(const ServerTlsOptions& tls);
  ~TlsReloader();

  // Reads and checks the files. Where they hold a set other than the served one and pass the
  // start-up checks, it is served from the next connection on (kLoaded). Where they fail them
  // (twice in a row: a rotation that lands between the reads of the certificate and of the key
  // is read again at once), the served set stays (kRejected, reported once for as long as the
  // reason stays the same). nullopt: nothing changed. Calls are serialised, and each event is
  // told to the listener (set_listener) before the next check starts, so events arrive in order.
  std::optional<TlsReloadEvent> check_now();

  // Whom check_now tells of its events (set before any check: not thread-safe against them).
  void set_listener(Listener listener);
  // Why the files on disk are not served, while a rejection stands (empty otherwise).
  std::string rejection() const;

  // Calls check_now every `interval` on a thread of its own, until stop_polling or destruction,
  // and also (`interval` zero too) once a certificate rejected only for not being valid yet
  // becomes valid: a renewal issued with a start a little ahead of this host's clock is then
  // served from its start. Once only. RESOURCE_EXHAUSTED where the thread cannot be started.
  absl::Status start_polling(absl::Duration interval);
  // Ends the polling thread (joined: no event is told after it returns).
  void stop_polling();

  // What is served: its summary (as ServerCredentials::summary) and its certificate's end of
  // validity (Unix time).
  std::string summary() const;
  int64_t certificate_expiry_unix() const;

  // gRPC credentials that serve what this holds, asking it again at each new connection. Made
  // once, for one port; this must outlive every gRPC server given them.
  std::shared_ptr<grpc::ServerCredentials> credentials();

 private:
  explicit TlsReloader(ServerTlsOptions tls);
  std::optional<TlsReloadEvent> check_locked();  // check_now's reading, under check_mu_
  // gRPC's certificate-config callback: the served set where gRPC does not have it yet.
  static grpc_ssl_certificate_config_reload_status fetch(
      void* self, grpc_ssl_server_certificate_config** config);

  const ServerTlsOptions tls_;
  absl::Mutex check_mu_;  // one check_now at a time, so that an older reading never wins
  Listener listener_;
  mutable absl::Mutex mu_;
  std::unique_ptr<TlsMaterial> served_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // of served_
  uint64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;   // the generation gRPC has
  std::string rejected_ ABSL_GUARDED_BY(mu_);     // the last rejection reported; empty: none
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Where the files hold a certificate rejected only for not being valid yet: when it becomes
  // valid (Unix time), for the polling thread to read them again then; 0: none.
  int64_t retry_at_unix_ ABSL_GUARDED_BY(mu_) = 0;
  bool retry_changed_ ABSL_GUARDED_BY(mu_) = false;  // wakes the polling thread to recompute
  bool poller_wakes() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || retry_changed_; }
  std::thread poller_;
};

struct ServerCredentials {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // For the log: "TLS with CN=server (no intermediates; valid until 2027-12-06 02:00:00 UTC);
  // client certificates required, issued by ca.pem (1 certificate)", or "plaintext, no TLS".
  std::string summary;
  int64_t certificate_expiry_unix = 0;  // the served certificate's end of validity; 0: no TLS
  // With TLS: what rereads the files. It must outlive every gRPC server given `credentials`.
  std::shared_ptr<TlsReloader> reloader;
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
