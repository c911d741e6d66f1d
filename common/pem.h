// PEM files for TLS, read and checked before gRPC is given them, so that a wrong file is named at
// start-up rather than found at the first handshake.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlinear {

struct PemCertificates {
  std::string pem;  // the file's contents
  int count = 0;    // certificates in it (at least 1)
  // The first certificate's subject ("CN=server,O=..."), its end of validity
  // ("2027-12-06 02:00:00 UTC") and whether that has passed, and its start of validity and
  // whether that is still to come (as of the reading).
  std::string subject;
  std::string not_after;
  int64_t not_after_unix = 0;  // the same, as Unix time (0 where the date cannot be read)
  bool expired = false;
  std::string not_before;
  int64_t not_before_unix = 0;  // the same, as Unix time (0 where the date cannot be read)
  bool not_yet_valid = false;
};

// Reads `path`, given by `flag` (for messages: "--tls-cert"), which must hold one or more PEM
// certificates (the server's first, then its intermediates). PEM blocks of other kinds are
// skipped, as gRPC skips them: a file holding a key and its certificate serves as both. Errors name
// the flag and the path: NOT_FOUND /
// PERMISSION_DENIED where it cannot be read, INVALID_ARGUMENT where it holds no certificate or one
// that does not parse.
absl::StatusOr<PemCertificates> read_pem_certificates(absl::string_view flag,
                                                      const std::string& path);

// Reads `path` (given by `flag`), which must hold one PEM private key (PKCS#8, RSA or EC; not
// encrypted).
absl::StatusOr<std::string> read_pem_private_key(absl::string_view flag, const std::string& path);

// A certificate chain and its private key, as --tls-cert and --tls-key give them.
struct PemIdentity {
  PemCertificates certificates;
  std::string key;
};

// Reads both (as above, the flags named "--tls-cert" and "--tls-key") and checks that the key is
// the first certificate's and that OpenSSL's TLS library takes them (INVALID_ARGUMENT naming both
// files where it does not: an RSA key under 2048 bits, say, at Debian's default security level).
absl::StatusOr<PemIdentity> read_pem_identity(const std::string& cert_file,
                                              const std::string& key_file);

}  // namespace qlinear
