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
  int fd =
      ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, res->ai_protocol);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || ::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
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
  // One thread serves every client at once, each with a deadline of its own, so that a client that
  // sends nothing, trickles its request or reads its answer a few bytes at a time holds up no one
  // else (a /healthz probe behind three silent connections waited 2 s for each).
  using Clock = std::chrono::steady_clock;
  struct Client {
    int fd;
    std::string in, out;
    size_t sent = 0;
    bool writing = false;
    Clock::time_point end;
  };
  std::vector<Client> clients;
  std::vector<pollfd> fds;
  auto respond = [this](Client& c) {
    c.out = response_to(c.in);
    c.writing = true;
    c.end = Clock::now() + kWriteLimit;
  };
  while (!stop_.load()) {
    fds.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    // Wake up regularly to notice stop_, and at the nearest deadline.
    auto now = Clock::now();
    auto wake = now + std::chrono::milliseconds(200);
    for (const Client& c : clients) {
      fds.push_back({c.fd, static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, c.end);
    }
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait))) < 0) continue;
    now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      if (fds[i + 1].revents == 0) continue;
      if (!c.writing) {
        char buf[1024];
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        const bool retry = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
        if (n == 0 || (n < 0 && !retry) || head_complete(c.in)) respond(c);
      } else {
        const ssize_t n =
            ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          c.sent += static_cast<size_t>(n);
        } else if (!(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
          c.end = now;  // the client went away
        }
      }
    }
    // A head not complete by its deadline is answered as it stands; an answer not taken by its
    // deadline, or taken whole, ends the connection.
    for (size_t i = 0; i < clients.size();) {
      Client& c = clients[i];
      if (!c.writing && now >= c.end) respond(c);
      if (c.writing && (c.sent == c.out.size() || now >= c.end)) {
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
      if (fd < 0) break;  // none left (the listening socket does not block)
      if (clients.size() >= kMaxClients) {
        auto nearest =
            std::min_element(clients.begin(), clients.end(),
                             [](const Client& a, const Client& b) { return a.end < b.end; });
        ::close(nearest->fd);
        *nearest = std::move(clients.back());
        clients.pop_back();
      }
      clients.push_back(Client{fd, {}, {}, 0, false, now + kReadLimit});
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
