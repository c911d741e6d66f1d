// TLS on the gRPC port: a server with a certificate answers TLS clients that trust its issuer and
// no others; with client CAs (mutual TLS) it answers only clients whose certificate they issued;
// wrong files fail the start-up (or the client's set-up), named; files rotated while it runs are
// served from the next connection on, and files that fail the checks (or, while the served
// certificate is valid, hold one that has expired or is not valid yet) leave the served set in
// place. The certificates are made here, fresh for each run, with OpenSSL.
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "client/qlinear_client.h"
#include "common/pem.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace qlinear {
namespace {

struct Issued {
  std::string cert_file, key_file;
};

// Makes certificates in a directory of its own: each signed by its CA (or by itself), with an EC
// P-256 key (or an RSA key of rsa_bits, where set).
class CertificateMaker {
 public:
  explicit CertificateMaker(std::string dir) : dir_(std::move(dir)) {}

  // A self-signed certificate authority.
  Issued make_ca(const std::string& name) { return issue(name, name, {}, nullptr, true, 1); }

  // A certificate for `cn`, issued by `ca`, with `dns_names` as its subject alternative names,
  // valid for `days` (negative: it ended that many days ago).
  Issued make_leaf(const std::string& name, const std::string& cn, const std::string& san,
                   const Issued& ca, int days = 1) {
    return issue(name, cn, san, &ca, false, days);
  }

  unsigned rsa_bits = 0;
  // Where positive, certificates made from now on become valid this many days from now (and end
  // `days` after that).
  int starts_in_days = 0;
  // Likewise in seconds (where starts_in_days is not set).
  int starts_in_seconds = 0;

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // Replaces `path` with `text` in one step (a new file renamed over it), as a rotation does.
  static void replace(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".new";
    std::ofstream(tmp) << text;
    ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0) << path;
  }
  static std::string contents(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  Issued issue(const std::string& name, const std::string& cn, const std::string& san,
               const Issued* ca, bool is_ca, int days) {
    EVP_PKEY* key = rsa_bits > 0 ? EVP_RSA_gen(rsa_bits) : EVP_EC_gen("P-256");
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), ++serial_);
    if (starts_in_days > 0) {
      X509_gmtime_adj(X509_getm_notBefore(cert), 86400L * starts_in_days);
      X509_gmtime_adj(X509_getm_notAfter(cert), 86400L * (starts_in_days + days));
    } else if (starts_in_seconds > 0) {
      X509_gmtime_adj(X509_getm_notBefore(cert), starts_in_seconds);
      X509_gmtime_adj(X509_getm_notAfter(cert), starts_in_seconds + 86400L * days);
    } else if (days >= 0) {
      X509_gmtime_adj(X509_getm_notBefore(cert), -60);
      X509_gmtime_adj(X509_getm_notAfter(cert), 86400L * days);
    } else {
      X509_gmtime_adj(X509_getm_notBefore(cert), 86400L * (days - 1));
      X509_gmtime_adj(X509_getm_notAfter(cert), 86400L * days);
    }
    X509_set_pubkey(cert, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
    X509* issuer_cert = cert;
    EVP_PKEY* issuer_key = key;
    if (ca != nullptr) {
      issuer_cert = read_cert(ca->cert_file);
      issuer_key = read_key(ca->key_file);
    }
    X509_set_issuer_name(cert, X509_get_subject_name(issuer_cert));
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer_cert, cert, nullptr, nullptr, 0);
    add_extension(cert, &ctx, NID_basic_constraints, is_ca ? "critical,CA:TRUE" : "CA:FALSE");
    if (is_ca) add_extension(cert, &ctx, NID_key_usage, "critical,keyCertSign,cRLSign");
    if (!san.empty()) add_extension(cert, &ctx, NID_subject_alt_name, san);
    X509_sign(cert, issuer_key, EVP_sha256());

    Issued out{dir_ + "/" + name + ".pem", dir_ + "/" + name + ".key"};
    FILE* f = std::fopen(out.cert_file.c_str(), "w");
    PEM_write_X509(f, cert);
    std::fclose(f);
    f = std::fopen(out.key_file.c_str(), "w");
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    if (ca != nullptr) {
      X509_free(issuer_cert);
      EVP_PKEY_free(issuer_key);
    }
    X509_free(cert);
    EVP_PKEY_free(key);
    return out;
  }

  static void add_extension(X509* cert, X509V3_CTX* ctx, int nid, const std::string& value) {
    X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, ctx, nid, value.c_str());
    X509_add_ext(cert, e, -1);
    X509_EXTENSION_free(e);
  }
  static X509* read_cert(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "r");
    X509* x = PEM_read_X509(f, nullptr, nullptr, nullptr);
    std::fclose(f);
    return x;
  }
  static EVP_PKEY* read_key(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "r");
    EVP_PKEY* k = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
    std::fclose(f);
    return k;
  }

  std::string dir_;
  long serial_ = 0;
};

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/qlinear_tls_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    certs_ = std::make_unique<CertificateMaker>(dir_);
    ca_ = certs_->make_ca("ca");
    other_ca_ = certs_->make_ca("other-ca");
    server_ = certs_->make_leaf("server", "qlinear server", "DNS:localhost,IP:127.0.0.1", ca_);
    client_ = certs_->make_leaf("client", "qlinear client", "", ca_);
    stranger_ = certs_->make_leaf("stranger", "stranger", "", other_ca_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static ServerOptions options(const ServerTlsOptions& tls) {
    ServerOptions o;
    o.address = "127.0.0.1";
    o.port = 0;
    o.quiet = true;
    o.demo_n = 32;
    o.demo_k = 64;
    o.tls = tls;
    return o;
  }

  std::unique_ptr<QLinearServer> start(
      const ServerTlsOptions& tls,
      std::chrono::milliseconds reload_interval = std::chrono::milliseconds(0)) {
    ServerOptions o = options(tls);
    o.tls_reload_interval = reload_interval;
    auto s = QLinearServer::start(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // A client of `server` at `host` with `files` (TLS) or plaintext (null).
  static std::unique_ptr<Client> client(const QLinearServer& server, const ClientTlsFiles* files,
                                        const std::string& host = "localhost",
                                        const std::string& server_name = "") {
    ClientOptions o;
    o.call_timeout = std::chrono::seconds(10);
    if (files != nullptr) {
      auto c = tls_channel_credentials(*files);
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) o.credentials = *c;
      o.tls_server_name = server_name;
    }
    return std::make_unique<Client>(host + ":" + std::to_string(server.port()), o);
  }

  // The demo layer answers one row over `c`.
  static absl::Status infer_demo(Client& c) {
    v1::InferRequest req;
    req.set_layer("demo");
    req.set_m(1);
    req.set_x_dtype(v1::DTYPE_FP32);
    req.set_output_dtype(v1::DTYPE_BF16);
    req.set_x(std::string(64 * sizeof(float), '\0'));
    auto r = c.infer(req);
    if (!r.ok()) return r.status();
    if (r->y().size() != 32 * 2) return absl::InternalError("wrong output size");
    return absl::OkStatus();
  }

  // Copies of `files` at fixed paths, for a server whose files are then rotated.
  Issued live_copy(const Issued& files) {
    Issued live{certs_->write("live.pem", CertificateMaker::contents(files.cert_file)),
                certs_->write("live.key", CertificateMaker::contents(files.key_file))};
    return live;
  }

  // Polls `ok` for up to 10 s.
  template <typename F>
  static bool eventually(F ok) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!ok()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  static bool has_line(QLinearServer& server, const std::string& line) {
    return absl::StrContains(server.metrics().serialize(), "\n" + line + "\n");
  }

  std::string dir_;
  std::unique_ptr<CertificateMaker> certs_;
  Issued ca_, other_ca_, server_, client_, stranger_;
};

TEST_F(TlsTest, ServesTlsClientsThatTrustItsIssuerAndNoOthers) {
  auto server = start({server_.cert_file, server_.key_file, ""});
  ASSERT_NE(server, nullptr);
  // The certificate's end of validity, for alerts.
  auto cert = read_pem_certificates("--tls-cert", server_.cert_file);
  ASSERT_TRUE(cert.ok()) << cert.status();
  EXPECT_GT(cert->not_after_unix, time(nullptr));
  EXPECT_LT(cert->not_after_unix, time(nullptr) + 2 * 86400);
  EXPECT_NE(
      server->metrics().serialize().find("\nqlinear_tls_certificate_expiry_timestamp_seconds " +
                                         std::to_string(cert->not_after_unix) + "\n"),
      std::string::npos)
      << server->metrics().serialize();
  const ClientTlsFiles trusting{ca_.cert_file, "", ""};
  auto good = client(*server, &trusting);
  EXPECT_TRUE(good->health().ok());
  EXPECT_EQ(infer_demo(*good), absl::OkStatus());
  // By IP address: the certificate names 127.0.0.1 too.
  EXPECT_EQ(infer_demo(*client(*server, &trusting, "127.0.0.1")), absl::OkStatus());

  // A plaintext client, and one that trusts another issuer, are refused at the handshake.
  absl::Status plain = infer_demo(*client(*server, nullptr));
  EXPECT_TRUE(absl::IsUnavailable(plain)) << plain;
  const ClientTlsFiles other{other_ca_.cert_file, "", ""};
  absl::Status untrusted = infer_demo(*client(*server, &other));
  EXPECT_TRUE(absl::IsUnavailable(untrusted)) << untrusted;
  EXPECT_TRUE(absl::StrContains(untrusted.message(), "certificate verify failed")) << untrusted;
}

TEST_F(TlsTest, ChecksTheServerNameUnlessToldAnother) {
  // A certificate for qlinear.internal only: reached as localhost, the name does not match.
  const Issued named = certs_->make_leaf("named", "qlinear.internal", "DNS:qlinear.internal", ca_);
  auto server = start({named.cert_file, named.key_file, ""});
  ASSERT_NE(server, nullptr);
  const ClientTlsFiles trusting{ca_.cert_file, "", ""};
  absl::Status wrong_name = infer_demo(*client(*server, &trusting));
  EXPECT_TRUE(absl::IsUnavailable(wrong_name)) << wrong_name;
  EXPECT_EQ(infer_demo(*client(*server, &trusting, "localhost", "qlinear.internal")),
            absl::OkStatus());
}

TEST_F(TlsTest, MutualTlsAnswersOnlyClientsWithACertificateFromItsCas) {
  auto server = start({server_.cert_file, server_.key_file, ca_.cert_file});
  ASSERT_NE(server, nullptr);
  const ClientTlsFiles with_cert{ca_.cert_file, client_.cert_file, client_.key_file};
  EXPECT_EQ(infer_demo(*client(*server, &with_cert)), absl::OkStatus());

  const ClientTlsFiles no_cert{ca_.cert_file, "", ""};
  absl::Status anonymous = infer_demo(*client(*server, &no_cert));
  EXPECT_TRUE(absl::IsUnavailable(anonymous)) << anonymous;
  const ClientTlsFiles foreign{ca_.cert_file, stranger_.cert_file, stranger_.key_file};
  absl::Status stranger = infer_demo(*client(*server, &foreign));
  EXPECT_TRUE(absl::IsUnavailable(stranger)) << stranger;
  // The refused clients did not disturb the server.
  EXPECT_EQ(infer_demo(*client(*server, &with_cert)), absl::OkStatus());
}

TEST_F(TlsTest, StartRejectsTlsFilesThatDoNotFitNamingTheFlagAndFile) {
  const std::string missing = dir_ + "/missing.pem";
  const std::string garbage = certs_->write("garbage.pem", "not a certificate\n");
  certs_->rsa_bits = 1024;  // parses and matches, but under the TLS library's security level
  const Issued weak = certs_->make_leaf("weak", "weak", "DNS:localhost", ca_);
  certs_->rsa_bits = 0;
  struct Case {
    ServerTlsOptions tls;
    absl::StatusCode code;
    std::string message;
  } cases[] = {
      {{server_.cert_file, "", ""},
       absl::StatusCode::kInvalidArgument,
       "--tls-cert needs --tls-key"},
      {{"", server_.key_file, ""},
       absl::StatusCode::kInvalidArgument,
       "--tls-key needs --tls-cert"},
      {{"", "", ca_.cert_file},
       absl::StatusCode::kInvalidArgument,
       "--tls-client-ca needs --tls-cert and --tls-key"},
      {{missing, server_.key_file, ""},
       absl::StatusCode::kNotFound,
       "--tls-cert: cannot open " + missing},
      {{server_.cert_file, missing, ""},
       absl::StatusCode::kNotFound,
       "--tls-key: cannot open " + missing},
      {{garbage, server_.key_file, ""},
       absl::StatusCode::kInvalidArgument,
       "--tls-cert: " + garbage + " holds no PEM certificate"},
      {{server_.key_file, server_.key_file, ""},
       absl::StatusCode::kInvalidArgument,
       "holds no PEM certificate"},
      {{server_.cert_file, server_.cert_file, ""},
       absl::StatusCode::kInvalidArgument,
       "--tls-key: " + server_.cert_file + " holds no unencrypted PEM private key"},
      {{server_.cert_file, client_.key_file, ""},
       absl::StatusCode::kInvalidArgument,
       "--tls-key " + client_.key_file + " does not match --tls-cert " + server_.cert_file},
      {{server_.cert_file, server_.key_file, garbage},
       absl::StatusCode::kInvalidArgument,
       "--tls-client-ca: " + garbage + " holds no PEM certificate"},
      {{weak.cert_file, weak.key_file, ""},
       absl::StatusCode::kInvalidArgument,
       "--tls-cert " + weak.cert_file + " and --tls-key " + weak.key_file +
           ": OpenSSL's TLS library refuses the certificate (error:"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    auto s = QLinearServer::start(options(c.tls));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), c.code) << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(), c.message)) << s.status();
  }
}

// An encrypted key is refused, without asking for a passphrase on the terminal.
TEST_F(TlsTest, AnEncryptedKeyIsRefusedWithoutAPrompt) {
  FILE* in = std::fopen(server_.key_file.c_str(), "r");
  ASSERT_NE(in, nullptr);
  EVP_PKEY* key = PEM_read_PrivateKey(in, nullptr, nullptr, nullptr);
  std::fclose(in);
  ASSERT_NE(key, nullptr);
  const std::string encrypted = dir_ + "/encrypted.key";
  FILE* out = std::fopen(encrypted.c_str(), "w");
  static char passphrase[] = "secret";
  ASSERT_EQ(PEM_write_PrivateKey(out, key, EVP_aes_256_cbc(), nullptr, 0, nullptr, passphrase), 1);
  std::fclose(out);
  EVP_PKEY_free(key);
  auto s = QLinearServer::start(options({server_.cert_file, encrypted, ""}));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_TRUE(absl::StrContains(
      s.status().message(), "--tls-key: " + encrypted + " holds no unencrypted PEM private key"))
      << s.status();
}

TEST_F(TlsTest, CredentialsSayWhatTheyServe) {
  auto plain = make_server_credentials({});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->summary, "plaintext, no TLS");
  EXPECT_EQ(plain->certificate_expiry_unix, 0);
  auto tls = make_server_credentials({server_.cert_file, server_.key_file, ca_.cert_file});
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(absl::StrContains(tls->summary, "TLS with CN=qlinear server")) << tls->summary;
  EXPECT_TRUE(absl::StrContains(tls->summary, "valid until")) << tls->summary;
  EXPECT_TRUE(absl::StrContains(tls->summary, "client certificates required, issued by " +
                                                  ca_.cert_file + " (1 certificate)"))
      << tls->summary;
  // A chain of two: the server's certificate, then its issuer's.
  std::ifstream a(server_.cert_file), b(ca_.cert_file);
  const std::string chain =
      certs_->write("chain.pem", std::string(std::istreambuf_iterator<char>(a), {}) +
                                     std::string(std::istreambuf_iterator<char>(b), {}));
  auto chained = read_pem_certificates("--tls-cert", chain);
  ASSERT_TRUE(chained.ok()) << chained.status();
  EXPECT_EQ(chained->count, 2);
  EXPECT_EQ(chained->subject, "CN=qlinear server");
  // An expired certificate still serves (clients decide), but the summary says so.
  const Issued old = certs_->make_leaf("old", "old", "DNS:localhost", ca_, -2);
  auto expired = make_server_credentials({old.cert_file, old.key_file, ""});
  ASSERT_TRUE(expired.ok()) << expired.status();
  EXPECT_TRUE(absl::StrContains(expired->summary, "EXPIRED on")) << expired->summary;
}

TEST_F(TlsTest, ClientCredentialsCheckTheirFiles) {
  const std::string missing = dir_ + "/missing.pem";
  struct Case {
    ClientTlsFiles files;
    absl::StatusCode code;
    std::string message;
  } cases[] = {
      {{"", client_.cert_file, ""},
       absl::StatusCode::kInvalidArgument,
       "--tls-cert needs --tls-key"},
      {{"", "", client_.key_file},
       absl::StatusCode::kInvalidArgument,
       "--tls-key needs --tls-cert"},
      {{missing, "", ""}, absl::StatusCode::kNotFound, "--tls-ca: cannot open " + missing},
      {{client_.key_file, "", ""},
       absl::StatusCode::kInvalidArgument,
       "--tls-ca: " + client_.key_file + " holds no PEM certificate"},
      {{"", client_.cert_file, server_.key_file},
       absl::StatusCode::kInvalidArgument,
       "--tls-key " + server_.key_file + " does not match --tls-cert " + client_.cert_file},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    auto r = tls_channel_credentials(c.files);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.message)) << r.status();
  }
}

// Each check of the files: a changed set that passes the start-up checks is served, one that
// fails them is reported once and the served set kept, and files back at the served set say so.
TEST_F(TlsTest, ReloadServesANewSetAndKeepsTheServedOneWhenFilesFailTheChecks) {
  const Issued live = live_copy(server_);
  const std::string ca_file =
      certs_->write("live-ca.pem", CertificateMaker::contents(ca_.cert_file));
  auto reloader = TlsReloader::create({live.cert_file, live.key_file, ca_file});
  ASSERT_TRUE(reloader.ok()) << reloader.status();
  TlsReloader& r = **reloader;
  const std::string first = r.summary();
  const int64_t first_expiry = r.certificate_expiry_unix();
  EXPECT_TRUE(absl::StrContains(first, "CN=qlinear server")) << first;
  EXPECT_FALSE(r.check_now().has_value());  // nothing changed

  // A half-written certificate: rejected, named, once; the served set stays.
  CertificateMaker::replace(live.cert_file, "-----BEGIN CERTIFICATE-----\nMIIB\n");
  std::optional<TlsReloadEvent> e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kRejected);
  EXPECT_TRUE(absl::StrContains(e->message, "--tls-cert: " + live.cert_file)) << e->message;
  EXPECT_EQ(e->certificate_expiry_unix, first_expiry);
  EXPECT_FALSE(r.check_now().has_value());  // the same failure is not reported again
  EXPECT_EQ(r.rejection(), e->message);     // but it stands
  EXPECT_EQ(r.summary(), first);

  // A new certificate beside the old key: rejected as a mismatch.
  const Issued next = certs_->make_leaf("next", "next server", "DNS:localhost", ca_, 30);
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(next.cert_file));
  e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kRejected);
  EXPECT_TRUE(absl::StrContains(e->message, "does not match")) << e->message;
  EXPECT_EQ(r.summary(), first);

  // A pair the TLS library refuses (an RSA key of 1024 bits).
  certs_->rsa_bits = 1024;
  const Issued weak = certs_->make_leaf("weak", "weak", "DNS:localhost", ca_);
  certs_->rsa_bits = 0;
  CertificateMaker::replace(live.key_file, CertificateMaker::contents(weak.key_file));
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(weak.cert_file));
  e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kRejected);
  EXPECT_TRUE(absl::StrContains(e->message, "OpenSSL's TLS library refuses")) << e->message;

  // The files back at the served set.
  CertificateMaker::replace(live.key_file, CertificateMaker::contents(server_.key_file));
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(server_.cert_file));
  e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kRestored);
  EXPECT_EQ(r.rejection(), "");
  EXPECT_FALSE(r.check_now().has_value());

  // The key, then the certificate: the pair is served, with its end of validity.
  CertificateMaker::replace(live.key_file, CertificateMaker::contents(next.key_file));
  e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kRejected);
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(next.cert_file));
  e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kLoaded);
  EXPECT_TRUE(absl::StrContains(e->message, "CN=next server")) << e->message;
  EXPECT_EQ(e->message, r.summary());
  EXPECT_GT(e->certificate_expiry_unix, first_expiry + 20 * 86400);
  EXPECT_EQ(r.certificate_expiry_unix(), e->certificate_expiry_unix);

  // The client CAs: two authorities now.
  CertificateMaker::replace(ca_file, CertificateMaker::contents(ca_.cert_file) +
                                         CertificateMaker::contents(other_ca_.cert_file));
  e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kLoaded);
  EXPECT_TRUE(absl::StrContains(e->message, "(2 certificates)")) << e->message;
  // A client CA file that goes missing is a rejection too.
  std::filesystem::remove(ca_file);
  e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kRejected);
  EXPECT_TRUE(absl::StrContains(e->message, "--tls-client-ca: cannot open " + ca_file))
      << e->message;
}

// While the served certificate is valid, one that has expired or is not valid yet is rejected
// (every handshake would fail with it) and the served one kept; a server started with an expired
// certificate takes any set that passes the other checks.
TEST_F(TlsTest, ReloadKeepsAValidCertificateOverOneExpiredOrNotYetValid) {
  const Issued live = live_copy(server_);
  auto reloader = TlsReloader::create({live.cert_file, live.key_file, ""});
  ASSERT_TRUE(reloader.ok()) << reloader.status();
  TlsReloader& r = **reloader;
  const std::string first = r.summary();
  const int64_t first_expiry = r.certificate_expiry_unix();

  const Issued expired = certs_->make_leaf("expired", "expired", "DNS:localhost", ca_, -2);
  CertificateMaker::replace(live.key_file, CertificateMaker::contents(expired.key_file));
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(expired.cert_file));
  std::optional<TlsReloadEvent> e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kRejected);
  EXPECT_TRUE(absl::StrContains(
      e->message, "--tls-cert " + live.cert_file + ": its certificate (CN=expired) expired on "))
      << e->message;
  EXPECT_EQ(e->certificate_expiry_unix, first_expiry);
  EXPECT_EQ(r.summary(), first);

  certs_->starts_in_days = 2;
  const Issued early = certs_->make_leaf("early", "early", "DNS:localhost", ca_, 30);
  certs_->starts_in_days = 0;
  CertificateMaker::replace(live.key_file, CertificateMaker::contents(early.key_file));
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(early.cert_file));
  e = r.check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kRejected);
  EXPECT_TRUE(absl::StrContains(
      e->message,
      "--tls-cert " + live.cert_file + ": its certificate (CN=early) is not valid before "))
      << e->message;
  EXPECT_EQ(r.summary(), first);

  // Served expired: a set that passes the other checks is taken, expired or not.
  const Issued old = certs_->make_leaf("old", "old", "DNS:localhost", ca_, -3);
  const Issued stale{certs_->write("stale.pem", CertificateMaker::contents(old.cert_file)),
                     certs_->write("stale.key", CertificateMaker::contents(old.key_file))};
  auto from_expired = TlsReloader::create({stale.cert_file, stale.key_file, ""});
  ASSERT_TRUE(from_expired.ok()) << from_expired.status();
  CertificateMaker::replace(stale.key_file, CertificateMaker::contents(expired.key_file));
  CertificateMaker::replace(stale.cert_file, CertificateMaker::contents(expired.cert_file));
  e = (*from_expired)->check_now();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, TlsReloadEvent::kLoaded) << e->message;
  EXPECT_TRUE(absl::StrContains(e->message, "CN=expired")) << e->message;
}

// A running server keeps serving its valid certificate to new connections when the files are
// replaced by an expired pair from the same authority (read on SIGHUP's path), and counts the
// rejection.
TEST_F(TlsTest, ARunningServerKeepsServingItsCertificateOverAnExpiredOne) {
  const Issued live = live_copy(server_);
  auto server = start({live.cert_file, live.key_file, ""});
  ASSERT_NE(server, nullptr);
  const ClientTlsFiles trusts_ca{ca_.cert_file, "", ""};
  ASSERT_EQ(infer_demo(*client(*server, &trusts_ca)), absl::OkStatus());
  const Issued expired = certs_->make_leaf("expired", "expired", "DNS:localhost", ca_, -2);
  CertificateMaker::replace(live.key_file, CertificateMaker::contents(expired.key_file));
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(expired.cert_file));
  EXPECT_EQ(server->reload_tls(), "TLS files not reloaded");
  EXPECT_TRUE(has_line(*server, "qlinear_tls_reloads_total{result=\"rejected\"} 1"))
      << server->metrics().serialize();
  EXPECT_TRUE(has_line(*server, "qlinear_tls_reloads_total{result=\"loaded\"} 0"))
      << server->metrics().serialize();
  EXPECT_EQ(infer_demo(*client(*server, &trusts_ca)), absl::OkStatus());
}

// A renewal whose certificate starts 5 s ahead of this host's clock, read on SIGHUP's
// path by a server without a reload interval: rejected while it is not valid yet (the served one
// kept), then served from its start without another reading being asked for.
TEST_F(TlsTest, ACertificateNotValidYetIsServedOnceItIs) {
  const Issued live = live_copy(server_);
  auto server = start({live.cert_file, live.key_file, ""});
  ASSERT_NE(server, nullptr);
  const ClientTlsFiles trusts_ca{ca_.cert_file, "", ""};
  const ClientTlsFiles trusts_other{other_ca_.cert_file, "", ""};
  certs_->starts_in_seconds = 5;
  const Issued soon = certs_->make_leaf("soon", "soon", "DNS:localhost", other_ca_, 7);
  certs_->starts_in_seconds = 0;
  const auto issued = std::chrono::steady_clock::now();
  CertificateMaker::replace(live.key_file, CertificateMaker::contents(soon.key_file));
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(soon.cert_file));
  EXPECT_EQ(server->reload_tls(), "TLS files not reloaded");
  EXPECT_EQ(infer_demo(*client(*server, &trusts_ca)), absl::OkStatus());
  ASSERT_TRUE(eventually([&] { return infer_demo(*client(*server, &trusts_other)).ok(); }));
  EXPECT_GE(std::chrono::steady_clock::now() - issued, std::chrono::seconds(4));
  EXPECT_TRUE(absl::IsUnavailable(infer_demo(*client(*server, &trusts_ca))));
  EXPECT_TRUE(has_line(*server, "qlinear_tls_reloads_total{result=\"rejected\"} 1"))
      << server->metrics().serialize();
  EXPECT_TRUE(has_line(*server, "qlinear_tls_reloads_total{result=\"loaded\"} 1"))
      << server->metrics().serialize();
}

// A running server: files that fail the checks change nothing clients see; a rotated certificate
// (here from another authority) is served to new connections, while connections made before keep
// working; the metrics count both and carry the new end of validity.
TEST_F(TlsTest, ARunningServerServesRotatedCertificatesFromTheNextConnection) {
  const Issued live = live_copy(server_);
  auto server = start({live.cert_file, live.key_file, ""}, std::chrono::milliseconds(50));
  ASSERT_NE(server, nullptr);
  const ClientTlsFiles trusts_ca{ca_.cert_file, "", ""};
  const ClientTlsFiles trusts_other{other_ca_.cert_file, "", ""};
  auto before = client(*server, &trusts_ca);
  ASSERT_EQ(infer_demo(*before), absl::OkStatus());
  EXPECT_TRUE(absl::IsUnavailable(infer_demo(*client(*server, &trusts_other))));

  CertificateMaker::replace(live.key_file, "not a key\n");
  ASSERT_TRUE(eventually([&] {
    return has_line(*server, "qlinear_tls_reloads_total{result=\"rejected\"} 1");
  })) << server->metrics().serialize();
  EXPECT_TRUE(has_line(*server, "qlinear_tls_reload_failing 1")) << server->metrics().serialize();
  EXPECT_EQ(infer_demo(*client(*server, &trusts_ca)), absl::OkStatus());

  const Issued rotated = certs_->make_leaf("rotated", "rotated", "DNS:localhost", other_ca_, 7);
  CertificateMaker::replace(live.key_file, CertificateMaker::contents(rotated.key_file));
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(rotated.cert_file));
  ASSERT_TRUE(eventually([&] { return infer_demo(*client(*server, &trusts_other)).ok(); }));
  absl::Status old_issuer = infer_demo(*client(*server, &trusts_ca));
  EXPECT_TRUE(absl::IsUnavailable(old_issuer)) << old_issuer;
  EXPECT_EQ(infer_demo(*before), absl::OkStatus());  // its connection predates the rotation
  auto cert = read_pem_certificates("--tls-cert", rotated.cert_file);
  ASSERT_TRUE(cert.ok()) << cert.status();
  ASSERT_TRUE(eventually([&] {
    return has_line(*server, "qlinear_tls_certificate_expiry_timestamp_seconds " +
                                 std::to_string(cert->not_after_unix));
  })) << server->metrics().serialize();
  EXPECT_TRUE(has_line(*server, "qlinear_tls_reloads_total{result=\"loaded\"} 1"))
      << server->metrics().serialize();
  EXPECT_TRUE(has_line(*server, "qlinear_tls_reload_failing 0")) << server->metrics().serialize();
}

// Mutual TLS: a rotated client CA file decides which client certificates new connections accept.
TEST_F(TlsTest, ARunningServerTakesRotatedClientCas) {
  const std::string ca_file =
      certs_->write("live-ca.pem", CertificateMaker::contents(ca_.cert_file));
  auto server =
      start({server_.cert_file, server_.key_file, ca_file}, std::chrono::milliseconds(50));
  ASSERT_NE(server, nullptr);
  const ClientTlsFiles ours{ca_.cert_file, client_.cert_file, client_.key_file};
  const ClientTlsFiles strangers{ca_.cert_file, stranger_.cert_file, stranger_.key_file};
  EXPECT_EQ(infer_demo(*client(*server, &ours)), absl::OkStatus());
  EXPECT_TRUE(absl::IsUnavailable(infer_demo(*client(*server, &strangers))));

  CertificateMaker::replace(ca_file, CertificateMaker::contents(other_ca_.cert_file));
  ASSERT_TRUE(eventually([&] { return infer_demo(*client(*server, &strangers)).ok(); }));
  absl::Status refused = infer_demo(*client(*server, &ours));
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
}

// Without a reload interval the files are read once: a rotation changes nothing.
TEST_F(TlsTest, WithoutAReloadIntervalTheFilesAreReadOnce) {
  const Issued live = live_copy(server_);
  auto server = start({live.cert_file, live.key_file, ""});
  ASSERT_NE(server, nullptr);
  const Issued rotated = certs_->make_leaf("rotated", "rotated", "DNS:localhost", other_ca_, 7);
  CertificateMaker::replace(live.key_file, CertificateMaker::contents(rotated.key_file));
  CertificateMaker::replace(live.cert_file, CertificateMaker::contents(rotated.cert_file));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const ClientTlsFiles trusts_ca{ca_.cert_file, "", ""};
  EXPECT_EQ(infer_demo(*client(*server, &trusts_ca)), absl::OkStatus());
  EXPECT_TRUE(has_line(*server, "qlinear_tls_reloads_total{result=\"loaded\"} 0"))
      << server->metrics().serialize();
  EXPECT_TRUE(has_line(*server, "qlinear_tls_reloads_total{result=\"rejected\"} 0"))
      << server->metrics().serialize();
}

}  // namespace
}  // namespace qlinear
