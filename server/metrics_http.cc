#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace qlinear {
namespace {

// How long an answer may take to send, in all. SO_SNDTIMEO bounds each send() alone, so a client
// that reads a few bytes now and then would otherwise hold this thread, and /healthz behind it, for
// as long as a large /metrics body takes it.
constexpr std::chrono::seconds kWriteLimit{5};

// Whether fd is ready for `events` (POLLIN, POLLOUT) before `end`.
bool ready_by(int fd, short events, std::chrono::steady_clock::time_point end) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
  pollfd p{fd, events, 0};
  return left.count() > 0 && ::poll(&p, 1, static_cast<int>(left.count())) > 0;
}

// Sends data by the deadline; false where it could not (the client is then dropped).
bool write_all(int fd, const std::string& data, std::chrono::steady_clock::time_point end) {
  size_t off = 0;
  while (off < data.size()) {
    if (!ready_by(fd, POLLOUT, end)) return false;
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::start(
    const std::string& address, int port, std::shared_ptr<prometheus::Registry> registry,
    Check liveness, Check readiness) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  if (int rc =
          getaddrinfo(address.empty() ? nullptr : address.c_str(), port_str.c_str(), &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "': ", gai_strerror(rc)));
  }
  int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || ::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
    const int err = errno;
    freeaddrinfo(res);
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ":", port, ": ", std::strerror(err)));
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer);
  s->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s->listen_fd_ = fd;
  s->registry_ = std::move(registry);
  s->liveness_ = std::move(liveness);
  s->readiness_ = std::move(readiness);
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void MetricsHttpServer::serve() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;  // wake up regularly to notice stop_
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // A slow or silent client cannot hold the thread: the request head is read within 2 s and
    // the answer sent within kWriteLimit, however the client trickles or reads.
    answer(fd);
    ::close(fd);
  }
}

void MetricsHttpServer::answer(int fd) {
  // Read the request head (up to 8 KiB) within 2 s in all, however the client trickles it in (a
  // client that held this thread would hold up /healthz); only the request line matters.
  std::string head;
  char buf[1024];
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (head.size() < 8192 && head.find("\r\n\r\n") == std::string::npos &&
         head.find("\n\n") == std::string::npos) {
    if (!ready_by(fd, POLLIN, end)) break;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  const size_t eol = head.find_first_of("\r\n");
  const std::string line = head.substr(0, eol);
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (line.rfind("GET /metrics ", 0) == 0 || line == "GET /metrics" ||
      line.rfind("GET /metrics?", 0) == 0) {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, registry_->Collect());
    body = out.str();
  } else if (line.rfind("GET /healthz ", 0) == 0 || line == "GET /healthz" ||
             line.rfind("GET /readyz ", 0) == 0 || line == "GET /readyz") {
    // Answered on this thread, whatever the gRPC server's threads are doing (every one held by a
    // stream, say, where gRPC answers a health check RESOURCE_EXHAUSTED).
    const bool live = line.rfind("GET /healthz", 0) == 0;
    const Check& check = live ? liveness_ : readiness_;
    type = "text/plain";
    body = live ? "ok\n" : "serving\n";
    if (std::string why = check ? check() : std::string(); !why.empty()) {
      status = "503 Service Unavailable";
      body = absl::StrCat(why, "\n");
    }
  } else if (line.rfind("GET ", 0) == 0) {
    status = "404 Not Found";
    type = "text/plain";
    body = "metrics are at /metrics, liveness at /healthz, readiness at /readyz\n";
  } else {
    status = "405 Method Not Allowed";
    type = "text/plain";
    body = "only GET is supported\n";
  }
  write_all(fd,
            absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ",
                         body.size(), "\r\nConnection: close\r\n\r\n", body),
            std::chrono::steady_clock::now() + kWriteLimit);
}

}  // namespace qlinear
