// Tests that need a real qlinear-server process: SIGTERM drains with requests in flight, a second
// server on a port in use exits instead of sharing it, and clients killed mid-upload or mid-stream
// leave the server healthy with nothing left behind.
// The server binary's path comes from CMake (QLINEAR_SERVER_BIN).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "client/qlinear_client.h"
#include "tests/server/test_util.h"

namespace qlinear {
namespace {

using testing::make_request;
using testing::make_test_layer;
using testing::random_x;
using testing::TestLayer;

class ServerProcess {
 public:
  // `env`: NAME=VALUE entries set in the server's environment, or NAME alone, unset there.
  // `log_path`: where its log (stderr) goes.
  explicit ServerProcess(std::vector<std::string> extra = {}, std::vector<std::string> env = {},
                         std::string log_path = "/dev/null")
      : port_(testing::free_port()) {
    std::vector<std::string> args = {
        QLINEAR_SERVER_BIN, "--address=127.0.0.1", "--port=" + std::to_string(port_),
        "--demo-n=256",     "--demo-k=512",        "--drain-timeout-ms=10000"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& e : env) {
        const size_t eq = e.find('=');
        if (eq == std::string::npos) {
          unsetenv(e.c_str());
        } else {
          setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
        }
      }
      // Keep the test output readable: the server logs go to /dev/null unless asked for.
      if (freopen(log_path.c_str(), "w", stderr) == nullptr) _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // Wait for the port with plain connects: a gRPC channel that fails to connect backs off
    // for seconds.
    for (int i = 0; i < 400 && !accepts_connections(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    client_ = std::make_unique<Client>("127.0.0.1:" + std::to_string(port_));
    for (int i = 0; i < 200; ++i) {
      auto h = client_->health();
      if (h.ok() && *h) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "server did not become healthy";
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Sends SIGTERM and waits; returns the exit status and the time it took.
  int terminate(std::chrono::milliseconds* took) {
    kill(pid_, SIGTERM);
    return wait_exit(took);
  }
  // Waits for the process to end; returns its exit status and how long the wait took.
  int wait_exit(std::chrono::milliseconds* took) {
    const auto t0 = std::chrono::steady_clock::now();
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    *took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  t0);
    return status;
  }
  Client& client() { return *client_; }
  bool accepts_connections() const {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    return ok;
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }

 private:
  int port_;
  pid_t pid_ = -1;
  std::unique_ptr<Client> client_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The value of `name` in a running process's environment, or "(unset)".
std::string env_of(pid_t pid, const std::string& name) {
  const std::string environ = read_file("/proc/" + std::to_string(pid) + "/environ");
  size_t at = 0;
  while (at < environ.size()) {
    const size_t end = std::min(environ.find('\0', at), environ.size());
    const std::string entry = environ.substr(at, end - at);
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
    at = end + 1;
  }
  return "(unset)";
}

// The last value libgomp reported for GOMP_SPINCOUNT at start-up (OMP_DISPLAY_ENV=VERBOSE prints
// its settings as it loads: once per executed image), or "(none)".
std::string libgomp_spincount(const std::string& log) {
  const std::string key = "GOMP_SPINCOUNT = '";
  const size_t at = log.rfind(key);
  if (at == std::string::npos) return "(none)";
  const size_t begin = at + key.size();
  return log.substr(begin, log.find('\'', begin) - begin);
}

// Runs qlinear-server with `args` until it exits, its stdout and stderr in *out, its wait status in
// *status. (Under `timeout 60`: a server that starts serving after all fails the test rather than
// hanging it.) `env`: NAME=VALUE assignments for its environment.
void run_server_to_exit(const std::string& args, int* status, std::string* out,
                        const std::string& env = "") {
  const std::string cmd =
      env + " timeout 60 " + std::string(QLINEAR_SERVER_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) *out += buf;
  *status = pclose(p);
}

// A flag out of its range stops the server at once (exit 2), naming the flag, its range and the
// value given.
TEST(ProcessTest, AFlagOutOfRangeIsNamedWithItsValue) {
  const std::pair<const char*, const char*> cases[] = {
      {"--upload-idle-timeout-ms=-1", "--upload-idle-timeout-ms must be >= 0, got -1"},
      {"--port=70000", "--port must be 0-65535, got 70000"},
      {"--max-message-mb=4096", "--max-message-mb must be 1-2047, got 4096"},
      {"--threads=4", "--threads must be 5-65536, got 4"},
      {"--threads=4294967297", "--threads must be 5-65536, got 4294967297"},
      {"--demo-n=-1", "--demo-n must be 1-1048576, got -1"},
      {"--demo-k=131072", "--demo-k must be 1-131071, got 131072"},
      {"--gpu-staging-idle-s=86401", "--gpu-staging-idle-s must be 0-86400, got 86401"},
      {"--keepalive-time-ms=-5", "--keepalive-time-ms must be 0-2147483647, got -5"},
      {"--max-connection-age-ms=3000000000",
       "--max-connection-age-ms must be 0-2147483647, got 3000000000"},
      {"--max-batch-rows=65537", "--max-batch-rows must be 1-65536, got 65537"},
      {"--max-queue-delay-us=10000001", "--max-queue-delay-us must be 0-10000000, got 10000001"},
      // A drain deadline must not overflow the clock it is added to.
      {"--drain-timeout-ms=9223372036854775807",
       "--drain-timeout-ms must be 0-86400000, got 9223372036854775807"},
      {"--drain-timeout-ms=86400001", "--drain-timeout-ms must be 0-86400000, got 86400001"},
  };
  for (const auto& [flag, want] : cases) {
    int status = -1;
    std::string out;
    run_server_to_exit(flag, &status, &out);
    EXPECT_TRUE(WIFEXITED(status)) << flag;
    EXPECT_EQ(WEXITSTATUS(status), 2) << flag << "\n" << out;
    EXPECT_NE(out.find(want), std::string::npos) << flag << "\n" << out;
  }
}

// A second server started on a port that one already listens on exits 1, saying it cannot listen,
// and the first serves on. (gRPC shares a port through SO_REUSEPORT unless told not to: the
// kernel then split new connections between the two servers, each with layers of its own.)
TEST(ProcessTest, ASecondServerOnAPortInUseExitsAndTheFirstServesOn) {
  ServerProcess first;
  const std::string port = std::to_string(first.port());
  char log_tmpl[] = "/tmp/qlinear_second_server.XXXXXX";
  const int log_fd = mkstemp(log_tmpl);
  ASSERT_GE(log_fd, 0);
  close(log_fd);
  const std::string log_path = log_tmpl;
  const pid_t second = fork();
  if (second == 0) {
    std::vector<std::string> args = {QLINEAR_SERVER_BIN, "--address=127.0.0.1", "--port=" + port,
                                     "--demo-n=256", "--demo-k=512"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (freopen(log_path.c_str(), "w", stderr) == nullptr) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ASSERT_GT(second, 0);
  // Until it exits, or says it listens (the port shared).
  int status = -1;
  bool exited = false;
  for (int i = 0; i < 600 && !exited; ++i) {
    exited = waitpid(second, &status, WNOHANG) == second;
    if (!exited && read_file(log_path).find("listening on") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // New connections all reach the first server: a layer uploaded there is found on each. (Each
  // channel has a subchannel pool of its own, so that it makes a connection of its own.)
  const TestLayer layer = make_test_layer("only-here", 16, 64, Scheme::kDynamicSymmetric, false, 1);
  ASSERT_TRUE(first.client().load_layer(layer.header, layer.weights).ok());
  int found = 0;
  std::string missed;
  for (int i = 0; i < 16; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = v1::QLinear::NewStub(make_channel(first.target(), ClientOptions{}, args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::DescribeLayerRequest req;
    req.set_name("only-here");
    v1::LayerInfo info;
    const grpc::Status s = stub->DescribeLayer(&ctx, req, &info);
    if (s.ok()) {
      ++found;
    } else {
      missed = s.error_message();
    }
  }
  if (!exited) {
    kill(second, SIGKILL);
    waitpid(second, &status, 0);
  }
  const std::string log = read_file(log_path);
  std::remove(log_path.c_str());
  EXPECT_TRUE(exited) << "the second server started on a port in use:\n" << log;
  EXPECT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 1) << log;
  EXPECT_NE(log.find("cannot listen on 127.0.0.1:" + port + " (address in use"), std::string::npos)
      << log;
  EXPECT_EQ(found, 16) << "connections that found the layer; one that did not: " << missed;
  EXPECT_EQ(kill(first.pid(), 0), 0) << "the first server is gone";
}

// --require-gpu: a server that would serve on the CPU exits 1 at start-up, saying why (on a GPU
// host with the CUDA kernels it starts; ServerTest covers that host's serving).
TEST(ProcessTest, RequireGpuStopsAServerWithoutAUsableCudaKernel) {
  int status = -1;
  std::string out;
  run_server_to_exit(
      "--require-gpu --port=0 --address=127.0.0.1 --disabled-kernels=cuda.gemv_s8,cuda.stream_s8,"
      "cuda.cutlass_sm90,cuda.cublaslt",
      &status, &out);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("--require-gpu: no CUDA kernel can serve on this host"), std::string::npos)
      << out;
}

// QLINEAR_DISABLED_KERNELS turns kernels off as --disabled-kernels does, and the two lists add
// up: a server whose environment alone, or the environment and the flag together, name every
// kernel but cpu.reference lists them disabled and serves every bucket of its demo layer with the
// reference.
TEST(ProcessTest, DisabledKernelsComeFromTheEnvironmentAndTheFlag) {
  const std::string gpu = "cuda.gemv_s8,cuda.stream_s8,cuda.cutlass_sm90,cuda.cublaslt";
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{}, "QLINEAR_DISABLED_KERNELS=" + gpu + ",cpu.amx,cpu.avx512_vnni,cpu.onednn,cpu.avx2"},
      {{"--disabled-kernels=" + gpu + ",cpu.onednn,cpu.amx"},
       "QLINEAR_DISABLED_KERNELS=cpu.avx2, cpu.avx512_vnni"},
  };
  for (const auto& [flags, env] : cases) {
    SCOPED_TRACE(env);
    ServerProcess server(flags, {env});
    auto kernels = server.client().list_kernels();
    ASSERT_TRUE(kernels.ok()) << kernels.status();
    std::vector<std::string> disabled;
    for (const v1::KernelInfo& k : kernels->kernels()) {
      EXPECT_EQ(k.disabled(), k.name() != "cpu.reference") << k.name();
      if (k.disabled()) {
        disabled.push_back(k.name());
        EXPECT_EQ(k.reason(), "disabled by the operator") << k.name();
      }
    }
    for (const char* cpu : {"cpu.amx", "cpu.avx512_vnni", "cpu.onednn", "cpu.avx2"}) {
      EXPECT_EQ(std::count(disabled.begin(), disabled.end(), cpu), 1) << cpu;
    }
    auto info = server.client().describe_layer("demo");
    ASSERT_TRUE(info.ok()) << info.status();
    ASSERT_GT(info->buckets_size(), 0);
    for (const auto& b : info->buckets()) EXPECT_EQ(b.kernel(), "cpu.reference") << b.m_min();
  }
}

// A kernel name that is not one, in --disabled-kernels or in QLINEAR_DISABLED_KERNELS, stops the
// server at start-up (exit 1) naming it, rather than leaving the kernel meant on.
TEST(ProcessTest, AnUnknownDisabledKernelStopsTheServer) {
  const std::pair<std::string, std::string> cases[] = {
      {"--disabled-kernels=cpu.avx2,cpu.avx3", ""},
      {"", "QLINEAR_DISABLED_KERNELS=cpu.avx2,cpu.avx3"},
  };
  for (const auto& [flag, env] : cases) {
    SCOPED_TRACE(flag + env);
    int status = -1;
    std::string out;
    run_server_to_exit("--port=0 --address=127.0.0.1 " + flag, &status, &out, env);
    EXPECT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 1) << out;
    EXPECT_NE(out.find("qlinear-server: INVALID_ARGUMENT: cannot disable unknown kernel "
                       "'cpu.avx3'; known kernels: cuda.gemv_s8,"),
              std::string::npos)
        << out;
  }
}

// libgomp reads its spin setting once, when it loads: a server built with cpu.onednn re-executes
// itself (the same process, under its own name) with GOMP_SPINCOUNT set, unless its environment
// sets that or OMP_WAIT_POLICY, and logs what applies; libgomp itself reports the value it took.
TEST(ProcessTest, OpenMpSpinIsSetUnlessTheEnvironmentSetsIt) {
  const std::string log =
      ::testing::TempDir() + "/openmp_spin_server." + std::to_string(getpid()) + ".log";
  struct Remove {
    std::string path;
    ~Remove() { std::remove(path.c_str()); }
  } remove_log{log};
  {
    ServerProcess server(
        {},
        {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "QLINEAR_OPENMP_SPIN_SET", "OMP_DISPLAY_ENV=VERBOSE"},
        log);
    const std::string text = read_file(log);
    if (text.find("cpu.onednn (not compiled in") != std::string::npos) {
      GTEST_SKIP() << "this build has no cpu.onednn";
    }
    EXPECT_NE(text.find("OpenMP (cpu.onednn): GOMP_SPINCOUNT=10000 (qlinear's default"),
              std::string::npos)
        << text;
    EXPECT_EQ(libgomp_spincount(text), "10000") << text;  // what libgomp runs with
    EXPECT_EQ(env_of(server.pid(), "GOMP_SPINCOUNT"), "10000");
    EXPECT_EQ(env_of(server.pid(), "QLINEAR_OPENMP_SPIN_SET"), "1");  // (the image's start)
    EXPECT_EQ(read_file("/proc/" + std::to_string(server.pid()) + "/comm"), "qlinear-server\n");
    EXPECT_TRUE(server.client().health().ok());
  }
  {
    ServerProcess server({}, {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT=1234", "OMP_DISPLAY_ENV=VERBOSE"},
                         log);
    const std::string text = read_file(log);
    EXPECT_NE(text.find("OpenMP (cpu.onednn): GOMP_SPINCOUNT=1234 from the environment"),
              std::string::npos)
        << text;
    EXPECT_EQ(libgomp_spincount(text), "1234") << text;
    EXPECT_TRUE(server.client().health().ok());
  }
  {
    ServerProcess server({}, {"OMP_WAIT_POLICY=PASSIVE", "GOMP_SPINCOUNT"}, log);
    const std::string text = read_file(log);
    EXPECT_NE(text.find("OpenMP (cpu.onednn): OMP_WAIT_POLICY=PASSIVE from the environment"),
              std::string::npos)
        << text;
    EXPECT_EQ(env_of(server.pid(), "GOMP_SPINCOUNT"), "(unset)");
    EXPECT_TRUE(server.client().health().ok());
  }
}

TEST(ProcessTest, SigtermDrainsInFlightRequestsThenExits) {
  ServerProcess server({"--max-batch-rows=1"});
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, refused{0}, other{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 6; ++t) {
    clients.emplace_back([&, t] {
      // Each thread has its own channel, as separate clients would.
      Client c(server.target());
      SplitMix64 rng(t);
      const std::string x = random_x(rng, 16, 512, DType::kBF16);
      auto stream = c.open_stream();
      int sent = 0;
      v1::InferResponse resp;
      while (!stop.load()) {
        if (!stream->write(make_request("demo", x, DType::kBF16, 16, DType::kBF16))) break;
        ++sent;
        if (!stream->read(&resp)) break;
        --sent;
        if (resp.status_code() == 0)
          ++ok;
        else
          ++other;
      }
      stream->writes_done();
      while (stream->read(&resp)) {
        --sent;
        if (resp.status_code() == 0)
          ++ok;
        else
          ++other;
      }
      absl::Status s = stream->finish();
      // A request written but never answered would be lost work, unless the stream ended saying
      // it was not run (the drain ends a stream at its next message).
      const bool told_not_run =
          s.code() == absl::StatusCode::kUnavailable &&
          absl::StrContains(s.message(), "and any after it on this stream were not run");
      if (sent != 0 && !told_not_run) ++other;
      if (!s.ok() && s.code() != absl::StatusCode::kUnavailable) ++other;
      // New calls after the drain began are refused: UNAVAILABLE from the service, or CANCELLED
      // from gRPC where its shutdown takes the call first (the drain ends the streams at once, so
      // the call may come as the server stops).
      auto r = c.infer(make_request("demo", x, DType::kBF16, 16, DType::kBF16));
      if (!r.ok() && (r.status().code() == absl::StatusCode::kUnavailable ||
                      r.status().code() == absl::StatusCode::kCancelled)) {
        ++refused;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_GT(ok.load(), 0);
  std::chrono::milliseconds took;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;  // clients close their streams while the server drains
  });
  const int status = server.terminate(&took);
  stopper.join();
  for (auto& c : clients) c.join();
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_LT(took.count(), 10000);
  std::printf("drain took %lld ms\n", static_cast<long long>(took.count()));
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(refused.load(), 6);
}

// A client that keeps its stream open between requests does not hold up the stop: with nothing in
// flight the server ends such streams (UNAVAILABLE, which clients retry elsewhere) and exits, well
// before its drain timeout (10 s here), saying so in its log.
TEST(ProcessTest, AnIdleStreamDoesNotHoldTheStop) {
  char log_tmpl[] = "/tmp/qlinear_idle_stream_XXXXXX";
  const int log_fd = mkstemp(log_tmpl);
  ASSERT_GE(log_fd, 0);
  close(log_fd);
  const std::string log_path = log_tmpl;
  std::chrono::milliseconds took{0};
  absl::Status ended;
  {
    ServerProcess server({}, {}, log_path);
    Client c(server.target());
    SplitMix64 rng(12);
    const std::string x = random_x(rng, 1, 512, DType::kBF16);
    auto stream = c.open_stream();
    ASSERT_TRUE(stream->write(make_request("demo", x, DType::kBF16, 1, DType::kBF16)));
    v1::InferResponse resp;
    ASSERT_TRUE(stream->read(&resp));
    EXPECT_EQ(resp.status_code(), 0) << resp.status_message();
    const int status = server.terminate(&took);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    EXPECT_FALSE(stream->read(&resp));
    ended = stream->finish();
  }
  const std::string log = read_file(log_path);
  std::remove(log_path.c_str());
  EXPECT_EQ(ended.code(), absl::StatusCode::kUnavailable) << ended;
  EXPECT_LT(took.count(), 3000) << "the stop waited for the idle stream";
  EXPECT_NE(
      log.find("ending the calls still open (1 stream waiting for its client's next message)"),
      std::string::npos)
      << log;
  EXPECT_NE(log.find("stopped"), std::string::npos) << log;
}

// With --shutdown-delay-ms, SIGTERM turns health NOT_SERVING while calls are still served for the
// delay; then the server drains and exits 0.
TEST(ProcessTest, ShutdownDelayKeepsServingWhileHealthIsNotServing) {
  ServerProcess server({"--shutdown-delay-ms=5000"});
  SplitMix64 rng(9);
  const std::string x = random_x(rng, 1, 512, DType::kBF16);  // the test server's demo layer
  const auto t0 = std::chrono::steady_clock::now();
  kill(server.pid(), SIGTERM);
  bool not_serving = false;
  for (int i = 0; i < 200 && !not_serving; ++i) {
    auto h = server.client().health();
    not_serving = h.ok() && !*h;
    if (!not_serving) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(not_serving) << "health still SERVING after SIGTERM";
  auto r = server.client().infer(make_request("demo", x, DType::kBF16, 1, DType::kBF16));
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(4000))
      << "the checks above took too long to show the delay";
  std::chrono::milliseconds took;
  const int status = server.wait_exit(&took);
  const auto total = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_GE(total, std::chrono::milliseconds(5000));
  EXPECT_LT(total, std::chrono::milliseconds(20000));
}

// Runs killable_client in `mode` against `target` and SIGKILLs it once it says it is ready.
void run_and_kill(const std::string& target, const std::string& mode) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    execl(QLINEAR_KILLABLE_CLIENT_BIN, QLINEAR_KILLABLE_CLIENT_BIN, target.c_str(), mode.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(pipefd[1]);
  char buf[16] = {};
  EXPECT_GT(read(pipefd[0], buf, sizeof(buf) - 1), 0) << mode << " client did not start";
  close(pipefd[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(ProcessTest, ClientsKilledMidUploadAndMidStreamLeaveNothingBehind) {
  ServerProcess server;
  run_and_kill(server.target(), "upload");
  run_and_kill(server.target(), "stream");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  TestLayer big = make_test_layer("killed", 4096, 4096, Scheme::kDynamicSymmetric, false, 1);
  // The server is healthy, holds only the demo layer, and the name is free.
  auto h = server.client().health();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(*h);
  auto layers = server.client().list_layers();
  ASSERT_TRUE(layers.ok());
  ASSERT_EQ(layers->layers_size(), 1);
  EXPECT_EQ(layers->layers(0).name(), "demo");
  EXPECT_EQ(layers->layers(0).queue_depth(), 0);
  // Reflection in the real binary describes both services (grpcurl-style tools need both).
  EXPECT_NE(testing::reflection_file_containing(server.client().channel(), "grpc.health.v1.Health")
                .find("HealthCheckRequest"),
            std::string::npos);
  EXPECT_NE(testing::reflection_file_containing(server.client().channel(), "qlinear.v1.QLinear")
                .find("LayerHeader"),
            std::string::npos);
  auto r = server.client().load_layer(big.header, big.weights);
  EXPECT_TRUE(r.ok()) << r.status();
  std::chrono::milliseconds took;
  const int status = server.terminate(&took);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "status " << status << " signalled " << WIFSIGNALED(status) << " sig " << WTERMSIG(status);
  EXPECT_LT(took.count(), 10000);
}

}  // namespace
}  // namespace qlinear
