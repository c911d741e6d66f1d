// End-to-end tests of qlinear-server over loopback, driven through the C++ client library.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/qlinear_client.h"
#include "common/npy.h"
#include "common/version.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kernels/core/device_fault.h"
#include "kernels/registry.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "server/core/host_memory.h"
#include "server/grpc_status.h"
#include "server/metrics_http.h"
#include "server/server.h"
#include "tests/server/test_util.h"

namespace qlinear {
namespace {

using testing::make_request;
using testing::make_test_layer;
using testing::random_x;
using testing::reference_y;
using testing::TestLayer;

// A crash in the server under test (it runs in this process) prints the faulting thread's
// symbolized stack, as qlinear-server does, so that a run on another host says where it died.
const bool kCrashReports = [] {
  absl::InitializeSymbolizer("/proc/self/exe");
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  return true;
}();

uint64_t test_seed() {
  if (const char* s = std::getenv("QLINEAR_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  static const uint64_t seed = std::random_device{}();
  return seed;
}

// A TCP socket connected to 127.0.0.1:port, its receive buffer set to `rcvbuf` bytes first where
// that is positive; -1 where it cannot connect.
int connect_loopback(int port, int rcvbuf = 0) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// GET http://127.0.0.1:port/path with a plain socket; returns the whole response, or what came
// within 20 s of silence (so that a server that never answers cannot hang a test).
std::string http_get(int port, const std::string& path) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "connect failed";
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "write failed";
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

// A server on a free loopback port, quiet, with a small demo layer.
ServerOptions loopback_server_options(int64_t demo_n = 48, int64_t demo_k = 64) {
  ServerOptions o;
  o.address = "127.0.0.1";
  o.port = 0;
  o.quiet = true;
  o.demo_n = demo_n;
  o.demo_k = demo_k;
  return o;
}

class ServerTest : public ::testing::Test {
 protected:
  static constexpr int64_t kUploadIdleMs = 3000;
  void SetUp() override {
    ServerOptions o;
    o.metrics_port = testing::free_port();
    o.enable_echo = true;
    o.address = "127.0.0.1";
    o.port = 0;
    o.quiet = true;
    o.demo_layer = true;
    o.demo_n = 48;
    o.demo_k = 64;
    o.max_message_mb = 8;
    o.upload_idle_timeout_ms = kUploadIdleMs;
    auto s = QLinearServer::start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ClientOptions co;
    co.max_message_mb = 8;
    co.upload_chunk_bytes = 256 << 10;
    client_ = std::make_unique<Client>("127.0.0.1:" + std::to_string(server_->port()), co);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    clear_device_fault_for_testing();  // a test that reports one may fail before it clears it
  }

  TestLayer load(const std::string& name, int64_t n, int64_t k, Scheme scheme, bool bias = true) {
    TestLayer t = make_test_layer(name, n, k, scheme, bias, seed_++);
    auto r = client_->load_layer(t.header, t.weights);
    EXPECT_TRUE(r.ok()) << r.status();
    return t;
  }

  // An upload of `t` started by hand: its header and its first 4096 weight bytes sent, the rest
  // left to the test; null where a write failed.
  std::unique_ptr<grpc::ClientWriter<v1::LoadLayerRequest>> start_upload(
      const TestLayer& t, grpc::ClientContext* ctx, v1::LoadLayerResponse* resp) {
    auto writer = client_->stub().LoadLayer(ctx, resp);
    v1::LoadLayerRequest msg;
    *msg.mutable_header() = t.header;
    if (!writer->Write(msg)) return nullptr;
    msg.set_weight_chunk(std::string(reinterpret_cast<const char*>(t.weights.data()), 4096));
    if (!writer->Write(msg)) return nullptr;
    return writer;
  }

  std::unique_ptr<QLinearServer> server_;
  std::unique_ptr<Client> client_;
  uint64_t seed_ = test_seed();
};

#define SEED_TRACE() SCOPED_TRACE("QLINEAR_TEST_SEED=" + std::to_string(test_seed()))

TEST_F(ServerTest, HealthServingAndWatch) {
  auto h = client_->health();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(*h);

  auto stub = grpc::health::v1::Health::NewStub(client_->channel());
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  auto reader = stub->Watch(&ctx, req);
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // Shutdown turns the server NOT_SERVING before it stops.
  std::thread stopper([&] { server_->shutdown(std::chrono::milliseconds(2000)); });
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  ctx.TryCancel();
  stopper.join();
}

TEST_F(ServerTest, ReflectionListsTheService) {
  const std::string bytes = testing::reflection_list_services(client_->channel());
  EXPECT_NE(bytes.find("qlinear.v1.QLinear"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
  EXPECT_NE(testing::reflection_file_containing(client_->channel(), "qlinear.v1.QLinear")
                .find("LayerHeader"),
            std::string::npos);
}

TEST_F(ServerTest, ListKernelsNamesReferenceAndHost) {
  auto k = client_->list_kernels();
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_GE(k->kernels_size(), 1);
  EXPECT_EQ(k->kernels(k->kernels_size() - 1).name(), "cpu.reference");
  EXPECT_TRUE(k->kernels(k->kernels_size() - 1).supported());
  EXPECT_FALSE(k->cpu().empty());
  EXPECT_FALSE(k->gpu().empty());
  // The build serving: "0.1.0 (commit 0123456789ab)", as --version and the log give it.
  EXPECT_EQ(k->server_version(), version_string());
  EXPECT_EQ(k->server_version(), absl::StrCat(version(), " (commit ", build_commit(), ")"));
  EXPECT_FALSE(std::string(build_commit()).empty());
  EXPECT_TRUE(absl::StartsWith(k->server_version(), absl::StrCat(version(), " (commit ")))
      << k->server_version();
}

TEST_F(ServerTest, DemoLayerIsLoaded) {
  auto info = client_->describe_layer("demo");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->n(), 48);
  EXPECT_EQ(info->k(), 64);
  EXPECT_EQ(info->buckets_size(), static_cast<int>(m_buckets().size()));
  EXPECT_FALSE(info->buckets(0).kernel().empty());
}

TEST_F(ServerTest, LargeUploadInManyChunksThenUnaryMatchesReference) {
  SEED_TRACE();
  // 5 MiB of weights in 256 KiB chunks: above the 4 MiB default message size.
  TestLayer t = load("big", 1280, 4096, Scheme::kDynamicSymmetric);
  auto info = client_->describe_layer("big");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->weight_bytes(), 1280 * 4096);
  EXPECT_EQ(info->weight_sha256(), t.header.weight_sha256());
  SplitMix64 rng(seed_);
  const std::string x = random_x(rng, 3, 4096, DType::kBF16);
  auto r = client_->infer(make_request("big", x, DType::kBF16, 3, DType::kBF16, "r1"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request_id(), "r1");
  EXPECT_EQ(r->m(), 3);
  EXPECT_EQ(r->n(), 1280);
  EXPECT_EQ(r->y_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(r->y(), reference_y(t, x, DType::kBF16, 3, DType::kBF16));
  EXPECT_FALSE(r->metadata().kernel().empty());
  EXPECT_EQ(r->metadata().batch_rows(), 3);
}

TEST_F(ServerTest, EverySchemeAndDtypeMatchesReferenceBitForBit) {
  SEED_TRACE();
  const Scheme schemes[] = {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric,
                            Scheme::kDynamicAsymmetric, Scheme::kStaticAsymmetric};
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  SplitMix64 rng(seed_ + 99);
  int i = 0;
  for (Scheme s : schemes) {
    for (bool bias : {false, true}) {
      const std::string name = "l" + std::to_string(i++);
      TestLayer t = load(name, 33, 70, s, bias);
      for (DType xd : dtypes) {
        for (DType yd : dtypes) {
          const int64_t m = rng.range(1, 9);
          const std::string x = random_x(rng, m, 70, xd);
          v1::InferRequest req = make_request(name, x, xd, m, yd);
          req.set_return_scales(true);
          auto r = client_->infer(req);
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_EQ(r->y(), reference_y(t, x, xd, m, yd))
              << scheme_name(s) << " bias=" << bias << " x=" << dtype_name(xd)
              << " y=" << dtype_name(yd);
          EXPECT_EQ(r->metadata().sa_size(), m);
          EXPECT_EQ(r->metadata().azp_size(), is_asymmetric(s) ? m : 0);
        }
      }
    }
  }
}

TEST_F(ServerTest, StreamMixesGoodAndBadMessagesInOrder) {
  SEED_TRACE();
  TestLayer t = load("s", 40, 48, Scheme::kDynamicAsymmetric);
  SplitMix64 rng(seed_ + 7);
  auto stream = client_->open_stream();
  struct Sent {
    std::string id;
    std::string x;
    int64_t m;
    int expect_code;
  };
  std::vector<Sent> sent;
  for (int i = 0; i < 12; ++i) {
    const int64_t m = rng.range(1, 6);
    std::string x = random_x(rng, m, 48, DType::kF32);
    v1::InferRequest req =
        make_request("s", x, DType::kF32, m, DType::kBF16, "id" + std::to_string(i));
    int code = 0;
    if (i % 4 == 1) {  // wrong byte count
      req.mutable_x()->pop_back();
      code = static_cast<int>(absl::StatusCode::kInvalidArgument);
    } else if (i % 4 == 2 && i > 2) {  // unknown layer
      req.set_layer("nope");
      code = static_cast<int>(absl::StatusCode::kNotFound);
    }
    ASSERT_TRUE(stream->write(req));
    sent.push_back({req.request_id(), x, m, code});
  }
  stream->writes_done();
  v1::InferResponse resp;
  for (size_t i = 0; i < sent.size(); ++i) {
    ASSERT_TRUE(stream->read(&resp)) << "response " << i << " missing";
    EXPECT_EQ(resp.request_id(), sent[i].id);
    EXPECT_EQ(resp.status_code(), sent[i].expect_code) << resp.status_message();
    if (sent[i].expect_code == 0) {
      EXPECT_EQ(resp.y(), reference_y(t, sent[i].x, DType::kF32, sent[i].m, DType::kBF16));
      // The first message of a stream carries the selection explanation.
      EXPECT_EQ(resp.metadata().selection_size() > 0, i == 0);
    } else {
      EXPECT_TRUE(resp.y().empty());
      EXPECT_FALSE(resp.status_message().empty());
    }
  }
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());
}

// A request id is echoed whole up to 4096 bytes. A longer one is INVALID_ARGUMENT, answered with
// its first 128 bytes, so that no answer can outgrow the message limit (the error's answer to a
// message of the limit's size echoed its whole id: too large to send, it ended the stream); the
// stream goes on.
TEST_F(ServerTest, OverlongRequestIdsAreRefusedAndTheStreamGoesOn) {
  SEED_TRACE();
  TestLayer t = load("rid", 16, 32, Scheme::kDynamicSymmetric);
  SplitMix64 rng(seed_ + 5);
  const std::string x = random_x(rng, 1, 32, DType::kBF16);
  const std::string longest(4096, 'a');
  const std::string over(4097, 'b');
  // A message of exactly the test server's 8 MiB limit, on an unknown layer and without x: every
  // answer to it that echoes the whole id is larger than the limit.
  v1::InferRequest at_limit = make_request("nope", "", DType::kBF16, 1, DType::kBF16);
  const int64_t rest = static_cast<int64_t>(at_limit.ByteSizeLong());
  // (The id's field: its tag, a 4-byte length and its bytes.)
  at_limit.set_request_id(std::string((int64_t{8} << 20) - rest - 5, 'c'));
  ASSERT_EQ(at_limit.ByteSizeLong(), size_t{8} << 20);
  const std::string near_limit = at_limit.request_id();
  auto stream = client_->open_stream();
  ASSERT_TRUE(stream->write(make_request("rid", x, DType::kBF16, 1, DType::kBF16, longest)));
  ASSERT_TRUE(stream->write(make_request("rid", x, DType::kBF16, 1, DType::kBF16, over)));
  ASSERT_TRUE(stream->write(at_limit));
  ASSERT_TRUE(stream->write(make_request("rid", x, DType::kBF16, 1, DType::kBF16, "after")));
  stream->writes_done();
  v1::InferResponse resp;
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  EXPECT_EQ(resp.request_id(), longest);
  EXPECT_EQ(resp.y(), reference_y(t, x, DType::kBF16, 1, DType::kBF16));
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(resp.status_message(),
            "request_id is 4097 bytes, above the limit of 4096 (answered with its first 128 bytes, "
            "whole characters)");
  EXPECT_EQ(resp.request_id(), over.substr(0, 128));
  EXPECT_TRUE(resp.y().empty());
  ASSERT_TRUE(stream->read(&resp)) << "the stream ended at the id near the message limit";
  EXPECT_EQ(resp.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
      << resp.status_message();
  EXPECT_EQ(resp.request_id(), near_limit.substr(0, 128));
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  EXPECT_EQ(resp.request_id(), "after");
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());

  // An id of three-byte characters is echoed with the whole characters of its first 128 bytes
  // (42 of them): a character cut in two would make the answer one the client cannot parse,
  // ending the stream there.
  std::string euros;
  while (euros.size() <= 4096) euros += "\xe2\x82\xac";  // U+20AC
  stream = client_->open_stream();
  ASSERT_TRUE(stream->write(make_request("rid", x, DType::kBF16, 1, DType::kBF16, euros)));
  ASSERT_TRUE(stream->write(make_request("rid", x, DType::kBF16, 1, DType::kBF16, "after")));
  stream->writes_done();
  ASSERT_TRUE(stream->read(&resp)) << "the stream ended at an id cut within a character";
  EXPECT_EQ(resp.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(resp.request_id(), euros.substr(0, 126));
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  EXPECT_EQ(resp.request_id(), "after");
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());

  // Unary: the same status.
  auto r = client_->infer(make_request("rid", x, DType::kBF16, 1, DType::kBF16, over));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "request_id is 4097 bytes, above the limit of 4096 (answered with its first 128 bytes, "
            "whole characters)");
}

// An error that quotes what the client sent (here a forced kernel's name) is cut to
// kMaxStatusMessageBytes at a character boundary, keeping its code: whole, it was over gRPC's
// metadata limit (the unary call failed RESOURCE_EXHAUSTED, a transport error) or, on a stream,
// over the message limit (the stream ended).
TEST_F(ServerTest, ErrorsQuotingTheClientAreBoundedAndTheStreamGoesOn) {
  SEED_TRACE();
  TestLayer t = load("quote", 16, 32, Scheme::kDynamicSymmetric);
  SplitMix64 rng(seed_ + 11);
  const std::string x = random_x(rng, 1, 32, DType::kBF16);
  std::string name;
  while (name.size() < 20000) name += "\xc3\xa9";  // U+00E9, two bytes
  auto check = [&](absl::StatusCode code, absl::string_view message) {
    EXPECT_EQ(code, absl::StatusCode::kInvalidArgument) << message.substr(0, 200);
    EXPECT_LE(message.size(), kMaxStatusMessageBytes);
    EXPECT_TRUE(absl::StartsWith(message, "unknown kernel '\xc3\xa9")) << message.substr(0, 200);
    EXPECT_TRUE(absl::EndsWith(message, " bytes in all)"))
        << message.substr(message.size() - std::min<size_t>(message.size(), 200));
    // Cut between characters: what precedes the tail is whole two-byte characters after the
    // opening quote.
    const size_t quote = message.find('\'') + 1;
    const size_t tail = message.rfind("... (");
    ASSERT_NE(tail, absl::string_view::npos);
    EXPECT_EQ((tail - quote) % 2, 0u) << "cut inside a character";
  };
  v1::InferRequest req = make_request("quote", x, DType::kBF16, 1, DType::kBF16);
  req.set_forced_kernel(name);
  auto r = client_->infer(req);
  ASSERT_FALSE(r.ok());
  check(r.status().code(), r.status().message());

  // On a stream, a name that fills most of the test server's 8 MiB message limit.
  std::string huge;
  while (huge.size() < (size_t{7} << 20)) huge += "\xc3\xa9";
  v1::InferRequest big = make_request("quote", x, DType::kBF16, 1, DType::kBF16, "big");
  big.set_forced_kernel(huge);
  auto stream = client_->open_stream();
  ASSERT_TRUE(stream->write(big));
  ASSERT_TRUE(stream->write(make_request("quote", x, DType::kBF16, 1, DType::kBF16, "after")));
  stream->writes_done();
  v1::InferResponse resp;
  ASSERT_TRUE(stream->read(&resp)) << "the stream ended at the long name";
  EXPECT_EQ(resp.request_id(), "big");
  check(static_cast<absl::StatusCode>(resp.status_code()), resp.status_message());
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  EXPECT_EQ(resp.y(), reference_y(t, x, DType::kBF16, 1, DType::kBF16));
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());
}

// A stream whose first message fails gives the selection explanation with its first answer that
// succeeds, and only there.
TEST_F(ServerTest, StreamExplainsOnItsFirstSuccessfulAnswer) {
  SEED_TRACE();
  TestLayer t = load("fe", 24, 32, Scheme::kDynamicSymmetric);
  SplitMix64 rng(seed_ + 3);
  auto stream = client_->open_stream();
  const std::string x = random_x(rng, 2, 32, DType::kBF16);
  v1::InferRequest bad = make_request("nope", x, DType::kBF16, 2, DType::kBF16, "bad");
  ASSERT_TRUE(stream->write(bad));
  for (const char* id : {"good1", "good2"}) {
    ASSERT_TRUE(stream->write(make_request("fe", x, DType::kBF16, 2, DType::kBF16, id)));
  }
  stream->writes_done();
  v1::InferResponse resp;
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(resp.metadata().selection_size(), 0);
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.request_id(), "good1");
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  EXPECT_GT(resp.metadata().selection_size(), 0);
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.request_id(), "good2");
  EXPECT_EQ(resp.metadata().selection_size(), 0);
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());
}

// A response whose y alone fits the message limit but which, with sa and the metadata, would not,
// is that message's RESOURCE_EXHAUSTED: the stream stays open (a send that failed would end it).
TEST_F(ServerTest, AResponseJustUnderTheLimitWithItsScalesFailsAloneOnAStream) {
  SEED_TRACE();
  TestLayer t = load("edge", 64, 16, Scheme::kDynamicSymmetric, false);
  SplitMix64 rng(seed_ + 5);
  const int64_t limit = int64_t{8} << 20;
  const int64_t m = (limit - 16 * 1024) / (64 * 4);  // fp32 y 16 KiB under the limit
  ASSERT_LE(m * 64 * 4, limit);
  const std::string big_x = random_x(rng, m, 16, DType::kBF16);
  auto stream = client_->open_stream();
  v1::InferRequest big = make_request("edge", big_x, DType::kBF16, m, DType::kF32, "big");
  big.set_return_scales(true);
  ASSERT_TRUE(stream->write(big));
  const std::string x = random_x(rng, 3, 16, DType::kBF16);
  ASSERT_TRUE(stream->write(make_request("edge", x, DType::kBF16, 3, DType::kBF16, "small")));
  stream->writes_done();
  v1::InferResponse resp;
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.request_id(), "big");
  EXPECT_EQ(resp.status_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(resp.status_message().find("of sa and azp"), std::string::npos)
      << resp.status_message();
  ASSERT_TRUE(stream->read(&resp)) << "the stream ended after the large message";
  EXPECT_EQ(resp.request_id(), "small");
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  EXPECT_EQ(resp.y(), reference_y(t, x, DType::kBF16, 3, DType::kBF16));
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());
}

// A stream's response keeps y's allocation from one message to the next, and y is sized without
// a zero-fill: every answer must still be exactly its own, whatever the previous one's size and
// dtype, and a failed message in between must answer with an empty y.
TEST_F(ServerTest, StreamAnswersAreExactWhenSizesAndDtypesChange) {
  SEED_TRACE();
  TestLayer t = load("sz", 40, 48, Scheme::kDynamicSymmetric);
  SplitMix64 rng(seed_ + 11);
  auto stream = client_->open_stream();
  struct Step {
    int64_t m;
    DType y_dtype;
    bool non_finite;
  };
  const std::vector<Step> steps = {
      {6, DType::kF32, false},  {6, DType::kF32, false},  {2, DType::kBF16, false},
      {9, DType::kF32, false},  {9, DType::kF32, true},   {9, DType::kF32, false},
      {3, DType::kF16, false},  {3, DType::kF32, false},  {1, DType::kBF16, false},
      {9, DType::kBF16, false}, {9, DType::kBF16, false},
  };
  std::vector<std::string> xs;
  for (size_t i = 0; i < steps.size(); ++i) {
    std::string x = random_x(rng, steps[i].m, 48, DType::kF32);
    if (steps[i].non_finite) {
      const float nan = std::nanf("");
      std::memcpy(&x[(steps[i].m / 2 * 48 + 5) * sizeof(float)], &nan, sizeof(nan));
    }
    ASSERT_TRUE(stream->write(make_request("sz", x, DType::kF32, steps[i].m, steps[i].y_dtype,
                                           "id" + std::to_string(i))));
    xs.push_back(std::move(x));
  }
  stream->writes_done();
  v1::InferResponse resp;
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("message " + std::to_string(i));
    ASSERT_TRUE(stream->read(&resp));
    EXPECT_EQ(resp.request_id(), "id" + std::to_string(i));
    if (steps[i].non_finite) {
      EXPECT_EQ(resp.status_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
      EXPECT_NE(resp.status_message().find("non-finite"), std::string::npos)
          << resp.status_message();
      EXPECT_TRUE(resp.y().empty());
      continue;
    }
    EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
    EXPECT_EQ(resp.y(), reference_y(t, xs[i], DType::kF32, steps[i].m, steps[i].y_dtype));
  }
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());
}

TEST_F(ServerTest, ChecksumMismatchLeavesNothing) {
  TestLayer t = make_test_layer("bad", 16, 32, Scheme::kDynamicSymmetric, false, 1);
  t.header.set_weight_sha256(std::string(64, 'a'));
  auto r = client_->load_layer(t.header, t.weights);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("checksum mismatch"), absl::string_view::npos);
  EXPECT_EQ(client_->describe_layer("bad").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ServerTest, FailedReplaceKeepsTheLoadedLayer) {
  SEED_TRACE();
  TestLayer t = load("keep", 16, 32, Scheme::kDynamicSymmetric);
  TestLayer t2 = make_test_layer("keep", 16, 32, Scheme::kDynamicSymmetric, true, 5);
  t2.header.set_replace(true);
  t2.weights.pop_back();  // short upload
  t2.header.set_weight_sha256(sha256_hex(t2.weights.data(), t2.weights.size()));
  auto r = client_->load_layer(t2.header, t2.weights);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("upload ended after"), absl::string_view::npos);
  SplitMix64 rng(seed_);
  const std::string x = random_x(rng, 2, 32, DType::kF32);
  auto y = client_->infer(make_request("keep", x, DType::kF32, 2, DType::kF32));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->y(), reference_y(t, x, DType::kF32, 2, DType::kF32));
}

TEST_F(ServerTest, CancelledUploadLeavesNothing) {
  TestLayer t = make_test_layer("cancel", 64, 1024, Scheme::kDynamicSymmetric, false, 3);
  grpc::ClientContext ctx;
  v1::LoadLayerResponse resp;
  auto writer = start_upload(t, &ctx, &resp);
  ASSERT_NE(writer, nullptr);
  ctx.TryCancel();
  grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED);
  // The server notices the cancellation asynchronously; the layer must never appear.
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(client_->describe_layer("cancel").status().code(), absl::StatusCode::kNotFound);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // And the name is free for a real upload afterwards.
  auto r = client_->load_layer(t.header, t.weights);
  EXPECT_TRUE(r.ok()) << r.status();
}

// An upload whose progress callback answers false is cancelled there: no chunk after it is sent,
// load_layer returns CANCELLED saying how far it got, and the server keeps nothing, also when it
// stops after the last chunk (the call is cancelled before the upload's end). A callback that
// goes on uploads the whole.
TEST_F(ServerTest, AnUploadItsProgressCallbackStopsLeavesNothing) {
  // 1 MiB: four chunks of 256 KiB.
  TestLayer t = make_test_layer("stopped", 256, 4096, Scheme::kDynamicSymmetric, false, 7);
  for (const int stop_at : {1, 4}) {
    SCOPED_TRACE(absl::StrCat("false after chunk ", stop_at));
    int calls = 0;
    auto r = client_->load_layer(t.header, t.weights, [&](int64_t sent, int64_t total) {
      ++calls;
      EXPECT_EQ(sent, calls * (int64_t{256} << 10));
      EXPECT_EQ(total, int64_t{1} << 20);
      return calls < stop_at;
    });
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
    EXPECT_EQ(r.status().message(),
              absl::StrCat("the upload of layer 'stopped' was stopped after ",
                           stop_at * (256 << 10), " of 1048576 bytes; nothing was loaded"));
    EXPECT_EQ(calls, stop_at);
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(client_->describe_layer("stopped").status().code(), absl::StatusCode::kNotFound);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  int calls = 0;
  auto r = client_->load_layer(t.header, t.weights, [&](int64_t, int64_t) {
    ++calls;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(r->layer().weight_sha256(), t.header.weight_sha256());
}

// A client that stops sending in the middle of an upload is cancelled once the server has heard
// nothing from it for --upload-idle-timeout-ms: its buffer and thread are freed, nothing is kept,
// and the name is free. Empty chunks are not progress: an upload that sends only those after its
// header is cancelled the same.
TEST_F(ServerTest, AnUploadThatStopsSendingIsCancelled) {
  for (const bool empty_chunks : {false, true}) {
    SCOPED_TRACE(empty_chunks ? "empty chunks every 250 ms" : "nothing sent");
    const std::string name = empty_chunks ? "empty-chunks" : "stalled";
    TestLayer t = make_test_layer(name, 64, 1024, Scheme::kDynamicSymmetric, false, 5);
    grpc::ClientContext ctx;
    v1::LoadLayerResponse resp;
    auto writer = start_upload(t, &ctx, &resp);
    ASSERT_NE(writer, nullptr);
    const auto start = std::chrono::steady_clock::now();
    if (empty_chunks) {
      v1::LoadLayerRequest empty;
      empty.set_weight_chunk("");
      // Until the server ends the call (at most 4x the idle limit).
      while (std::chrono::steady_clock::now() - start <
                 std::chrono::milliseconds(4 * kUploadIdleMs) &&
             writer->Write(empty)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
      }
    }
    grpc::Status s = writer->Finish();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
    EXPECT_GE(waited, kUploadIdleMs - 100);
    EXPECT_LT(waited, kUploadIdleMs + 5000);
    EXPECT_EQ(client_->describe_layer(name).status().code(), absl::StatusCode::kNotFound);
    auto r = client_->load_layer(t.header, t.weights);
    EXPECT_TRUE(r.ok()) << r.status();
  }
}

TEST_F(ServerTest, DuplicateNameAndReplace) {
  SEED_TRACE();
  TestLayer a = load("dup", 8, 16, Scheme::kDynamicSymmetric);
  TestLayer b = make_test_layer("dup", 12, 16, Scheme::kStaticSymmetric, true, 11);
  auto r = client_->load_layer(b.header, b.weights);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  b.header.set_replace(true);
  r = client_->load_layer(b.header, b.weights);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->replaced());
  auto info = client_->describe_layer("dup");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->n(), 12);
  EXPECT_EQ(info->scheme(), v1::SCHEME_STATIC_SYMMETRIC);
}

TEST_F(ServerTest, UnloadDuringAStream) {
  SEED_TRACE();
  TestLayer t = load("gone", 24, 40, Scheme::kDynamicSymmetric);
  SplitMix64 rng(seed_);
  auto stream = client_->open_stream();
  const std::string x = random_x(rng, 2, 40, DType::kBF16);
  v1::InferResponse resp;
  ASSERT_TRUE(stream->write(make_request("gone", x, DType::kBF16, 2, DType::kBF16, "a")));
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), 0);
  ASSERT_TRUE(client_->unload_layer("gone").ok());
  ASSERT_TRUE(stream->write(make_request("gone", x, DType::kBF16, 2, DType::kBF16, "b")));
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.request_id(), "b");
  EXPECT_EQ(resp.status_code(), static_cast<int>(absl::StatusCode::kNotFound));
  // The stream survives: the demo layer still answers on it.
  const std::string xd = random_x(rng, 1, 64, DType::kBF16);
  ASSERT_TRUE(stream->write(make_request("demo", xd, DType::kBF16, 1, DType::kBF16, "c")));
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  stream->writes_done();
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());
  EXPECT_EQ(client_->unload_layer("gone").code(), absl::StatusCode::kNotFound);
}

TEST_F(ServerTest, ConcurrentInferenceWhileLayersChange) {
  SEED_TRACE();
  TestLayer t = load("hot", 32, 64, Scheme::kDynamicSymmetric);
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, not_found{0}, wrong{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      SplitMix64 rng(seed_ + w);
      while (!stop.load()) {
        const std::string x = random_x(rng, 3, 64, DType::kF32);
        auto r = client_->infer(make_request("hot", x, DType::kF32, 3, DType::kF32));
        if (r.ok()) {
          ++ok;
          if (r->y() != reference_y(t, x, DType::kF32, 3, DType::kF32)) ++wrong;
        } else if (r.status().code() == absl::StatusCode::kNotFound) {
          ++not_found;
        } else {
          ++wrong;
        }
      }
    });
  }
  // Unload, reload and replace (with the same weights, so every answer has one right value).
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(client_->unload_layer("hot").ok());
    ASSERT_TRUE(client_->load_layer(t.header, t.weights).ok());
    v1::LayerHeader h = t.header;
    h.set_replace(true);
    ASSERT_TRUE(client_->load_layer(h, t.weights).ok());
  }
  stop = true;
  for (auto& th : workers) th.join();
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
}

// Every INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION case of the error model, by code and
// message.
struct BadInfer {
  std::string what;
  std::function<void(v1::InferRequest*)> mutate;
  absl::StatusCode code;
  std::string message;
};

TEST_F(ServerTest, InferErrors) {
  SplitMix64 rng(1);
  const std::string x = random_x(rng, 2, 64, DType::kBF16);
  const std::vector<BadInfer> cases = {
      {"unknown layer", [](v1::InferRequest* r) { r->set_layer("missing"); },
       absl::StatusCode::kNotFound, "layer 'missing' not found"},
      {"empty layer name", [](v1::InferRequest* r) { r->set_layer(""); },
       absl::StatusCode::kInvalidArgument, "layer name is empty"},
      {"bad layer name", [](v1::InferRequest* r) { r->set_layer("a b"); },
       absl::StatusCode::kInvalidArgument, "characters outside"},
      {"no dtype", [](v1::InferRequest* r) { r->set_x_dtype(v1::DTYPE_UNSPECIFIED); },
       absl::StatusCode::kInvalidArgument, "x_dtype must be"},
      {"bad dtype", [](v1::InferRequest* r) { r->set_x_dtype(static_cast<v1::DType>(42)); },
       absl::StatusCode::kInvalidArgument, "x_dtype must be"},
      {"bad output dtype",
       [](v1::InferRequest* r) { r->set_output_dtype(static_cast<v1::DType>(9)); },
       absl::StatusCode::kInvalidArgument, "output_dtype must be"},
      {"m zero", [](v1::InferRequest* r) { r->set_m(0); }, absl::StatusCode::kInvalidArgument,
       "m must be >= 1"},
      {"m negative", [](v1::InferRequest* r) { r->set_m(-3); }, absl::StatusCode::kInvalidArgument,
       "m must be >= 1"},
      {"m huge", [](v1::InferRequest* r) { r->set_m(int64_t{1} << 60); },
       absl::StatusCode::kInvalidArgument, "x has 256 bytes; expected m*k*2"},
      {"x short", [](v1::InferRequest* r) { r->mutable_x()->resize(255); },
       absl::StatusCode::kInvalidArgument, "x has 255 bytes"},
      {"x for other dtype", [](v1::InferRequest* r) { r->set_x_dtype(v1::DTYPE_FP32); },
       absl::StatusCode::kInvalidArgument, "expected m*k*4"},
      {"non-finite",
       [](v1::InferRequest* r) {
         uint16_t nan = 0x7fc0;
         std::memcpy(r->mutable_x()->data() + 2 * (64 + 5), &nan, 2);
       },
       absl::StatusCode::kInvalidArgument, "x row 1 holds a non-finite value"},
      {"unknown forced kernel", [](v1::InferRequest* r) { r->set_forced_kernel("cpu.magic"); },
       absl::StatusCode::kInvalidArgument, "unknown kernel 'cpu.magic'"},
  };
  for (const BadInfer& c : cases) {
    SCOPED_TRACE(c.what);
    v1::InferRequest req = make_request("demo", x, DType::kBF16, 2, DType::kBF16);
    c.mutate(&req);
    auto r = client_->infer(req);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_NE(r.status().message().find(c.message), absl::string_view::npos) << r.status();
  }
}

TEST_F(ServerTest, OutputAboveMessageLimitIsResourceExhausted) {
  TestLayer t = load("wide", 40000, 16, Scheme::kDynamicSymmetric, false);
  SplitMix64 rng(2);
  const int64_t m = 60;  // 60 * 40000 * 4 bytes = 9.6 MB > 8 MiB
  const std::string x = random_x(rng, m, 16, DType::kF32);
  auto r = client_->infer(make_request("wide", x, DType::kF32, m, DType::kF32));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("send fewer rows"), absl::string_view::npos);
}

TEST_F(ServerTest, ForcedKernelPerRequestAndLayer) {
  SplitMix64 rng(3);
  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  v1::InferRequest req = make_request("demo", x, DType::kBF16, 1, DType::kBF16);
  req.set_forced_kernel("cpu.reference");
  req.set_explain(true);
  auto r = client_->infer(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->metadata().kernel(), "cpu.reference");
  ASSERT_GT(r->metadata().selection_size(), 0);

  TestLayer t = make_test_layer("forced", 8, 16, Scheme::kDynamicSymmetric, false, 4);
  t.header.set_forced_kernel("cpu.reference");
  auto l = client_->load_layer(t.header, t.weights);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->layer().forced_kernel(), "cpu.reference");
  t.header.set_name("forced2");
  t.header.set_forced_kernel("gpu.nonexistent");
  l = client_->load_layer(t.header, t.weights);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("unknown forced_kernel"), absl::string_view::npos);
}

// Kernels turned off by the operator (ServerOptions.disabled_kernels: --disabled-kernels and
// QLINEAR_DISABLED_KERNELS), here every kernel but cpu.reference: the listing marks exactly those
// disabled, with the reason; every bucket of a layer and every unforced request takes the
// reference; forcing one, per request or per layer, is FAILED_PRECONDITION saying it is disabled.
TEST(DisabledKernelsTest, DisabledKernelsAreListedNeverChosenAndCannotBeForced) {
  ServerOptions o = loopback_server_options();
  // (Names of GPU kernels are accepted without them compiled in: on a GPU host they go too.)
  for (const std::string& name : kernel_priority_order()) {
    if (name != "cpu.reference") o.disabled_kernels.push_back(name);
  }
  auto server = QLinearServer::start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  Client client("127.0.0.1:" + std::to_string((*server)->port()));
  auto kernels = client.list_kernels();
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  std::vector<std::string> disabled;
  for (const v1::KernelInfo& k : kernels->kernels()) {
    SCOPED_TRACE(k.name());
    if (k.name() == "cpu.reference") {
      EXPECT_FALSE(k.disabled());
      EXPECT_TRUE(k.supported());
      EXPECT_EQ(k.reason(), "");
      continue;
    }
    disabled.push_back(k.name());
    EXPECT_TRUE(k.disabled());
    EXPECT_FALSE(k.supported());
    EXPECT_EQ(k.reason(), "disabled by the operator");
  }
  EXPECT_EQ(std::vector<std::string>(kernels->disabled().begin(), kernels->disabled().end()),
            disabled);
  for (const char* cpu : {"cpu.amx", "cpu.avx512_vnni", "cpu.onednn", "cpu.avx2"}) {
    EXPECT_EQ(std::count(disabled.begin(), disabled.end(), cpu), 1) << cpu;
  }

  auto info = client.describe_layer("demo");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->buckets_size(), static_cast<int>(m_buckets().size()));
  for (const auto& b : info->buckets()) EXPECT_EQ(b.kernel(), "cpu.reference") << b.m_min();
  EXPECT_EQ(info->device(), "cpu");
  SplitMix64 rng(13);
  const std::string x = random_x(rng, 5, 64, DType::kBF16);
  v1::InferRequest req = make_request("demo", x, DType::kBF16, 5, DType::kBF16);
  auto r = client.infer(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->metadata().kernel(), "cpu.reference");

  TestLayer t = make_test_layer("forced", 16, 64, Scheme::kDynamicSymmetric, false, 5);
  for (const std::string& name : disabled) {
    SCOPED_TRACE(name);
    req.set_forced_kernel(name);
    r = client.infer(req);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_EQ(r.status().message(),
              "forced kernel " + name + " cannot run this request: disabled by the operator");
    t.header.set_forced_kernel(name);
    auto l = client.load_layer(t.header, t.weights);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition) << l.status();
    EXPECT_EQ(l.status().message(),
              "forced kernel " + name + " cannot run this layer: disabled by the operator");
  }
}

struct BadHeader {
  std::string what;
  std::function<void(v1::LayerHeader*)> mutate;
  absl::StatusCode code;
  std::string message;
};

TEST_F(ServerTest, LoadErrors) {
  const std::vector<BadHeader> cases = {
      {"empty name", [](v1::LayerHeader* h) { h->set_name(""); },
       absl::StatusCode::kInvalidArgument, "layer name is empty"},
      {"long name", [](v1::LayerHeader* h) { h->set_name(std::string(129, 'a')); },
       absl::StatusCode::kInvalidArgument, "limit is 128"},
      {"zero n", [](v1::LayerHeader* h) { h->set_n(0); }, absl::StatusCode::kInvalidArgument,
       "n and k must be positive"},
      {"k too big", [](v1::LayerHeader* h) { h->set_k(131072); },
       absl::StatusCode::kInvalidArgument, "exceeds 131071"},
      {"bad scheme", [](v1::LayerHeader* h) { h->set_scheme(static_cast<v1::Scheme>(17)); },
       absl::StatusCode::kInvalidArgument, "unknown scheme"},
      {"no scale", [](v1::LayerHeader* h) { h->clear_weight_scale(); },
       absl::StatusCode::kInvalidArgument, "weight_scale is required"},
      {"scale count",
       [](v1::LayerHeader* h) {
         h->mutable_weight_scale()->clear_shape();
         h->mutable_weight_scale()->mutable_data()->resize(12);
       },
       absl::StatusCode::kInvalidArgument, "weight_scale has 3 values"},
      {"scale bytes",
       [](v1::LayerHeader* h) { h->mutable_weight_scale()->mutable_data()->pop_back(); },
       absl::StatusCode::kInvalidArgument, "not a multiple of 4"},
      {"bias length",
       [](v1::LayerHeader* h) {
         h->mutable_bias()->set_dtype(v1::DTYPE_FP32);
         h->mutable_bias()->set_data(std::string(12, '\0'));
       },
       absl::StatusCode::kInvalidArgument, "bias has 3 values, expected n=8"},
      {"static needs scale", [](v1::LayerHeader* h) { h->set_scheme(v1::SCHEME_STATIC_SYMMETRIC); },
       absl::StatusCode::kInvalidArgument, "requires input_scale"},
      {"dynamic refuses scale", [](v1::LayerHeader* h) { h->set_input_scale(0.1f); },
       absl::StatusCode::kInvalidArgument, "input_scale is given"},
      {"bad checksum format", [](v1::LayerHeader* h) { h->set_weight_sha256("abc"); },
       absl::StatusCode::kInvalidArgument, "weight_sha256 must be"},
      {"duplicate", [](v1::LayerHeader* h) { h->set_name("demo"); },
       absl::StatusCode::kAlreadyExists, "already exists"},
      {"logical widths",
       [](v1::LayerHeader* h) {
         h->add_logical_widths(3);
         h->add_logical_widths(3);
       },
       absl::StatusCode::kInvalidArgument, "sum to 6, not n=8"},
      {"bias shape without data",
       [](v1::LayerHeader* h) {
         h->mutable_bias()->set_dtype(v1::DTYPE_FP32);
         h->mutable_bias()->add_shape(8);
       },
       absl::StatusCode::kInvalidArgument, "bias has 0 values but shape [8] says 8"},
      // Quoted in the message, 10000 dimensions would overflow gRPC's metadata: the message is
      // cut, the code kept.
      {"scale shape of 10000 dimensions",
       [](v1::LayerHeader* h) {
         h->mutable_weight_scale()->clear_shape();
         for (int i = 0; i < 10000; ++i) h->mutable_weight_scale()->add_shape(1);
         h->mutable_weight_scale()->set_data(std::string(4, '\0'));
       },
       absl::StatusCode::kInvalidArgument, "bytes in all)"},
  };
  for (const BadHeader& c : cases) {
    SCOPED_TRACE(c.what);
    TestLayer t = make_test_layer("e", 8, 16, Scheme::kDynamicSymmetric, false, 9);
    c.mutate(&t.header);
    auto r = client_->load_layer(t.header, t.weights);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_NE(r.status().message().find(c.message), absl::string_view::npos) << r.status();
    EXPECT_LE(r.status().message().size(), kMaxStatusMessageBytes);
  }
  // A header-less upload and a chunk-before-header upload.
  {
    grpc::ClientContext ctx;
    v1::LoadLayerResponse resp;
    auto w = client_->stub().LoadLayer(&ctx, &resp);
    v1::LoadLayerRequest msg;
    msg.set_weight_chunk("xx");
    w->Write(msg);
    w->WritesDone();
    grpc::Status s = w->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("first message"), std::string::npos);
  }
  {
    TestLayer t = make_test_layer("over", 8, 16, Scheme::kDynamicSymmetric, false, 9);
    t.weights.push_back(1);  // one byte too many
    t.header.set_weight_sha256(sha256_hex(t.weights.data(), t.weights.size()));
    auto r = client_->load_layer(t.header, t.weights);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("weight bytes exceed"), absl::string_view::npos);
  }
  {
    // 2^20 x 131071 bytes (137 GB) of weights: refused at the header, before any data.
    TestLayer t = make_test_layer("huge", 8, 16, Scheme::kDynamicSymmetric, false, 9);
    t.header.set_n(1 << 20);
    t.header.set_k(131071);
    t.header.mutable_weight_scale()->clear_shape();
    t.header.mutable_weight_scale()->set_data(std::string(4, '\0'));
    auto r = client_->load_layer(t.header, {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    EXPECT_NE(r.status().message().find("bytes of host memory"), absl::string_view::npos);
  }
  EXPECT_EQ(client_->unload_layer("nothing").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->describe_layer("nothing").status().code(), absl::StatusCode::kNotFound);
  // Nothing from the failures is listed.
  auto layers = client_->list_layers();
  ASSERT_TRUE(layers.ok());
  ASSERT_EQ(layers->layers_size(), 1);
  EXPECT_EQ(layers->layers(0).name(), "demo");
}

TEST_F(ServerTest, WeightScaleFormsAndPartitions) {
  SEED_TRACE();
  SplitMix64 rng(seed_);
  // [1, N], [N, 1], per tensor [1], scalar [] and per partition: all give the reference's answer
  // for the expanded per-channel scale.
  struct Form {
    std::vector<int64_t> shape;
    std::vector<int64_t> widths;
    int count;
  };
  const std::vector<Form> forms = {
      {{1, 12}, {}, 12}, {{12, 1}, {}, 12}, {{1}, {}, 1}, {{}, {}, 1}, {{3}, {6, 4, 2}, 3}};
  int i = 0;
  for (const Form& f : forms) {
    ++i;
    TestLayer t = make_test_layer("f" + std::to_string(i), 12, 20, Scheme::kDynamicSymmetric, true,
                                  seed_ + i);
    std::vector<float> sc = random_floats(rng, f.count, 1e-3f, 2e-3f);
    auto* ws = t.header.mutable_weight_scale();
    ws->clear_shape();
    for (int64_t d : f.shape) ws->add_shape(d);
    ws->set_data(sc.data(), 4 * sc.size());
    for (int64_t w : f.widths) t.header.add_logical_widths(w);
    t.spec.weight_scale = sc;
    t.spec.weight_scale_shape = f.shape;
    t.spec.logical_widths = f.widths;
    auto r = client_->load_layer(t.header, t.weights);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::string x = random_x(rng, 4, 20, DType::kF16);
    auto y = client_->infer(make_request(t.header.name(), x, DType::kF16, 4, DType::kF32));
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->y(), reference_y(t, x, DType::kF16, 4, DType::kF32)) << t.header.name();
  }
}

// Deadlines as clients send them: one centuries away (past what a nanosecond time_point holds,
// as some clients send for "none") is served; one already past is DEADLINE_EXCEEDED.
TEST_F(ServerTest, FarAndPastDeadlines) {
  SplitMix64 rng(12);
  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  const v1::InferRequest req = make_request("demo", x, DType::kBF16, 1, DType::kBF16);
  {
    grpc::ClientContext ctx;
    gpr_timespec far = gpr_now(GPR_CLOCK_REALTIME);
    far.tv_sec += int64_t{400} * 365 * 86400;
    ctx.set_deadline(far);
    v1::InferResponse resp;
    const grpc::Status s = client_->stub().Infer(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
    EXPECT_EQ(resp.y().size(), 2u * resp.n());
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() - std::chrono::seconds(1));
    v1::InferResponse resp;
    const grpc::Status s = client_->stub().Infer(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  }
}

// A client's timeouts longer than the clock can count from now (as callers pass for "none") are
// no deadline: every kind of call is served. now + timeout would wrap around: for the largest
// timeout to just before now, every call failing at once with DEADLINE_EXCEEDED.
TEST_F(ServerTest, ClientTimeoutsPastTheClocksRangeAreNone) {
  SplitMix64 rng(13);
  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  const v1::InferRequest req = make_request("demo", x, DType::kBF16, 1, DType::kBF16);
  // About 250 years (past what a nanosecond time_point holds from now), and the largest.
  for (const std::chrono::milliseconds timeout :
       {std::chrono::milliseconds(int64_t{8'000'000'000'000}), std::chrono::milliseconds::max()}) {
    SCOPED_TRACE(absl::StrCat("timeout ", timeout.count(), " ms"));
    ClientOptions co;
    co.call_timeout = timeout;
    co.upload_timeout = timeout;
    Client c("127.0.0.1:" + std::to_string(server_->port()), co);
    auto layers = c.list_layers();
    EXPECT_TRUE(layers.ok()) << layers.status();
    auto y = c.infer(req);
    EXPECT_TRUE(y.ok()) << y.status();
    auto y2 = client_->infer(req, timeout);
    EXPECT_TRUE(y2.ok()) << y2.status();
    TestLayer t = make_test_layer("far", 16, 64, Scheme::kDynamicSymmetric, false, 9);
    t.header.set_replace(true);
    auto loaded = c.load_layer(t.header, t.weights);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    auto stream = c.open_stream(timeout);
    EXPECT_TRUE(stream->write(req));
    v1::InferResponse resp;
    EXPECT_TRUE(stream->read(&resp));
    EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
    stream->writes_done();
    EXPECT_TRUE(stream->finish().ok());
  }
}

TEST_F(ServerTest, DrainingRejectsNewCallsWithUnavailable) {
  // New calls are refused. While a call in flight (an upload) holds the drain, a stream opened
  // before it ends at its next message, which is not run, with UNAVAILABLE, and the upload
  // completes. Then the drain ends at once, not at its deadline: the stream left open without a
  // message in flight ends with UNAVAILABLE.
  SplitMix64 rng(5);
  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  v1::InferResponse resp;
  auto stream = client_->open_stream();
  ASSERT_TRUE(stream->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16, "before")));
  ASSERT_TRUE(stream->read(&resp));
  auto idle = client_->open_stream();
  ASSERT_TRUE(idle->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16, "idle")));
  ASSERT_TRUE(idle->read(&resp));
  // Both streams wait for their next message, and nothing is in flight.
  const auto settled = [&](int in_flight, int idle_streams) {
    for (int i = 0; i < 500; ++i) {
      if (server_->calls_in_flight() == in_flight && server_->idle_streams() == idle_streams) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(settled(0, 2));
  const TestLayer t = make_test_layer("drained", 64, 256, Scheme::kDynamicSymmetric, true, seed_++);
  grpc::ClientContext upload_ctx;
  v1::LoadLayerResponse upload_resp;
  auto upload = start_upload(t, &upload_ctx, &upload_resp);
  ASSERT_NE(upload, nullptr);
  ASSERT_TRUE(settled(1, 2));  // (the upload's handler runs)

  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point stopped;
  std::thread stopper([&] {
    server_->shutdown(std::chrono::milliseconds(8000));
    stopped = std::chrono::steady_clock::now();
  });
  // (Past kDrainIdleSettle: the upload holds the drain, so the stream is still open.)
  std::this_thread::sleep_for(kDrainIdleSettle + std::chrono::milliseconds(300));
  auto r = client_->infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  stream->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16, "during"));
  EXPECT_FALSE(stream->read(&resp));
  const absl::Status ended = stream->finish();
  EXPECT_EQ(ended.code(), absl::StatusCode::kUnavailable) << ended;
  EXPECT_EQ(ended.message(),
            "server is shutting down; request 'during' and any after it on this stream were not "
            "run");

  v1::LoadLayerRequest rest;
  rest.set_weight_chunk(
      std::string(reinterpret_cast<const char*>(t.weights.data()) + 4096, t.weights.size() - 4096));
  EXPECT_TRUE(upload->Write(rest));
  upload->WritesDone();
  const grpc::Status uploaded = upload->Finish();
  EXPECT_TRUE(uploaded.ok()) << uploaded.error_message();
  const auto upload_done = std::chrono::steady_clock::now();

  EXPECT_FALSE(idle->read(&resp));
  const absl::Status idle_ended = idle->finish();
  EXPECT_EQ(idle_ended.code(), absl::StatusCode::kUnavailable) << idle_ended;
  stopper.join();
  const auto ms = [](auto d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  // The upload held the drain; the idle stream did not (the deadline was 8 s away).
  EXPECT_GE(ms(stopped - t0), ms(upload_done - t0) - 50);
  EXPECT_LT(ms(stopped - upload_done), 3000) << "the drain waited for an idle stream";
}

// A client trickling its request in one byte at a time holds the metrics port's thread for 2 s at
// most: /healthz still answers within the probe's timeout.
TEST_F(ServerTest, ASlowMetricsClientDoesNotHoldUpLiveness) {
  const int fd = connect_loopback(server_->metrics_port());
  ASSERT_GE(fd, 0);
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (int i = 0; i < 40 && !stop.load(); ++i) {
      if (write(fd, "G", 1) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string live = http_get(server_->metrics_port(), "/healthz");
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  trickle.join();
  close(fd);
  EXPECT_NE(live.find("200 OK"), std::string::npos) << live;
  EXPECT_LT(took_s, 4.0) << "the trickling client held the thread";
}

// Clients that connect to the metrics port and send nothing hold up no one: /healthz is answered
// at once beside 64 of them (it waited 2 s behind each), which fill every place (it ends the
// oldest), and the others are answered as they stand (405: they asked for nothing) and dropped
// after their own 2 s.
TEST_F(ServerTest, SilentMetricsClientsDoNotHoldUpLiveness) {
  std::vector<int> silent;
  const auto first = std::chrono::steady_clock::now();
  for (int i = 0; i < 64; ++i) {
    silent.push_back(connect_loopback(server_->metrics_port()));
    ASSERT_GE(silent.back(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  // Whether every silent client still held its place when /healthz came (their 2 s run from when
  // the server took them, after `first`).
  const bool all_waiting = t0 - first < std::chrono::milliseconds(1500);
  const std::string live = http_get(server_->metrics_port(), "/healthz");
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(live.find("200 OK"), std::string::npos) << live;
  // (Served one after another, it waited 2 s behind each: over two minutes.)
  EXPECT_LT(took_s, 5.0) << "/healthz waited behind the silent clients";
  int answered = 0;
  for (int fd : silent) {
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string answer;
    char buf[1024];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) answer.append(buf, static_cast<size_t>(n));
    close(fd);
    if (answer.find("405 Method Not Allowed") != std::string::npos) ++answered;
  }
  if (all_waiting) {
    EXPECT_EQ(answered, 63) << "one silent client makes way for /healthz, the others are answered";
  } else {
    EXPECT_GE(answered, 63);
  }
  const double all_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(all_s, 15.0) << "the silent clients were not dropped at their own deadlines";
}

// /readyz follows the gRPC health status: 200 while serving, 503 once the server stops serving
// (the delay before a drain), while /healthz stays 200.
TEST_F(ServerTest, ReadinessOnTheMetricsPortFollowsTheHealthStatus) {
  const std::string ready = http_get(server_->metrics_port(), "/readyz");
  EXPECT_NE(ready.find("200 OK"), std::string::npos) << ready;
  EXPECT_NE(ready.find("\r\n\r\nserving\n"), std::string::npos) << ready;
  server_->stop_serving_health();
  const std::string stopping = http_get(server_->metrics_port(), "/readyz");
  EXPECT_NE(stopping.find("503 Service Unavailable"), std::string::npos) << stopping;
  EXPECT_NE(stopping.find("stopping: the server is shutting down"), std::string::npos) << stopping;
  auto health = client_->health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_FALSE(*health);
  const std::string live = http_get(server_->metrics_port(), "/healthz");
  EXPECT_NE(live.find("200 OK"), std::string::npos) << live;
  const std::string other = http_get(server_->metrics_port(), "/other");
  EXPECT_NE(other.find("404 Not Found"), std::string::npos) << other;
  EXPECT_NE(other.find("readiness at /readyz"), std::string::npos) << other;
}

// A device fault (a CUDA context lost to an illegal address, say) takes the server out of service
// for good: gRPC health NOT_SERVING, /readyz and /healthz 503 with the fault, so that the process
// is restarted; calls to CPU layers are still answered meanwhile.
TEST_F(ServerTest, ADeviceFaultFailsHealthAndLiveness) {
  ASSERT_TRUE(*client_->health());
  EXPECT_NE(server_->metrics().serialize().find("\nqlinear_device_fault 0\n"), std::string::npos);
  report_device_fault("cuda:0: cudaErrorIllegalAddress (a test)");
  EXPECT_NE(server_->metrics().serialize().find("\nqlinear_device_fault 1\n"), std::string::npos);
  auto health = client_->health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_FALSE(*health);
  const std::string live = http_get(server_->metrics_port(), "/healthz");
  EXPECT_NE(live.find("503 Service Unavailable"), std::string::npos) << live;
  EXPECT_NE(live.find("device fault: cuda:0: cudaErrorIllegalAddress (a test)"), std::string::npos)
      << live;
  const std::string ready = http_get(server_->metrics_port(), "/readyz");
  EXPECT_NE(ready.find("503 Service Unavailable"), std::string::npos) << ready;
  EXPECT_NE(ready.find("device fault: "), std::string::npos) << ready;
  SplitMix64 rng(8);
  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  auto served = client_->infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
  EXPECT_TRUE(served.ok()) << served.status();
  clear_device_fault_for_testing();
}

// The responder's liveness check: /healthz answers 503 with its reason while it gives one, 200
// again after.
TEST(LivenessTest, TheLivenessCheckFailsHealthzWithItsReason) {
  std::atomic<bool> stuck{false};
  auto http = MetricsHttpServer::start(
      "127.0.0.1", 0, std::make_shared<prometheus::Registry>(),
      [&]() -> std::string { return stuck.load() ? "stuck: a batch of layer 'x'" : ""; });
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  EXPECT_NE(http_get(port, "/healthz").find("200 OK"), std::string::npos);
  stuck = true;
  const std::string failing = http_get(port, "/healthz");
  EXPECT_NE(failing.find("503 Service Unavailable"), std::string::npos) << failing;
  EXPECT_NE(failing.find("\r\n\r\nstuck: a batch of layer 'x'\n"), std::string::npos) << failing;
  stuck = false;
  EXPECT_NE(http_get(port, "/healthz").find("200 OK"), std::string::npos);
}

// A client that asks for a large /metrics body and then reads it a little at a time is dropped
// once the answer has taken 5 s to send, so that /healthz, answered on the same thread, still
// answers.
TEST(LivenessTest, ASlowReaderOfALargeScrapeDoesNotHoldUpLiveness) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildGauge().Name("qlinear_test_series").Register(*registry);
  // About 6 MB of text: more than the loopback socket buffers hold.
  for (int i = 0; i < 60000; ++i) {
    family.Add({{"series", absl::StrCat("a-long-label-value-to-make-the-body-large-", i)}}).Set(i);
  }
  auto http = MetricsHttpServer::start("127.0.0.1", 0, registry);
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();

  const int fd = connect_loopback(port, 4096);
  ASSERT_GE(fd, 0);
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> received{0};
  std::thread slow([&] {
    // 16 KB/s: each of the server's sends makes some progress within a second or so.
    char buf[4096];
    while (!stop.load()) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      received += n;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  const auto t0 = std::chrono::steady_clock::now();
  const std::string live = http_get(port, "/healthz");
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  shutdown(fd, SHUT_RDWR);
  slow.join();
  close(fd);
  EXPECT_NE(live.find("200 OK"), std::string::npos) << live;
  EXPECT_LT(took_s, 9.0) << "the slow reader held the thread";
  EXPECT_LT(received.load(), 5 << 20) << "the slow reader was sent the whole body";
}

// A client that writes its whole request, the head and then the body in pieces, before it reads
// the answer (as HTTP clients do): the answer to a request the responder does not read whole (a
// POST's body, or a head past its cap) still comes back, with neither the client's writes nor
// its read reset.
TEST(MetricsHttpTest, ARequestNotReadWholeIsStillAnsweredWithoutAReset) {
  auto http = MetricsHttpServer::start("127.0.0.1", 0, std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  const struct {
    std::string head, body, status;
  } cases[] = {
      {"POST /metrics HTTP/1.0\r\nContent-Length: 65536\r\n\r\n", std::string(64 << 10, 'b'),
       "HTTP/1.0 405 Method Not Allowed\r\n"},
      // A head over the 8 KiB read: answered from its request line.
      {"GET /healthz HTTP/1.0\r\nX-Long: ", std::string(32 << 10, 'h'), "HTTP/1.0 200 OK\r\n"},
  };
  for (const auto& c : cases) {
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE(c.status + " round " + std::to_string(round));
      const int fd = connect_loopback(port);
      ASSERT_GE(fd, 0);
      timeval tv{20, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      std::string error;
      if (send(fd, c.head.data(), c.head.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(c.head.size())) {
        error = absl::StrCat("writing the head: ", std::strerror(errno));
      }
      // The body in 4 KiB pieces a millisecond apart: the answer is sent meanwhile.
      for (size_t at = 0; error.empty() && at < c.body.size(); at += 4096) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const size_t n = std::min<size_t>(4096, c.body.size() - at);
        if (send(fd, c.body.data() + at, n, MSG_NOSIGNAL) != static_cast<ssize_t>(n)) {
          error = absl::StrCat("writing the body at byte ", at, ": ", std::strerror(errno));
        }
      }
      std::string answer;
      char buf[4096];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) answer.append(buf, static_cast<size_t>(n));
      if (n < 0 && error.empty()) error = absl::StrCat("reading: ", std::strerror(errno));
      close(fd);
      EXPECT_EQ(error, "");
      EXPECT_TRUE(absl::StartsWith(answer, c.status)) << answer;
    }
  }
  // And the responder serves on.
  EXPECT_NE(http_get(port, "/healthz").find("200 OK"), std::string::npos);
}

// The lowest file descriptor number free in this process: with RLIMIT_NOFILE set to it, no new
// descriptor can be made (and poll() still takes that many).
int lowest_free_fd() {
  const int fd = dup(0);
  if (fd >= 0) close(fd);
  return fd;
}

// A process out of file descriptors: the responder, unable to accept a waiting connection, tries
// again a little later instead of polling the listening socket in a loop (which kept a core busy
// for as long as the descriptors were short). Run in a child process.
TEST(MetricsHttpTest, AcceptFailingForWantOfDescriptorsDoesNotSpin) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto out_of_descriptors = [] {
    auto http = MetricsHttpServer::start("127.0.0.1", 0, std::make_shared<prometheus::Registry>());
    if (!http.ok()) {
      std::fprintf(stderr, "%s\n", http.status().ToString().c_str());
      _exit(2);
    }
    const int client = socket(AF_INET, SOCK_STREAM, 0);
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = static_cast<rlim_t>(lowest_free_fd());
    if (client < 0 || setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      std::fprintf(stderr, "cannot lower RLIMIT_NOFILE: %s\n", std::strerror(errno));
      _exit(2);
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((*http)->port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      std::fprintf(stderr, "connect: %s\n", std::strerror(errno));
      _exit(2);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto cpu_s = [] {
      timespec t{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
    };
    const double before = cpu_s();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const double used = cpu_s() - before;
    std::fprintf(stderr, "CPU time over 1 s with accept failing: %.3f s\n", used);
    _exit(used < 0.3 ? 0 : 1);
  };
  EXPECT_EXIT(out_of_descriptors(), ::testing::ExitedWithCode(0),
              "CPU time over 1 s with accept failing");
}

// A socket that cannot be made is reported with its own error (errno was read after a
// setsockopt on the failed descriptor, and said "Bad file descriptor"). Run in a child process.
TEST(MetricsHttpTest, ASocketThatCannotBeMadeIsReportedWithItsError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto out_of_descriptors = [] {
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = static_cast<rlim_t>(lowest_free_fd());
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      std::fprintf(stderr, "cannot lower RLIMIT_NOFILE: %s\n", std::strerror(errno));
      _exit(2);
    }
    auto http = MetricsHttpServer::start("127.0.0.1", 0, std::make_shared<prometheus::Registry>());
    std::fprintf(stderr, "start: %s\n", http.status().ToString().c_str());
    _exit(http.ok() ? 1 : 0);
  };
  EXPECT_EXIT(out_of_descriptors(), ::testing::ExitedWithCode(0),
              "start: UNAVAILABLE: cannot serve metrics on 127.0.0.1:0: " +
                  std::string(std::strerror(EMFILE)));
}

// A metrics port another socket holds on the first address a name resolves to fails the start
// with that address's error, rather than being served quietly on the name's next address (of
// the other family). Needs "localhost" to resolve to both families here.
TEST(MetricsHttpTest, APortInUseOnTheFirstAddressIsNotServedOnAnother) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  ASSERT_EQ(getaddrinfo("localhost", "0", &hints, &res), 0);
  bool two_families = false;
  for (const addrinfo* ai = res->ai_next; ai != nullptr; ai = ai->ai_next) {
    two_families = two_families || ai->ai_family != res->ai_family;
  }
  if (!two_families) {
    freeaddrinfo(res);
    GTEST_SKIP() << "\"localhost\" resolves to one address family here";
  }
  const int holder = socket(res->ai_family, SOCK_STREAM, 0);
  const bool held =
      holder >= 0 && bind(holder, res->ai_addr, res->ai_addrlen) == 0 && listen(holder, 1) == 0;
  freeaddrinfo(res);
  ASSERT_TRUE(held) << std::strerror(errno);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ASSERT_EQ(getsockname(holder, reinterpret_cast<sockaddr*>(&bound), &len), 0);
  const int port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  auto http = MetricsHttpServer::start("localhost", port, std::make_shared<prometheus::Registry>());
  close(holder);
  ASSERT_FALSE(http.ok()) << "served on port " << (*http)->port() << " beside the holder";
  EXPECT_EQ(http.status().code(), absl::StatusCode::kUnavailable) << http.status();
  EXPECT_TRUE(absl::StrContains(http.status().message(), std::strerror(EADDRINUSE)))
      << http.status();
}

// An IPv6 address, bare or in brackets, serves gRPC and the metrics port (":::50051" could not be
// split by gRPC, and the metrics socket could not resolve "[::1]").
TEST(AddressTest, AnIpv6AddressServesGrpcAndMetrics) {
  {
    const int probe = socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    const bool ipv6 = probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (probe >= 0) close(probe);
    if (!ipv6) GTEST_SKIP() << "this host has no IPv6 loopback";
  }
  for (const std::string address : {"::1", "[::1]"}) {
    SCOPED_TRACE(address);
    ServerOptions o = loopback_server_options();
    o.address = address;
    o.metrics_port = testing::free_port();
    auto server = QLinearServer::start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    Client client("[::1]:" + std::to_string((*server)->port()));
    auto health = client.health();
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_TRUE(*health);
    const int fd = socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 m{};
    m.sin6_family = AF_INET6;
    m.sin6_addr = in6addr_loopback;
    m.sin6_port = htons((*server)->metrics_port());
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&m), sizeof(m)), 0) << std::strerror(errno);
    timeval tv{20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const std::string req = "GET /healthz HTTP/1.0\r\n\r\n";
    ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
    std::string answer;
    char buf[1024];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) answer.append(buf, static_cast<size_t>(n));
    close(fd);
    EXPECT_NE(answer.find("200 OK"), std::string::npos) << answer;
  }
}

// Inference requests and uploads take at most the server's call slots (with 8 threads, 4): with
// every slot held by an upload, one more upload, an Infer call, an Echo and a stream's message are
// RESOURCE_EXHAUSTED, saying so (the stream's in its answer, the stream going on), while health
// checks and listings are still answered; a slot freed serves again.
TEST(CallSlotsTest, WorkBeyondTheSlotsIsRefusedAndHealthStillAnswers) {
  ServerOptions o = loopback_server_options();
  o.max_threads = 8;
  o.metrics_port = testing::free_port();
  o.enable_echo = true;
  const int slots = call_slots_for(o.max_threads).max_calls;
  ASSERT_EQ(slots, 4);
  auto server = QLinearServer::start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  Client client("127.0.0.1:" + std::to_string((*server)->port()));
  SplitMix64 rng(4);
  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  // Uploads held open after their header and first bytes, each holding a slot and a thread.
  struct Upload {
    TestLayer layer;
    grpc::ClientContext ctx;
    v1::LoadLayerResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::LoadLayerRequest>> writer;
  };
  // (`held`: the writes must succeed; one refused may find its call already ended by the server.)
  auto start_upload = [&](int i, bool held) {
    auto u = std::make_unique<Upload>();
    u->layer = make_test_layer("held" + std::to_string(i), 16, 4096, Scheme::kDynamicSymmetric,
                               false, 40 + i);
    u->writer = client.stub().LoadLayer(&u->ctx, &u->resp);
    v1::LoadLayerRequest msg;
    *msg.mutable_header() = u->layer.header;
    const bool header = u->writer->Write(msg);
    msg.set_weight_chunk(std::string(reinterpret_cast<const char*>(u->layer.weights.data()), 4096));
    const bool chunk = header && u->writer->Write(msg);
    if (held) {
      EXPECT_TRUE(header && chunk) << "upload " << i;
    }
    return u;
  };
  std::vector<std::unique_ptr<Upload>> uploads;
  for (int i = 0; i < slots; ++i) uploads.push_back(start_upload(i, true));
  for (int i = 0; i < 500 && (*server)->calls_in_flight() < slots; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ((*server)->calls_in_flight(), slots) << "the uploads' handlers did not all start";

  const std::string busy = absl::StrCat("server busy: all ", slots,
                                        " slots for inference requests and uploads are taken "
                                        "(qlinear-server --threads=8 keeps 4 threads for health "
                                        "checks and layer management); retry later");
  {
    auto extra = start_upload(slots, false);
    extra->writer->WritesDone();
    const grpc::Status s = extra->writer->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_EQ(s.error_message(), busy);
  }
  auto unary = client.infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
  EXPECT_EQ(unary.status().code(), absl::StatusCode::kResourceExhausted) << unary.status();
  EXPECT_EQ(unary.status().message(), busy);
  {
    v1::EchoRequest req;
    req.set_response_bytes(1024);
    v1::EchoResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status echo = client.stub().Echo(&ctx, req, &resp);
    EXPECT_EQ(echo.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << echo.error_message();
    EXPECT_EQ(echo.error_message(), busy);
  }
  auto stream = client.open_stream();
  ASSERT_TRUE(stream->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16, "busy")));
  v1::InferResponse resp;
  ASSERT_TRUE(stream->read(&resp)) << "the stream ended instead of answering its message";
  EXPECT_EQ(resp.status_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(resp.status_message(), busy);
  EXPECT_EQ(resp.request_id(), "busy");
  EXPECT_TRUE(resp.y().empty());
  // Both inference refusals are among the failed requests, by code: the overload an operator
  // watches for.
  {
    const std::string text = http_get((*server)->metrics_port(), "/metrics");
    double refused = 0;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (!absl::StartsWith(line, "qlinear_requests_total{code=\"RESOURCE_EXHAUSTED\"")) continue;
      double v = 0;
      ASSERT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) << line;
      refused += v;
    }
    EXPECT_EQ(refused, 2) << text;
  }
  auto health = client.health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_TRUE(*health);
  auto layers = client.list_layers();
  ASSERT_TRUE(layers.ok()) << layers.status();
  EXPECT_EQ(layers->layers_size(), 1);

  // One upload completes: its slot serves the stream's next message and a call.
  {
    Upload& u = *uploads.back();
    v1::LoadLayerRequest rest;
    rest.set_weight_chunk(std::string(reinterpret_cast<const char*>(u.layer.weights.data()) + 4096,
                                      u.layer.weights.size() - 4096));
    EXPECT_TRUE(u.writer->Write(rest));
    u.writer->WritesDone();
    const grpc::Status s = u.writer->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    uploads.pop_back();
  }
  ASSERT_TRUE(stream->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16, "served")));
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  EXPECT_EQ(resp.request_id(), "served");
  EXPECT_FALSE(resp.y().empty());
  stream->writes_done();
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());
  auto again = client.infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
  EXPECT_TRUE(again.ok()) << again.status();
  for (auto& u : uploads) {
    u->ctx.TryCancel();
    EXPECT_EQ(u->writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
}

// A unary call through a generic stub whose answer its client reads only when told: the server's
// send of a large answer waits on the stream's flow-control window until then.
class UnreadCall {
 public:
  UnreadCall(grpc::GenericStub* stub, const std::string& method,
             const google::protobuf::Message& request) {
    call_ = stub->PrepareCall(&ctx_, method, &cq_);
    call_->StartCall(tag(1));
    next(1);
    const std::string bytes = request.SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call_->Write(buffer, tag(2));
    next(2);
    call_->WritesDone(tag(3));
    next(3);
  }
  ~UnreadCall() {
    cq_.Shutdown();
    void* t;
    bool ok;
    while (cq_.Next(&t, &ok)) {
    }
  }
  // Reads the answer into `response`, then the call's status.
  grpc::Status read(google::protobuf::Message* response) {
    grpc::ByteBuffer buffer;
    call_->Read(&buffer, tag(4));
    if (next(4)) {
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(buffer.Dump(&slices).ok());
      std::string bytes;
      for (const grpc::Slice& sl : slices) {
        bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
      EXPECT_TRUE(response->ParseFromString(bytes));
    }
    return finish();
  }
  grpc::Status cancel() {
    ctx_.TryCancel();
    return finish();
  }

 private:
  static void* tag(intptr_t i) { return reinterpret_cast<void*>(i); }
  bool next(intptr_t want) {
    void* t = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq_.Next(&t, &ok));
    EXPECT_EQ(t, tag(want));
    return ok;
  }
  grpc::Status finish() {
    grpc::Status s;
    call_->Finish(&s, tag(5));
    next(5);
    return s;
  }

  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
};

// An answer being sent holds its call's thread after its handler returns, and a slow one counts
// against the slots: with every slot of a server (8 threads, 4 slots) taken by an Echo or Infer
// whose large answer its client does not read, further calls are RESOURCE_EXHAUSTED, saying why,
// for as long as the answers wait (not only while the handlers run), health checks are answered,
// and the answers, once read, are whole; read or cancelled, the calls give their slots back.
TEST(CallSlotsTest, ASlowlyReadAnswerCountsAgainstTheSlots) {
  ServerOptions o = loopback_server_options(8192, 64);
  o.max_threads = 8;
  o.enable_echo = true;
  auto server = QLinearServer::start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  Client client(address);
  // The slow client's window stays at its initial 64 KB (no window growth from bandwidth probes).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  args.SetMaxReceiveMessageSize(-1);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  SplitMix64 rng(9);
  constexpr int64_t kEchoBytes = int64_t{32} << 20;
  constexpr int64_t kRows = 1024;  // y: 1024 x 8192 bf16, 16 MB
  v1::EchoRequest big_echo;
  big_echo.set_response_bytes(kEchoBytes);
  const v1::InferRequest big_infer = make_request("demo", random_x(rng, kRows, 64, DType::kBF16),
                                                  DType::kBF16, kRows, DType::kBF16);
  std::vector<std::unique_ptr<UnreadCall>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::make_unique<UnreadCall>(&stub, "/qlinear.v1.QLinear/Echo", big_echo));
  }
  calls.push_back(std::make_unique<UnreadCall>(&stub, "/qlinear.v1.QLinear/Infer", big_infer));
  for (int i = 0; i < 500 && (*server)->calls_in_flight() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ((*server)->calls_in_flight(), 4) << "the four calls did not all start";

  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  // The Echo handlers return at once and the Infer's within its GEMM; their answers wait on the
  // client, and count against the slots once they have been sent for kSlowSend. (The handlers
  // start as the server's threads get to them: on a loaded host, later.) Until all four are, a
  // handler that has just returned leaves a slot free for kSlowSend.
  const std::string slow_text = "of them by answers their clients have been slow to read";
  const auto refused_for_slow_answers = [&] {
    auto unary = client.infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
    return unary.status().code() == absl::StatusCode::kResourceExhausted &&
           absl::StrContains(unary.status().message(), "taken, 4 " + slow_text);
  };
  bool filled = false;
  for (int i = 0; i < 500 && !(filled = refused_for_slow_answers()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(filled) << "the unread answers never filled the slots";
  // From then on, every call is refused.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  int refusals = 0;
  while (std::chrono::steady_clock::now() < until) {
    auto unary = client.infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
    ASSERT_EQ(unary.status().code(), absl::StatusCode::kResourceExhausted)
        << "call " << refusals << ": " << unary.status();
    EXPECT_TRUE(absl::StartsWith(unary.status().message(),
                                 "server busy: all 4 slots for inference requests and uploads "
                                 "are taken, "))
        << unary.status();
    EXPECT_TRUE(absl::StrContains(unary.status().message(), slow_text)) << unary.status();
    v1::EchoRequest req;
    req.set_response_bytes(16);
    v1::EchoResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status echo = client.stub().Echo(&ctx, req, &resp);
    ASSERT_EQ(echo.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << echo.error_message();
    ++refusals;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GT(refusals, 5);
  auto health = client.health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_TRUE(*health);
  EXPECT_EQ((*server)->calls_in_flight(), 4);

  // Read, the answers are whole; the Infer's y is the one a call of the same x gets.
  {
    v1::InferResponse resp;
    const grpc::Status s = calls[3]->read(&resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(static_cast<int64_t>(resp.y().size()), kRows * 8192 * 2);
    v1::EchoResponse echo;
    const grpc::Status e = calls[0]->read(&echo);
    ASSERT_TRUE(e.ok()) << e.error_message();
    EXPECT_EQ(static_cast<int64_t>(echo.payload().size()), kEchoBytes);
    // Their slots serve again (given back as the calls end, just after their answers).
    absl::StatusOr<v1::InferResponse> again;
    for (int i = 0; i < 500; ++i) {
      again = client.infer(big_infer);
      if (again.status().code() != absl::StatusCode::kResourceExhausted) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->y(), resp.y());
  }
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(calls[i]->cancel().error_code(), grpc::StatusCode::CANCELLED);
  }
  calls.clear();
  for (int i = 0; i < 500 && (*server)->calls_in_flight() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*server)->calls_in_flight(), 0);
  std::vector<std::thread> four;
  std::atomic<int> served{0};
  for (int i = 0; i < 4; ++i) {
    four.emplace_back([&] {
      auto r = client.infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
      served += r.ok();
    });
  }
  for (std::thread& t : four) t.join();
  EXPECT_EQ(served.load(), 4);
}

// One layer's requests hold at most all but an eighth of the slots (with 8 threads, 3 of 4): with
// three Infer calls waiting in a layer's queue (a batching delay of 2 s), a fourth call and a
// stream's message for that layer are RESOURCE_EXHAUSTED naming the layer, while another layer's
// call is served at once on the slot kept; the three are answered once their batch runs, and the
// layer serves again.
TEST(CallSlotsTest, OneLayerLeavesASlotForTheOthers) {
  ServerOptions o = loopback_server_options();
  o.max_threads = 8;
  const CallSlots slots = call_slots_for(o.max_threads);
  ASSERT_EQ(slots.max_calls, 4);
  ASSERT_EQ(slots.max_per_layer, 3);
  EXPECT_EQ(call_slots_for(kMinServerThreads).max_per_layer, 1);
  EXPECT_EQ(call_slots_for(256).max_calls, 240);
  EXPECT_EQ(call_slots_for(256).max_per_layer, 210);
  auto server = QLinearServer::start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  Client client("127.0.0.1:" + std::to_string((*server)->port()));
  TestLayer slow = make_test_layer("slow", 16, 64, Scheme::kDynamicSymmetric, false, 12);
  slow.header.set_max_batch_rows(64);
  slow.header.set_max_queue_delay_us(2'000'000);
  ASSERT_TRUE(client.load_layer(slow.header, slow.weights).ok());
  SplitMix64 rng(12);
  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  std::vector<std::thread> waiting;
  std::atomic<int> answered{0};
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    waiting.emplace_back([&] {
      auto r = client.infer(make_request("slow", x, DType::kBF16, 1, DType::kBF16));
      EXPECT_TRUE(r.ok()) << r.status();
      answered += r.ok();
    });
  }
  for (int i = 0; i < 500 && (*server)->calls_in_flight() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ((*server)->calls_in_flight(), 3) << "the three calls did not all start";
  const std::string busy =
      "server busy: layer 'slow' has 3 requests in flight, the most one layer may hold of the 4 "
      "slots for inference requests and uploads (the others are kept for other layers and "
      "uploads) (qlinear-server --threads=8 keeps 4 threads for health checks and layer "
      "management); retry later";
  auto fourth = client.infer(make_request("slow", x, DType::kBF16, 1, DType::kBF16));
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted) << fourth.status();
  EXPECT_EQ(fourth.status().message(), busy);
  auto stream = client.open_stream();
  ASSERT_TRUE(stream->write(make_request("slow", x, DType::kBF16, 1, DType::kBF16, "s1")));
  v1::InferResponse resp;
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(resp.status_message(), busy);
  // Another layer is served at once, on the unary call and on the same stream.
  auto other = client.infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
  EXPECT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(stream->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16, "d1")));
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  EXPECT_EQ(resp.y(), other->y());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500))
      << "the other layer's calls waited for the slow layer's batch";
  EXPECT_EQ(answered.load(), 0);
  for (std::thread& t : waiting) t.join();
  EXPECT_EQ(answered.load(), 3);
  ASSERT_TRUE(stream->write(make_request("slow", x, DType::kBF16, 1, DType::kBF16, "s2")));
  ASSERT_TRUE(stream->read(&resp));
  EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
  stream->writes_done();
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());
}

// A stream between messages holds no thread and no call slot: 24 streams open on a server of 8
// threads (4 slots), each having run a message, leave health checks, listings and calls served,
// and each runs its next message.
TEST(CallSlotsTest, IdleStreamsHoldNoThreadOrSlot) {
  ServerOptions o = loopback_server_options();
  o.max_threads = 8;
  auto server = QLinearServer::start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  Client client("127.0.0.1:" + std::to_string((*server)->port()));
  SplitMix64 rng(6);
  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  constexpr int kStreams = 24;
  std::vector<std::unique_ptr<InferStream>> streams;
  v1::InferResponse resp;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(client.open_stream());
    ASSERT_TRUE(streams.back()->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16)));
    ASSERT_TRUE(streams.back()->read(&resp)) << "stream " << i;
    ASSERT_EQ(resp.status_code(), 0) << "stream " << i << ": " << resp.status_message();
  }
  for (int i = 0; i < 500 && (*server)->idle_streams() < kStreams; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*server)->idle_streams(), kStreams);
  EXPECT_EQ((*server)->calls_in_flight(), 0);
  // The gauge of open streams (-1: not found).
  const auto streams_open = [&] {
    const std::string text = (*server)->metrics().serialize();
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (!absl::StartsWith(line, "qlinear_infer_streams_open ")) continue;
      double v = -1;
      if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
    }
    return -1.0;
  };
  EXPECT_EQ(streams_open(), kStreams);
  auto health = client.health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_TRUE(*health);
  auto layers = client.list_layers();
  ASSERT_TRUE(layers.ok()) << layers.status();
  auto unary = client.infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
  EXPECT_TRUE(unary.ok()) << unary.status();
  for (int i = 0; i < kStreams; ++i) {
    const std::string id = "again" + std::to_string(i);
    ASSERT_TRUE(streams[i]->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16, id)));
    ASSERT_TRUE(streams[i]->read(&resp)) << id;
    EXPECT_EQ(resp.status_code(), 0) << id << ": " << resp.status_message();
    EXPECT_EQ(resp.request_id(), id);
    EXPECT_EQ(resp.y(), unary->y()) << id;
  }
  for (auto& st : streams) {
    st->writes_done();
    EXPECT_FALSE(st->read(&resp));
    EXPECT_TRUE(st->finish().ok());
  }
  for (int i = 0; i < 500 && streams_open() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(streams_open(), 0);
}

// Streams at once beyond the slots: 24 streams on a server of 4 slots each send 20 messages, a
// third of them cancelling after their 5th answer. Every message that is sent is answered, in
// order, with its id: the layer's y (the same for every one) or RESOURCE_EXHAUSTED "server busy";
// the cancelled streams end CANCELLED, the others OK, and afterwards nothing is left in flight or
// waiting and the server still answers.
TEST(CallSlotsTest, ManyStreamsAtOnceAnswerEveryMessage) {
  ServerOptions o = loopback_server_options();
  o.max_threads = 8;
  auto server = QLinearServer::start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  Client client("127.0.0.1:" + std::to_string((*server)->port()));
  SplitMix64 rng(7);
  const std::string x = random_x(rng, 1, 64, DType::kBF16);
  auto expected = client.infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
  ASSERT_TRUE(expected.ok()) << expected.status();
  constexpr int kStreams = 24, kMessages = 20, kCancelAfter = 5;
  std::atomic<int> served{0}, busy{0}, wrong{0};
  std::vector<std::string> failures(kStreams);
  std::vector<std::thread> threads;
  for (int t = 0; t < kStreams; ++t) {
    threads.emplace_back([&, t] {
      const bool cancels = t % 3 == 0;
      auto stream = client.open_stream();
      v1::InferResponse resp;
      for (int i = 0; i < kMessages; ++i) {
        if (cancels && i == kCancelAfter) {
          stream->cancel();
          break;
        }
        const std::string id = absl::StrCat(t, "/", i);
        if (!stream->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16, id)) ||
            !stream->read(&resp)) {
          failures[t] = absl::StrCat("message ", id, " unanswered: ", stream->finish().ToString());
          return;
        }
        if (resp.request_id() != id) {
          ++wrong;
          failures[t] = absl::StrCat("answer '", resp.request_id(), "' for ", id);
        } else if (resp.status_code() == 0 && resp.y() == expected->y()) {
          ++served;
        } else if (resp.status_code() == static_cast<int>(absl::StatusCode::kResourceExhausted) &&
                   (absl::StartsWith(resp.status_message(), "server busy: all 4 slots") ||
                    absl::StartsWith(resp.status_message(),
                                     "server busy: layer 'demo' has 3 requests in flight"))) {
          ++busy;
        } else {
          ++wrong;
          failures[t] = absl::StrCat(id, ": ", resp.status_code(), " ", resp.status_message());
        }
      }
      if (!cancels) stream->writes_done();
      while (stream->read(&resp)) {
      }
      const absl::Status end = stream->finish();
      if (end.code() != (cancels ? absl::StatusCode::kCancelled : absl::StatusCode::kOk)) {
        failures[t] = absl::StrCat("stream ended ", end.ToString());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kStreams; ++t) EXPECT_EQ(failures[t], "") << "stream " << t;
  EXPECT_EQ(wrong.load(), 0);
  constexpr int kSent = (kStreams / 3) * kCancelAfter + (kStreams - kStreams / 3) * kMessages;
  EXPECT_EQ(served.load() + busy.load(), kSent);
  EXPECT_GT(served.load(), 0);
  RecordProperty("served", served.load());
  RecordProperty("busy", busy.load());
  for (int i = 0; i < 500 && ((*server)->calls_in_flight() != 0 || (*server)->idle_streams() != 0);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*server)->calls_in_flight(), 0);
  EXPECT_EQ((*server)->idle_streams(), 0);
  auto again = client.infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->y(), expected->y());
}

// On a GPU: a request larger than the stream contexts hold grows one context's staging, which
// the gauges show; once no request has needed it for the idle time it is given back (all of it:
// this process reserves none at start-up), and a request after that grows it again and answers
// the same. Without a GPU the gauges do not exist.
TEST(GpuStagingTest, GrownStagingIsGivenBackOnceIdle) {
  ServerOptions o = loopback_server_options(4096, 1024);
  o.metrics_port = testing::free_port();
  o.gpu_staging_idle = std::chrono::seconds(2);
  auto server = QLinearServer::start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = (*server)->metrics_port();
  Client client("127.0.0.1:" + std::to_string((*server)->port()));
  auto info = client.describe_layer("demo");
  ASSERT_TRUE(info.ok()) << info.status();
  // The gauges (pinned host, device) from one scrape, -1 where they do not exist.
  auto gauges = [&]() -> std::pair<double, double> {
    const std::string text = http_get(metrics_port, "/metrics");
    auto value = [&](const std::string& memory) -> double {
      const std::string key = "\nqlinear_gpu_staging_bytes{memory=\"" + memory + "\"} ";
      const size_t at = text.find(key);
      return at == std::string::npos ? -1 : std::stod(text.substr(at + key.size()));
    };
    return {value("host_pinned"), value("device")};
  };
  if (info->device() == "cpu") {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past a housekeeping period
    if (host_info().gpus.empty()) {
      EXPECT_EQ(gauges(), std::make_pair(-1.0, -1.0));
    }
    GTEST_SKIP() << "the layer is served on the CPU: no GPU staging to watch";
  }
  // x 4 MiB, y 16 MiB (bf16): more than the layer's load left in any context.
  SplitMix64 rng(12);
  const std::string x = random_x(rng, 2048, 1024, DType::kBF16);
  const v1::InferRequest req = make_request("demo", x, DType::kBF16, 2048, DType::kBF16);
  auto first = client.infer(req);
  ASSERT_TRUE(first.ok()) << first.status();
  const double kGrown = 20 << 20;
  auto wait_for = [&](auto pred, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  };
  std::pair<double, double> seen;
  EXPECT_TRUE(wait_for(
      [&] {
        seen = gauges();
        return seen.first >= kGrown;
      },
      std::chrono::milliseconds(1500)))
      << "pinned " << seen.first << ", device " << seen.second;
  EXPECT_GE(seen.second, kGrown);
  EXPECT_TRUE(wait_for(
      [&] {
        seen = gauges();
        return seen.first == 0 && seen.second == 0;
      },
      std::chrono::seconds(15)))
      << "pinned " << seen.first << ", device " << seen.second;
  auto again = client.infer(req);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->y(), first->y());
}

// A server's watchdog watches GPU batches only: a long batch on the CPU (the reference kernel at
// M = 512, forced: on a CPU layer here, on a GPU layer on a GPU host) keeps /healthz at 200 even
// under a limit of 1 ms. (BatcherTest covers the GPU side.)
TEST(LivenessTest, ACpuBatchDoesNotFailLiveness) {
  ServerOptions o = loopback_server_options(512, 512);
  o.metrics_port = testing::free_port();
  o.liveness_batch_timeout = std::chrono::milliseconds(1);
  auto server = QLinearServer::start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = (*server)->metrics_port();
  Client client("127.0.0.1:" + std::to_string((*server)->port()));
  SplitMix64 rng(9);
  const std::string x = random_x(rng, 512, 512, DType::kBF16);
  v1::InferRequest req = make_request("demo", x, DType::kBF16, 512, DType::kBF16);
  req.set_forced_kernel("cpu.reference");
  std::atomic<bool> done{false};
  std::thread slow([&] {
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(client.infer(req).ok());
    done = true;
  });
  int polls = 0;
  std::string failed;
  while (!done.load()) {
    const std::string live = http_get(metrics_port, "/healthz");
    ++polls;
    if (live.find("200 OK") == std::string::npos) failed = live;
  }
  slow.join();
  EXPECT_GT(polls, 0);
  EXPECT_EQ(failed, "");
}

TEST_F(ServerTest, MetricsEndpointIsScraped) {
  SplitMix64 rng(6);
  const std::string x = random_x(rng, 2, 64, DType::kBF16);
  auto served = client_->infer(make_request("demo", x, DType::kBF16, 2, DType::kBF16));
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_FALSE(client_->infer(make_request("missing", x, DType::kBF16, 2, DType::kBF16)).ok());
  // The kernel and device that served it: CPU kernels here, CUDA kernels on a GPU host.
  auto info = client_->describe_layer("demo");
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string live = http_get(server_->metrics_port(), "/healthz");
  EXPECT_NE(live.find("200 OK"), std::string::npos) << live;
  EXPECT_NE(live.find("\r\n\r\nok\n"), std::string::npos) << live;
  const std::string text = http_get(server_->metrics_port(), "/metrics");
  EXPECT_NE(text.find("200 OK"), std::string::npos) << text;
  EXPECT_NE(text.find("qlinear_requests_total{code=\"OK\",kernel=\"" + served->metadata().kernel() +
                      "\",layer=\"demo\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("qlinear_rows_total{layer=\"demo\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("qlinear_request_failures_total{layer=\"\",reason=\"NOT_FOUND\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("qlinear_layers_loaded 1"), std::string::npos) << text;
  EXPECT_NE(text.find("qlinear_queue_duration_seconds_count{layer=\"demo\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("qlinear_compute_duration_seconds_count"), std::string::npos) << text;
  EXPECT_NE(text.find("qlinear_layer_bytes{device=\"" + info->device() + "\",layer=\"demo\"}"),
            std::string::npos)
      << text;
}

// A kernel the layer cannot choose unforced is prepared by the first request that forces it; the
// layer's bytes gauge then counts its packed copy. (A CPU kernel measured slower than another in
// every bucket at load was released after the load: it counts again once forced.)
TEST_F(ServerTest, LayerBytesGaugeGrowsWhenAForcedKernelIsPreparedOnDemand) {
  auto kernels = client_->list_kernels();
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  auto info = client_->describe_layer("demo");
  ASSERT_TRUE(info.ok()) << info.status();
  // A CPU kernel that packs a copy, runs here and serves no bucket of the layer: two must run.
  std::string idle;
  for (const auto& k : kernels->kernels()) {
    if (k.name() == "cpu.reference" || k.name().rfind("cpu.", 0) != 0) continue;
    if (!k.supported() || k.disabled()) continue;
    bool serves = false;
    for (const auto& b : info->buckets()) serves = serves || b.kernel() == k.name();
    if (!serves) idle = k.name();
  }
  if (idle.empty()) GTEST_SKIP() << "needs two CPU kernels that pack a copy to run here";
  if (info->device() != "cpu") GTEST_SKIP() << "the layer is served on " << info->device();
  auto gauge = [this]() -> double {
    const std::string text = http_get(server_->metrics_port(), "/metrics");
    const std::string key = "qlinear_layer_bytes{device=\"cpu\",layer=\"demo\"} ";
    const size_t at = text.find(key);
    EXPECT_NE(at, std::string::npos) << text;
    return at == std::string::npos ? -1 : std::stod(text.substr(at + key.size()));
  };
  const double before = gauge();
  SplitMix64 rng(11);
  const std::string x = random_x(rng, 2, 64, DType::kBF16);
  v1::InferRequest req = make_request("demo", x, DType::kBF16, 2, DType::kBF16);
  req.set_forced_kernel(idle);
  auto r = client_->infer(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->metadata().kernel(), idle);
  const double after = gauge();
  EXPECT_GT(after, before);
  // A second forced request prepares nothing more.
  ASSERT_TRUE(client_->infer(req).ok());
  EXPECT_EQ(gauge(), after);
}

TEST_F(ServerTest, EchoReturnsTheRequestedBytes) {
  grpc::ClientContext ctx;
  v1::EchoRequest req;
  req.set_payload(std::string(1000, 'x'));
  req.set_response_bytes(4096);
  v1::EchoResponse resp;
  ASSERT_TRUE(client_->stub().Echo(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.payload().size(), 4096u);

  // A payload the send limit (the test server's 8 MiB) could not carry is refused before it is
  // allocated.
  grpc::ClientContext over_ctx;
  req.set_response_bytes(int64_t{8} << 20);
  const grpc::Status over = client_->stub().Echo(&over_ctx, req, &resp);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << over.error_message();
  EXPECT_EQ(
      over.error_message(),
      "response_bytes must be in 0..8388592 (the message limit less the response's framing, at "
      "most 2^30), got 8388608");
}

TEST_F(ServerTest, BatchMetadataAndPerLayerBatchSettings) {
  TestLayer t = make_test_layer("batchy", 16, 32, Scheme::kDynamicSymmetric, true, 8);
  t.header.set_max_batch_rows(8);
  t.header.set_max_queue_delay_us(500);
  ASSERT_TRUE(client_->load_layer(t.header, t.weights).ok());
  auto info = client_->describe_layer("batchy");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->max_batch_rows(), 8);
  EXPECT_EQ(info->max_queue_delay_us(), 500);
  SplitMix64 rng(9);
  const std::string x = random_x(rng, 3, 32, DType::kF32);
  auto r = client_->infer(make_request("batchy", x, DType::kF32, 3, DType::kF32));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->metadata().batch_requests(), 1);
  EXPECT_GE(r->metadata().batch_rows(), 3);
  EXPECT_GE(r->metadata().timings().queue_us(), 0);
  // Only GPU kernels stage their copies through page-locked memory.
  if (absl::StartsWith(r->metadata().kernel(), "cpu.")) {
    EXPECT_EQ(r->metadata().timings().copy_us(), 0);
  }
  t.header.set_name("batchy2");
  t.header.set_max_batch_rows(0);
  auto bad = client_->load_layer(t.header, t.weights);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "max_batch_rows must be in 1..65536, got 0");
  t.header.set_max_batch_rows(65537);
  bad = client_->load_layer(t.header, t.weights);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "max_batch_rows must be in 1..65536, got 65537");
}

// A response's timings (SPEC section 7) on a GEMM of 64 x 1024 x 1024, which takes well over a
// microsecond: the GEMM's time is there, and the total, from the request's receipt to its answer,
// holds the queue, the quantization, the GEMM and the copies. Unary and on a stream.
TEST_F(ServerTest, TimingsAddUpWithinTheTotal) {
  load("timed", 1024, 1024, Scheme::kDynamicSymmetric);
  SplitMix64 rng(14);
  const std::string x = random_x(rng, 64, 1024, DType::kBF16);
  const v1::InferRequest req = make_request("timed", x, DType::kBF16, 64, DType::kBF16);
  auto check = [](const v1::InferResponse& r) {
    const v1::Timings& t = r.metadata().timings();
    SCOPED_TRACE(r.metadata().kernel() + ": " + t.ShortDebugString());
    EXPECT_GT(t.gemm_us(), 0);
    EXPECT_GE(t.quantize_us(), 0);
    EXPECT_GE(t.queue_us(), 0);
    EXPECT_GE(t.copy_us(), 0);
    EXPECT_GE(t.total_us(), t.queue_us() + t.quantize_us() + t.gemm_us() + t.copy_us());
  };
  auto r = client_->infer(req);
  ASSERT_TRUE(r.ok()) << r.status();
  check(*r);
  auto stream = client_->open_stream();
  ASSERT_TRUE(stream->write(req));
  v1::InferResponse resp;
  ASSERT_TRUE(stream->read(&resp));
  ASSERT_EQ(resp.status_code(), 0) << resp.status_message();
  check(resp);
  stream->writes_done();
  EXPECT_FALSE(stream->read(&resp));
  EXPECT_TRUE(stream->finish().ok());
}

// A server started with a layer manifest (--layer-manifest) holds its layers when it listens, as
// an upload of the same files would have made them, and answers them bit for bit as the
// reference does; a manifest whose layer cannot load fails the start-up, naming the manifest, the
// layer and why; a stop asked for while it loads ends the start-up.
class ManifestServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/qlinear_manifest_e2e.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& f : files_) unlink(f.c_str());
    rmdir(dir_.c_str());
  }
  // Writes `t`'s weights, scales and bias as NAME.w.npy, NAME.s.npy and NAME.b.npy; returns the
  // manifest entry's keys for them.
  std::string save(const std::string& file, const TestLayer& t) {
    auto write = [&](const std::string& name, NpyDType dtype, std::vector<int64_t> shape,
                     std::string data) {
      NpyArray a;
      a.dtype = dtype;
      a.shape = std::move(shape);
      a.data = std::move(data);
      files_.push_back(dir_ + "/" + name);
      EXPECT_TRUE(write_npy_file(files_.back(), a).ok());
    };
    write(file + ".w.npy", NpyDType::kI1, {t.spec.n, t.spec.k},
          std::string(t.weights.begin(), t.weights.end()));
    write(file + ".s.npy", NpyDType::kF4, {t.spec.n}, t.header.weight_scale().data());
    std::string keys =
        absl::StrCat(R"("weights": ")", file, R"(.w.npy", "weight_scale": ")", file, R"(.s.npy")");
    if (!t.spec.bias.empty()) {
      write(file + ".b.npy", NpyDType::kF4, {t.spec.n}, t.header.bias().data());
      absl::StrAppend(&keys, R"(, "bias": ")", file, R"(.b.npy")");
    }
    return keys;
  }
  std::string write_manifest(const std::string& json) {
    files_.push_back(dir_ + "/manifest.json");
    FILE* f = fopen(files_.back().c_str(), "w");
    EXPECT_NE(f, nullptr);
    if (f != nullptr) {
      fputs(json.c_str(), f);
      fclose(f);
    }
    return files_.back();
  }
  static ServerOptions options(const std::string& manifest) {
    ServerOptions o = loopback_server_options();
    o.layer_manifest = manifest;
    return o;
  }
  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(ManifestServerTest, LoadsEveryLayerBeforeListeningAndServesThem) {
  SEED_TRACE();
  const TestLayer a =
      make_test_layer("model/a", 40, 96, Scheme::kDynamicSymmetric, true, test_seed());
  const TestLayer b =
      make_test_layer("model/b", 24, 72, Scheme::kStaticAsymmetric, false, test_seed() + 1);
  const std::string manifest = write_manifest(
      absl::StrCat(R"({"layers": [{"name": "model/a", )", save("a", a),
                   R"(, "max_batch_rows": 4, "max_queue_delay_us": 30},
         {"name": "model/b", )",
                   save("b", b),
                   R"(, "scheme": "static_asymmetric", "input_scale": 0.015, "input_zero_point": 5,
          "forced_kernel": "cpu.reference", "weight_sha256": ")",
                   b.header.weight_sha256(), R"("}]})"));
  auto server = QLinearServer::start(options(manifest));
  ASSERT_TRUE(server.ok()) << server.status();
  Client client("127.0.0.1:" + std::to_string((*server)->port()));
  auto list = client.list_layers();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->layers_size(), 3);  // demo, model/a, model/b
  auto ia = client.describe_layer("model/a");
  ASSERT_TRUE(ia.ok()) << ia.status();
  EXPECT_EQ(ia->n(), 40);
  EXPECT_EQ(ia->k(), 96);
  EXPECT_TRUE(ia->has_bias());
  EXPECT_EQ(ia->max_batch_rows(), 4);
  EXPECT_EQ(ia->max_queue_delay_us(), 30);
  EXPECT_EQ(ia->weight_sha256(), a.header.weight_sha256());  // computed where not given
  auto ib = client.describe_layer("model/b");
  ASSERT_TRUE(ib.ok()) << ib.status();
  EXPECT_EQ(ib->scheme(), v1::SCHEME_STATIC_ASYMMETRIC);
  EXPECT_EQ(ib->input_zero_point(), 5);
  EXPECT_EQ(ib->forced_kernel(), "cpu.reference");
  EXPECT_FALSE(ib->has_bias());
  SplitMix64 rng(test_seed() + 2);
  for (const TestLayer* t : {&a, &b}) {
    const int64_t m = 3;
    const std::string x = random_x(rng, m, t->spec.k, DType::kBF16);
    auto r = client.infer(make_request(t->header.name(), x, DType::kBF16, m, DType::kF32));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->y(), reference_y(*t, x, DType::kBF16, m, DType::kF32)) << t->header.name();
  }
  auto forced = client.infer(
      make_request("model/b", random_x(rng, 1, 72, DType::kBF16), DType::kBF16, 1, DType::kBF16));
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->metadata().kernel(), "cpu.reference");
}

TEST_F(ManifestServerTest, ALayerThatCannotLoadFailsTheStartUpNamingIt) {
  SEED_TRACE();
  const TestLayer a = make_test_layer("a", 16, 32, Scheme::kDynamicSymmetric, true, test_seed());
  const std::string files = save("a", a);
  struct Case {
    std::string entries;
    absl::StatusCode code;
    std::string message;
  };
  const Case cases[] = {
      // The server's own checks, as for an upload.
      {R"({"name": "a", )" + files + R"(, "scheme": "static_symmetric"})",
       absl::StatusCode::kInvalidArgument,
       "layer 'a' (layers[0]): scheme static_symmetric requires input_scale"},
      {R"({"name": "a", )" + files + R"(, "weight_sha256": ")" + std::string(64, '0') + R"("})",
       absl::StatusCode::kInvalidArgument, "layer 'a' (layers[0]): weight checksum mismatch"},
      {R"({"name": "a", )" + files + R"(, "forced_kernel": "cuda.none"})",
       absl::StatusCode::kInvalidArgument, "layer 'a' (layers[0]): unknown forced_kernel"},
      {R"({"name": "bad name!", )" + files + "}", absl::StatusCode::kInvalidArgument,
       "layers[0]: layer name 'bad name!' has characters outside [A-Za-z0-9_.:/-]"},
      // The demo layer is loaded first.
      {R"({"name": "demo", )" + files + "}", absl::StatusCode::kAlreadyExists,
       "layer 'demo' (layers[0]): the demo layer has this name; rename the entry, or start with "
       "--no-demo-layer"},
      // A later layer's file is missing: found before any layer loads.
      {R"({"name": "a", )" + files + R"(}, {"name": "b", "weights": "nothing.npy",
          "weight_scale": "a.s.npy"})",
       absl::StatusCode::kNotFound,
       "layer 'b' (layers[1]): " + dir_ + "/nothing.npy does not exist"},
      {R"({"name": "a", "weights": ".", "weight_scale": "a.s.npy"})",
       absl::StatusCode::kInvalidArgument,
       "layer 'a' (layers[0]): " + dir_ + "/. is not a regular file"},
      {R"({"name": "a", "wieghts": "a.w.npy"})", absl::StatusCode::kInvalidArgument,
       "layer 'a' (layers[0]): unknown key \"wieghts\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entries);
    const std::string manifest = write_manifest(absl::StrCat(R"({"layers": [)", c.entries, "]}"));
    files_.pop_back();  // written again by the next case
    auto server = QLinearServer::start(options(manifest));
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(server.status().code(), c.code) << server.status();
    EXPECT_TRUE(absl::StartsWith(server.status().message(), manifest + ": ")) << server.status();
    EXPECT_TRUE(absl::StrContains(server.status().message(), c.message)) << server.status();
  }
  files_.push_back(dir_ + "/manifest.json");
  // A manifest that is not there.
  auto missing = QLinearServer::start(options(dir_ + "/none.json"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), dir_ + "/none.json"));
}

// A layer whose weights take more host memory to read than is left is refused before any of it
// is read (RESOURCE_EXHAUSTED naming the layer and both figures), not met by the OOM killer: here
// a sparse .npy file of 128 GiB of int8 weights, which takes no disk.
TEST_F(ManifestServerTest, ALayerLargerThanTheMemoryLeftIsRefusedBeforeItIsRead) {
  const int64_t avail = available_memory_bytes();
  if (avail < 0) GTEST_SKIP() << "this host's available memory cannot be read";
  const int64_t k = 65536, n = std::max<int64_t>(int64_t{1} << 21, avail / k + 1);
  std::string header = "{'descr': '|i1', 'fortran_order': False, 'shape': (" + std::to_string(n) +
                       ", " + std::to_string(k) + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::string preamble("\x93NUMPY\x01\x00", 8);
  preamble += static_cast<char>(header.size() & 0xff);
  preamble += static_cast<char>(header.size() >> 8);
  const std::string big = dir_ + "/big.w.npy";
  files_.push_back(big);
  FILE* f = fopen(big.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fwrite(preamble.data(), 1, preamble.size(), f);
  fwrite(header.data(), 1, header.size(), f);
  fclose(f);
  const int64_t size = static_cast<int64_t>(preamble.size() + header.size()) + n * k;
  ASSERT_EQ(truncate(big.c_str(), size), 0) << std::strerror(errno);
  const TestLayer a = make_test_layer("a", 16, 32, Scheme::kDynamicSymmetric, false, 1);
  save("a", a);  // for its scale file
  const std::string manifest = write_manifest(
      R"({"layers": [{"name": "big", "weights": "big.w.npy", "weight_scale": "a.s.npy"}]})");
  const auto t0 = std::chrono::steady_clock::now();
  auto server = QLinearServer::start(options(manifest));
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kResourceExhausted) << server.status();
  EXPECT_TRUE(absl::StrContains(server.status().message(),
                                absl::StrCat("layer 'big' (layers[0]): reading its weights takes ",
                                             2 * size, " bytes of host memory; only ")))
      << server.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

TEST_F(ManifestServerTest, AStopAskedForWhileLoadingEndsTheStartUp) {
  const TestLayer a = make_test_layer("a", 16, 32, Scheme::kDynamicSymmetric, true, 1);
  const std::string files = save("a", a);
  const std::string manifest = write_manifest(
      absl::StrCat(R"({"layers": [{"name": "a", )", files, R"(}, {"name": "b", )", files, "}]}"));
  ServerOptions o = options(manifest);
  int asked = 0;
  o.stop_requested = [&asked] { return ++asked == 2; };  // after the first layer
  auto server = QLinearServer::start(o);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kCancelled) << server.status();
  EXPECT_EQ(server.status().message(),
            "stopped while loading the manifest " + manifest + ", after 1 of 2 layers");
}

}  // namespace
}  // namespace qlinear
