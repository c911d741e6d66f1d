// TLS on the gRPC port: a server with a certificate answers TLS clients that trust its issuer and
// no others; with client CAs (mutual TLS) it answers only clients whose certificate they issued;
// wrong files fail the start-up (or the client's set-up), named. The certificates are made here,
// fresh for each run, with OpenSSL.
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

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
// P-256 key.
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

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

 private:
  Issued issue(const std::string& name, const std::string& cn, const std::string& san,
               const Issued* ca, bool is_ca, int days) {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), ++serial_);
    if (days >= 0) {
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

  std::unique_ptr<QLinearServer> start(const ServerTlsOptions& tls) {
    auto s = QLinearServer::start(options(tls));
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

}  // namespace
}  // namespace qlinear
