#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace qlinear {
namespace {

// How long a client may take to send its request head, and to take the answer: past either it is
// dropped (a head cut short is answered as it stands).
constexpr std::chrono::seconds kReadLimit{2};
constexpr std::chrono::seconds kWriteLimit{5};
// The most clients served at once: a new one beyond them ends the one nearest its deadline, so
// that clients holding every place (connected, silent) cannot keep a probe waiting.
constexpr size_t kMaxClients = 64;
// The longest request head read; only its request line matters.
constexpr size_t kMaxHeadBytes = 8192;
// After the answer, what the client still sends (a POST's body, the rest of a head over the cap) is
// read and dropped for up to this long and this many bytes before the connection is closed:
// closed with bytes unread, it is reset, and a client still writing its request then fails on its
// write and never reads the answer.
constexpr std::chrono::seconds kDrainLimit{1};
constexpr size_t kMaxDrainBytes = size_t{1} << 20;
// How long accepting waits after it failed for want of file descriptors or memory: the waiting
// connection keeps the listening socket readable, and retrying at once would spin.
constexpr std::chrono::milliseconds kAcceptBackoff{100};

bool head_complete(const std::string& head) {
  return head.size() >= kMaxHeadBytes || head.find("\r\n\r\n") != std::string::npos ||
         head.find("\n\n") != std::string::npos;
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
  // The first address that binds: a name may resolve to an address of a family this host lacks
  // (IPv6 in a container without it) before one it has. An address that exists but cannot be
  // bound (in use, not permitted) ends the search with its own error, so that the port is never
  // served quietly on another family while another process holds it on the first.
  int fd = -1;
  int err = 0;
  auto family_missing = [](int e) {
    return e == EAFNOSUPPORT || e == EADDRNOTAVAIL || e == EPROTONOSUPPORT;
  };
  for (const addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      if (family_missing(err)) continue;
      break;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 128) == 0) break;
    err = errno;
    ::close(fd);
    fd = -1;
    if (!family_missing(err)) break;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ":", port, ": ", std::strerror(err)));
  }
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
  // One thread serves every client at once, each with a deadline of its own, so that a client that
  // sends nothing, trickles its request or reads its answer a few bytes at a time holds up no one
  // else (a /healthz probe behind three silent connections waited 2 s for each).
  using Clock = std::chrono::steady_clock;
  enum class Phase {
    kReading,   // the request head
    kWriting,   // the answer
    kDraining,  // the answer sent and our side shut: what the client still sends is dropped
  };
  struct Client {
    int fd;
    std::string in, out;
    size_t sent = 0;
    size_t drained = 0;
    Phase phase = Phase::kReading;
    Clock::time_point end;
  };
  std::vector<Client> clients;
  std::vector<pollfd> fds;
  Clock::time_point accept_after{};  // accepting resumes then (after a failure for want of fds)
  auto respond = [this](Client& c) {
    c.out = response_to(c.in);
    c.phase = Phase::kWriting;
    c.end = Clock::now() + kWriteLimit;
  };
  while (!stop_.load()) {
    fds.clear();
    auto now = Clock::now();
    const bool accepting = now >= accept_after;
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    // Wake up regularly to notice stop_, and at the nearest deadline.
    auto wake = now + std::chrono::milliseconds(200);
    if (!accepting) wake = std::min(wake, accept_after);
    for (const Client& c : clients) {
      fds.push_back({c.fd, static_cast<short>(c.phase == Phase::kWriting ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, c.end);
    }
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait))) < 0) continue;
    now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      if (fds[i + 1].revents == 0) continue;
      if (c.phase == Phase::kReading) {
        char buf[1024];
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        const bool retry = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
        if (n == 0 || (n < 0 && !retry) || head_complete(c.in)) respond(c);
      } else if (c.phase == Phase::kWriting) {
        const ssize_t n =
            ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          c.sent += static_cast<size_t>(n);
        } else if (!(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
          c.end = now;  // the client went away
        }
      } else {
        char buf[16384];
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) c.drained += static_cast<size_t>(n);
        const bool retry = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
        // The client's end of the request, or more than is worth reading.
        if (n == 0 || (n < 0 && !retry) || c.drained > kMaxDrainBytes) c.end = now;
      }
    }
    // A head not complete by its deadline is answered as it stands; an answer taken whole is
    // followed by a short drain; an answer not taken by its deadline, or a drain that ends, ends
    // the connection.
    for (size_t i = 0; i < clients.size();) {
      Client& c = clients[i];
      if (c.phase == Phase::kReading && now >= c.end) respond(c);
      if (c.phase == Phase::kWriting && c.sent == c.out.size() && now < c.end) {
        ::shutdown(c.fd, SHUT_WR);
        c.phase = Phase::kDraining;
        c.end = now + kDrainLimit;
      }
      if (c.phase != Phase::kReading && now >= c.end) {
        ::close(c.fd);
        clients[i] = std::move(clients.back());
        clients.pop_back();
        continue;
      }
      ++i;
    }
    // Every connection waiting is taken now, in order (one a turn would leave the later ones,
    // a probe among them, waiting behind the earlier ones' turns).
    for (int taken = 0; (fds[0].revents & POLLIN) != 0 && taken < 256; ++taken) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors or memory: the connection stays queued, and is tried again later.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accept_after = now + kAcceptBackoff;
        }
        break;  // else none left (the listening socket does not block)
      }
      if (clients.size() >= kMaxClients) {
        auto nearest =
            std::min_element(clients.begin(), clients.end(),
                             [](const Client& a, const Client& b) { return a.end < b.end; });
        ::close(nearest->fd);
        *nearest = std::move(clients.back());
        clients.pop_back();
      }
      clients.push_back(Client{fd, {}, {}, 0, 0, Phase::kReading, now + kReadLimit});
    }
  }
  for (const Client& c : clients) ::close(c.fd);
}

std::string MetricsHttpServer::response_to(const std::string& head) const {
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
  return absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace qlinear
