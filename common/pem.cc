#include "common/pem.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/npy.h"

namespace qlinear {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

Bio memory_bio(const std::string& bytes) {
  return Bio(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

// OpenSSL's last error as text (and its queue cleared).
std::string openssl_error() {
  const unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

absl::StatusOr<std::string> read_named(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> bytes = read_file(path);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(), absl::StrCat(flag, ": ", bytes.status().message()));
  }
  return bytes;
}

std::string x509_name(const X509_NAME* name) {
  Bio out(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(out.get(), name, 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// `t` as "2027-12-06 02:00:00 UTC" into *text and as Unix time into *unix_seconds (0 where
// unreadable).
void read_time(const ASN1_TIME* t, std::string* text, int64_t* unix_seconds) {
  std::tm tm{};
  if (ASN1_TIME_to_tm(t, &tm) == 1) {
    char buf[64];
    std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
    *text = buf;
    *unix_seconds = timegm(&tm);
  } else {
    *text = "an unreadable date";
    *unix_seconds = 0;
  }
}

// The private key in `pem`, or null. An empty passphrase: an encrypted key fails here instead of
// prompting on the terminal.
Pkey parse_private_key(const std::string& pem) {
  static char kNoPassphrase[] = "";
  Bio bio = memory_bio(pem);
  return Pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, kNoPassphrase));
}

}  // namespace

absl::StatusOr<PemCertificates> read_pem_certificates(absl::string_view flag,
                                                      const std::string& path) {
  PemCertificates out;
  absl::StatusOr<std::string> bytes = read_named(flag, path);
  if (!bytes.ok()) return bytes.status();
  out.pem = *std::move(bytes);
  Bio bio = memory_bio(out.pem);
  ERR_clear_error();
  for (;;) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) {
      // The end of the file, or a block that is not a certificate or does not parse.
      const unsigned long e = ERR_peek_last_error();
      const bool no_more =
          ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
      if (out.count > 0 && no_more) break;
      if (out.count == 0 && no_more) {
        ERR_clear_error();
        return absl::InvalidArgumentError(absl::StrCat(
            flag, ": ", path, " holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
      }
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, ": certificate ",
                                                     out.count + 1, " does not parse (",
                                                     openssl_error(), ")"));
    }
    if (out.count == 0) {
      out.subject = x509_name(X509_get_subject_name(cert.get()));
      const ASN1_TIME* not_after = X509_get0_notAfter(cert.get());
      read_time(not_after, &out.not_after, &out.not_after_unix);
      out.expired = X509_cmp_current_time(not_after) < 0;
      const ASN1_TIME* not_before = X509_get0_notBefore(cert.get());
      read_time(not_before, &out.not_before, &out.not_before_unix);
      out.not_yet_valid = X509_cmp_current_time(not_before) > 0;
    }
    ++out.count;
  }
  ERR_clear_error();
  return out;
}

absl::StatusOr<std::string> read_pem_private_key(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> bytes = read_named(flag, path);
  if (!bytes.ok()) return bytes.status();
  ERR_clear_error();
  if (parse_private_key(*bytes) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path,
                     " holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----, "
                     "or RSA / EC PRIVATE KEY): ",
                     openssl_error()));
  }
  ERR_clear_error();
  return bytes;
}

namespace {

// INVALID_ARGUMENT unless `key_pem` is the private key of the first certificate in `cert_pem`.
absl::Status check_key_matches_certificate(const std::string& cert_pem,
                                           const std::string& key_pem) {
  Bio cert_bio = memory_bio(cert_pem);
  X509Ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  Pkey key = parse_private_key(key_pem);
  if (cert == nullptr || key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("the certificate or the key does not parse");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("the key is not the certificate's (its public key differs)");
  }
  return absl::OkStatus();
}

// What the TLS library refuses of a pair that parses and matches, as gRPC's handshaker would
// refuse it: a key too weak for OpenSSL's security level (RSA under 2048 bits at Debian's default
// level), a signature digest it no longer accepts.
absl::Status check_tls_accepts(const std::string& cert_pem, const std::string& key_pem) {
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_server_method()));
  Bio cert_bio = memory_bio(cert_pem);
  X509Ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  Pkey key = parse_private_key(key_pem);
  if (ctx == nullptr || cert == nullptr || key == nullptr) {
    ERR_clear_error();
    return absl::InternalError("cannot set up an OpenSSL TLS context");
  }
  if (SSL_CTX_use_certificate(ctx.get(), cert.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("OpenSSL's TLS library refuses the certificate (", openssl_error(), ")"));
  }
  if (SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("OpenSSL's TLS library refuses the key (", openssl_error(), ")"));
  }
  ERR_clear_error();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PemIdentity> read_pem_identity(const std::string& cert_file,
                                              const std::string& key_file) {
  PemIdentity out;
  absl::StatusOr<PemCertificates> certificates = read_pem_certificates("--tls-cert", cert_file);
  if (!certificates.ok()) return certificates.status();
  out.certificates = *std::move(certificates);
  absl::StatusOr<std::string> key = read_pem_private_key("--tls-key", key_file);
  if (!key.ok()) return key.status();
  out.key = *std::move(key);
  if (absl::Status s = check_key_matches_certificate(out.certificates.pem, out.key); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key ", key_file, " does not match --tls-cert ", cert_file, ": ", s.message()));
  }
  if (absl::Status s = check_tls_accepts(out.certificates.pem, out.key); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--tls-cert ", cert_file, " and --tls-key ",
                                               key_file, ": ", s.message()));
  }
  return out;
}

}  // namespace qlinear
