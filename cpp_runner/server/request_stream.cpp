#include "request_stream.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace lora_share::server {
namespace {

void numeric_address(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  char host[NI_MAXHOST], service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), service, sizeof(service),
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(service);
  }
}

}  // namespace

bool client_connected(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) < 0) return errno == EINTR;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return false;
  if (!(p.revents & POLLIN)) return true;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

RequestStream::RequestStream(int fd, const std::string& request, std::chrono::milliseconds write_timeout)
    : fd_(fd), request_(request), write_timeout_(write_timeout) {}

bool RequestStream::is_writable() const { return client_connected(fd_); }

ssize_t RequestStream::read(char* ptr, size_t size) {
  const size_t n = std::min(size, request_.size() - read_);
  std::memcpy(ptr, request_.data() + read_, n);
  read_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t RequestStream::write(const char* ptr, size_t size) {
  for (;;) {
    const ssize_t n = send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    // The client's buffers are full: wait for it to read, a while at most.
    pollfd p{fd_, POLLOUT, 0};
    const int ready = poll(&p, 1, static_cast<int>(write_timeout_.count()));
    if (ready == 0 || (ready < 0 && errno != EINTR) || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return -1;
  }
}

void RequestStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) numeric_address(addr, len, ip, port);
}

void RequestStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) numeric_address(addr, len, ip, port);
}

Dispatcher::Dispatcher() {
  // httplib writes a content provider's answer (a stream) only while
  // svr_sock_ holds a socket: its stop() empties it to cut streams. The
  // listening socket is the transport's, so a placeholder stands in for it.
  svr_sock_ = INT_MAX;
}

bool Dispatcher::serve(httplib::Stream& stream, bool close_connection, bool& connection_closed) {
  return process_request(stream, close_connection, connection_closed, nullptr);
}

}  // namespace lora_share::server
