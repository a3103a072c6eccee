#include "transport.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>

#include <nlohmann/json.hpp>

#include "request_framing.h"

namespace lora_share::server {
namespace {

// A keep-alive connection is closed after this many requests (httplib's
// Keep-Alive header says so).
constexpr int kMaxRequestsPerConnection = 100;
// Threads kept for quick requests (GET), whatever the completions do.
constexpr size_t kQuickThreads = 2;
// How long a refused client has to read the refusal before the socket closes.
constexpr std::chrono::milliseconds kLinger{2000};
// File descriptors besides the connections (listening, epoll, the library's files).
constexpr size_t kOtherFiles = 64;
constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kReadTurn = 1 << 20;

const char* reason(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    default:
      return "Service Unavailable";
  }
}

// A whole answer with an OpenAI-shaped error body and Connection: close.
std::string error_response(int status, const std::string& message) {
  const nlohmann::json body = {
      {"error",
       {{"message", message}, {"type", status < 500 ? "invalid_request_error" : "server_error"}, {"code", status}}}};
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return "HTTP/1.1 " + std::to_string(status) + " " + reason(status) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(text.size()) +
         "\r\nConnection: close\r\n\r\n" + text;
}

// Small writes to a socket that has room for them; what does not fit is dropped.
void send_now(int fd, const std::string& bytes) {
  (void)send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

std::string seconds(std::chrono::milliseconds d) {
  std::string s = std::to_string(d.count() / 1000.0);
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  return s + " s";
}

}  // namespace

struct Transport::Connection {
  enum class Phase {
    kHead,        // waiting for a request's head (idle when `in` is empty)
    kBody,        // the head is in, the body is coming
    kWithWorker,  // whole, queued or being answered: not watched, never freed here
    kClosing,     // refused: the answer is sent, the socket closes on the client's end or at the deadline
  };
  Connection(int fd, uint64_t max_body) : fd(fd), framing(max_body) {}

  int fd;
  std::string in;  // bytes received, not handed over yet
  RequestFraming framing;
  Phase phase = Phase::kHead;
  Clock::time_point deadline;  // of the phase
  uint64_t since = 0;          // the phase's start, in phases started: the oldest goes first when evicting
  size_t charged = 0;          // this request's body bytes, in charged_
  int served = 0;
  bool watched = false;
  bool keep_open = false;  // set by the worker: the connection may take another request
};

Transport::Transport(TransportOptions options)
    : options_(options),
      workers_(std::make_unique<WorkerPool>(options.workers, kQuickThreads)),
      epoll_fd_(epoll_create1(EPOLL_CLOEXEC)),
      wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  dispatcher_.set_payload_max_length(options.max_body);
  // Only what the Keep-Alive header of httplib's answers says.
  dispatcher_.set_keep_alive_max_count(kMaxRequestsPerConnection);
  dispatcher_.set_keep_alive_timeout(std::max<time_t>(1, options.header_timeout.count() / 1000));
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &e);
}

Transport::~Transport() {
  workers_.reset();  // joins the workers, which may still hold connections
  for (auto& [fd, c] : connections_) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

StatusOr<int> Transport::listen(const std::string& host, int port) {
  // Each connection is a file descriptor: the limit must hold them all.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
    getrlimit(RLIMIT_NOFILE, &files);
  }
  if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur < options_.max_connections + kOtherFiles) {
    return Status::usage("--max-connections " + std::to_string(options_.max_connections) + " needs " +
                         std::to_string(options_.max_connections + kOtherFiles) +
                         " open files, and this process may open " + std::to_string(files.rlim_cur) +
                         " (ulimit -n): lower --max-connections or raise the limit");
  }
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    return Status::failure("cannot listen on " + where +
                           " (no such address; is it an address of this machine?): " + "pick another --host");
  }
  int error = 0;
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR lets a restart reuse a port left in TIME_WAIT; no
    // SO_REUSEPORT, with which a second server would bind the same port.
    const int yes = 1, no = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listen_fd_ = fd;
    } else {
      error = errno;
      ::close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) {
    if (error == EADDRINUSE) {
      return Status::failure("port " + std::to_string(port) + " is in use (on " + host +
                             "), by another server or program: stop it or pick another --port");
    }
    return Status::failure("cannot listen on " + where + " (" + std::strerror(error) +
                           "; is it an address of this machine?): pick another --host or --port");
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                                           : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &e);
  return bound_port;
}

void Transport::drain() {
  drain_asked_ = true;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void Transport::serve() {
  epoll_event events[64];
  while (!(draining_ && connections_.empty())) {
    const int n = epoll_wait(epoll_fd_, events, 64, next_wait_ms(Clock::now()));
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        accept_all(now);
      } else if (fd == wake_fd_) {
        uint64_t count;
        (void)!read(wake_fd_, &count, sizeof(count));
        take_back_returned(now);
        if (drain_asked_ && !draining_) start_draining();
      } else if (auto it = connections_.find(fd);
                 it != connections_.end() && it->second->phase != Connection::Phase::kWithWorker) {
        read_from(*it->second, now);
      }
    }
    if (accept_paused_until_ != Clock::time_point{} && now >= accept_paused_until_ && !draining_) {
      accept_paused_until_ = {};
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.fd = listen_fd_;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &e);
    }
    expire(now);
  }
  workers_.reset();
}

int Transport::next_wait_ms(Clock::time_point now) const {
  Clock::time_point next = accept_paused_until_;
  for (const auto& [fd, c] : connections_) {
    if (c->phase == Connection::Phase::kWithWorker) continue;
    if (next == Clock::time_point{} || c->deadline < next) next = c->deadline;
  }
  if (next == Clock::time_point{}) return -1;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 60000));
}

void Transport::watch(Connection& c, bool on) {
  if (on == c.watched) return;
  epoll_event e{};
  e.events = EPOLLIN | EPOLLRDHUP;
  e.data.fd = c.fd;
  epoll_ctl(epoll_fd_, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, c.fd, &e);
  c.watched = on;
}

void Transport::accept_all(Clock::time_point now) {
  while (!draining_) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (evict_one()) continue;
        // Out of descriptors with every connection busy: try again shortly.
        accept_paused_until_ = now + std::chrono::milliseconds(100);
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
      }
      return;
    }
    if (connections_.size() >= options_.max_connections && !evict_one()) {
      send_now(fd, error_response(503, "every one of the server's " + std::to_string(options_.max_connections) +
                                           " connections (--max-connections) is being answered: retry shortly"));
      ::close(fd);
      continue;
    }
    auto c = std::make_unique<Connection>(fd, options_.max_body);
    c->since = ++phases_started_;
    c->deadline = now + options_.header_timeout;
    watch(*c, true);
    connections_.emplace(fd, std::move(c));
  }
}

bool Transport::evict_one() {
  // Refused ones first, then idle ones, then those still sending: the oldest of each.
  auto rank = [](const Connection& c) {
    return c.phase == Connection::Phase::kClosing ? 0 : c.phase == Connection::Phase::kHead && c.in.empty() ? 1 : 2;
  };
  Connection* victim = nullptr;
  for (const auto& [fd, c] : connections_) {
    if (c->phase == Connection::Phase::kWithWorker) continue;
    if (victim == nullptr || rank(*c) < rank(*victim) || (rank(*c) == rank(*victim) && c->since < victim->since)) {
      victim = c.get();
    }
  }
  if (victim == nullptr) return false;
  if (rank(*victim) == 2) {
    send_now(victim->fd, error_response(503, "the server has " + std::to_string(options_.max_connections) +
                                                 " connections open (--max-connections) and closed this one, "
                                                 "which was the slowest to send its request: retry"));
  }
  close(victim->fd);
  return true;
}

void Transport::read_from(Connection& c, Clock::time_point now) {
  char buffer[kReadChunk];
  // At most kReadTurn bytes a turn: a client that sends without pause waits
  // for the next epoll round, as the others do.
  for (size_t turn = 0; turn < kReadTurn; turn += sizeof(buffer)) {
    const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) return close(c.fd);                        // the client left (or its socket failed): nothing to answer
    if (c.phase == Connection::Phase::kClosing) continue;  // what a refused client still sends
    c.in.append(buffer, static_cast<size_t>(n));
    advance(c, now);
    if (c.phase == Connection::Phase::kWithWorker) return;
  }
}

bool Transport::charge(Connection& c, size_t bytes) {
  if (bytes <= c.charged) return true;
  const uint64_t cap = 8 * options_.max_body;
  const uint64_t more = bytes - c.charged;
  if (charged_.fetch_add(more) + more > cap) {
    charged_ -= more;
    return false;
  }
  c.charged = bytes;
  return true;
}

void Transport::advance(Connection& c, Clock::time_point now) {
  if (c.phase == Connection::Phase::kHead && c.in.size() >= 2 && c.in.compare(0, 2, "\r\n") == 0) {
    // Blank lines between requests (some clients end a body with CRLF) are skipped.
    const size_t start = c.in.find_first_not_of("\r\n");
    c.in.erase(0, start == std::string::npos ? c.in.size() - c.in.size() % 2 : start);
    c.framing = RequestFraming(options_.max_body);
  }
  const RequestFraming::State state = c.framing.scan(c.in);
  if (state == RequestFraming::State::kError) {
    return refuse(c, c.framing.error_status(), c.framing.error_message());
  }
  if (state == RequestFraming::State::kHead) return;
  const size_t head = c.framing.head_size();
  if (c.phase == Connection::Phase::kHead) {
    // The head is in: the body's own time starts.
    c.phase = Connection::Phase::kBody;
    c.since = ++phases_started_;
    c.deadline = now + options_.body_timeout;
    if (!charge(c, c.framing.declared_body())) {
      return refuse(c, 503,
                    "the server is reading other large request bodies (" + std::to_string(8 * options_.max_body) +
                        " bytes at most at once, 8 x --max-body): retry shortly");
    }
    c.in.reserve(head + c.framing.declared_body());  // one allocation for the body, not doublings
    if (state == RequestFraming::State::kBody && c.framing.expects_continue()) {
      send_now(c.fd, "HTTP/1.1 100 Continue\r\n\r\n");
    }
  }
  if (!charge(c, c.in.size() - head)) {
    return refuse(c, 503,
                  "the server is reading other large request bodies (" + std::to_string(8 * options_.max_body) +
                      " bytes at most at once, 8 x --max-body): retry shortly");
  }
  if (state == RequestFraming::State::kDone) hand_over(c);
}

void Transport::hand_over(Connection& c) {
  const size_t size = c.framing.request_size();
  std::string request;
  if (c.framing.expects_continue()) {
    // Answered here already: httplib would send a second 100 Continue.
    const size_t head = c.framing.head_size();
    request = RequestFraming::without_expect(std::string_view(c.in).substr(0, head));
    request.append(c.in, head, size - head);
    c.in.erase(0, size);
  } else if (size == c.in.size()) {
    request = std::move(c.in);
    c.in = std::string();
  } else {
    request.assign(c.in, 0, size);
    c.in.erase(0, size);  // the next request, pipelined: read once this one is answered
  }
  const bool quick = c.framing.method() == "GET" || c.framing.method() == "HEAD";
  c.framing = RequestFraming(options_.max_body);
  c.phase = Connection::Phase::kWithWorker;
  watch(c, false);
  serve_on_worker(c, request, quick);
}

void Transport::serve_on_worker(Connection& c, std::string& request, bool quick) {
  const bool last = ++c.served >= kMaxRequestsPerConnection;
  const size_t charged = c.charged;
  c.charged = 0;  // from now on the worker's to release
  auto bytes = std::make_shared<std::string>(std::move(request));
  Connection* conn = &c;
  workers_->submit(
      [this, conn, bytes, charged, last] {
        const bool close_after = last || drain_asked_;
        RequestStream stream(conn->fd, *bytes, options_.write_timeout);
        bool client_closes = false;
        const bool answered = dispatcher_.serve(stream, close_after, client_closes);
        conn->keep_open = answered && !client_closes && !close_after;
        const bool large = bytes->size() >= MemoryTrimmer::kLargeRequest;
        *bytes = std::string();
        charged_ -= charged;
        {
          std::lock_guard<std::mutex> lock(returned_lock_);
          returned_.push_back(conn);
        }
        const uint64_t one = 1;
        (void)!write(wake_fd_, &one, sizeof(one));
        if (large) trimmer_.request();
      },
      quick);
}

void Transport::take_back_returned(Clock::time_point now) {
  std::vector<Connection*> returned;
  {
    std::lock_guard<std::mutex> lock(returned_lock_);
    returned.swap(returned_);
  }
  for (Connection* c : returned) {
    if (!c->keep_open || draining_) {
      close(c->fd);
      continue;
    }
    c->phase = Connection::Phase::kHead;
    c->since = ++phases_started_;
    c->deadline = now + options_.header_timeout;
    watch(*c, true);
    if (!c->in.empty()) advance(*c, now);  // a pipelined request, read with the last one
  }
}

void Transport::expire(Clock::time_point now) {
  std::vector<Connection*> due;
  for (const auto& [fd, c] : connections_) {
    if (c->phase != Connection::Phase::kWithWorker && c->deadline <= now) due.push_back(c.get());
  }
  for (Connection* c : due) {
    if (c->phase == Connection::Phase::kHead && !c->in.empty()) {
      refuse(*c, 408,
             "the request's head did not arrive within --header-timeout (" + seconds(options_.header_timeout) +
                 ") of the connection's start or its last answer");
    } else if (c->phase == Connection::Phase::kBody) {
      refuse(*c, 408,
             "the request's body did not arrive within --body-timeout (" + seconds(options_.body_timeout) +
                 ") of its head");
    } else {
      close(c->fd);  // idle, or refused and given its moment to read
    }
  }
}

void Transport::start_draining() {
  draining_ = true;
  if (listen_fd_ >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
  std::vector<Connection*> open;
  for (const auto& [fd, c] : connections_) open.push_back(c.get());
  for (Connection* c : open) {
    if (c->phase == Connection::Phase::kBody || (c->phase == Connection::Phase::kHead && !c->in.empty())) {
      refuse(*c, 503, "the server is stopping: send the request again once it is back");
    } else if (c->phase == Connection::Phase::kHead) {
      close(c->fd);
    }
  }
}

void Transport::refuse(Connection& c, int status, const std::string& message) {
  const Clock::time_point now = Clock::now();
  send_now(c.fd, error_response(status, message));
  shutdown(c.fd, SHUT_WR);
  charged_ -= c.charged;
  c.charged = 0;
  if (c.in.capacity() >= MemoryTrimmer::kLargeRequest) trimmer_.request();
  c.in = std::string();
  c.phase = Connection::Phase::kClosing;
  c.since = ++phases_started_;
  c.deadline = now + kLinger;
}

void Transport::close(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  Connection& c = *it->second;
  watch(c, false);
  charged_ -= c.charged;
  const bool large = c.in.capacity() >= MemoryTrimmer::kLargeRequest;
  ::close(fd);
  connections_.erase(it);
  if (large) trimmer_.request();
}

}  // namespace lora_share::server
