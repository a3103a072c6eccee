// How a worker thread runs one whole request through cpp-httplib without
// httplib's own sockets: the transport (transport.h) has read the request
// into memory, RequestStream hands httplib those bytes and writes its answer
// to the client's socket, and Dispatcher runs httplib's reading, routing and
// answering (Server::process_request) on that stream. So the routes App
// installs (http_app.h) are httplib's, unchanged, and httplib's threads never
// wait on a client's bytes.
#pragma once

#include <httplib.h>

#include <chrono>
#include <string>

namespace lora_share::server {

class RequestStream : public httplib::Stream {
 public:
  // `request`: the whole request (head and body), kept by the caller while
  // the stream lives. A write that cannot go on for `write_timeout` (the
  // client reads nothing) fails.
  RequestStream(int fd, const std::string& request, std::chrono::milliseconds write_timeout);

  bool is_readable() const override { return read_ < request_.size(); }
  // False once the client has hung up: a streamed answer stops at its next token.
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return fd_; }

 private:
  int fd_;
  const std::string& request_;
  size_t read_ = 0;
  std::chrono::milliseconds write_timeout_;
};

// httplib's Server, its routes and its handling of one request, without its
// listening and threads (the transport's).
class Dispatcher : public httplib::Server {
 public:
  Dispatcher();
  // One request read from `stream` and answered on it. `connection_closed`
  // says the client asked to close (Connection: close, HTTP/1.0); false
  // return: nothing more can be said on the connection.
  bool serve(httplib::Stream& stream, bool close_connection, bool& connection_closed);
};

// True while the client at the other end of `fd` may still read: no error,
// no hang-up (a readable socket whose next byte is the end).
bool client_connected(int fd);

}  // namespace lora_share::server
