// The server's connections: one thread reads every socket (epoll) and hands a
// worker thread (worker_pool.h) only whole requests, read into memory within
// their deadlines; the worker runs httplib's routing on it (request_stream.h)
// and writes the answer. So a client that is slow, idle or never finishes its
// request holds a few bytes and a file descriptor, never a thread:
//
// - a request's head (request line and headers) must be in --header-timeout
//   after the connection opened or its last answer was sent (an idle
//   keep-alive connection is closed then, a half-sent head gets 408);
// - its body must be in --body-timeout after its head (else 408).
// Both are total times, not gaps between bytes: a byte a second does not keep
// a request alive.
// - At most --max-connections are open: a new one closes the oldest that is
//   idle or still sending its request, and is refused (503) if every one is
//   being answered.
// - Bodies being read are held within 8 x --max-body in all (503 beyond, at
//   once: the client may retry), so many large half-sent bodies cannot use up
//   memory; after a request of 1 MiB or more the allocator is trimmed
//   (memory_trim.h).
// - drain() (the first SIGTERM or SIGINT): no new connections or requests,
//   the requests already in are answered, then serve() returns.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory_trim.h"
#include "request_stream.h"
#include "status.h"
#include "worker_pool.h"

namespace lora_share::server {

struct TransportOptions {
  uint64_t max_body = 8ull << 20;
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{30000};
  size_t max_connections = 256;
  size_t workers = 12;  // threads answering requests
  // How long one write may wait for a client that reads nothing, as
  // httplib's default write timeout.
  std::chrono::milliseconds write_timeout{5000};
};

class Transport {
 public:
  explicit Transport(TransportOptions options);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Where the routes go (App::install).
  httplib::Server& routes() { return dispatcher_; }

  // Binds and listens on host:port (0: any free port); returns the port.
  StatusOr<int> listen(const std::string& host, int port);
  // Serves until drain() has finished every request taken.
  void serve();
  // Thread-safe, returns at once.
  void drain();

 private:
  struct Connection;
  using Clock = std::chrono::steady_clock;

  void accept_all(Clock::time_point now);
  void read_from(Connection& c, Clock::time_point now);
  void advance(Connection& c, Clock::time_point now);
  void hand_over(Connection& c);
  void serve_on_worker(Connection& c, std::string& request, bool quick);
  void take_back_returned(Clock::time_point now);
  void expire(Clock::time_point now);
  void start_draining();
  // An answer from the transport itself (408, 413, 503, ...), then the
  // connection closes after the client has had a moment to read it.
  void refuse(Connection& c, int status, const std::string& message);
  void close(int fd);
  bool evict_one();
  int next_wait_ms(Clock::time_point now) const;
  bool charge(Connection& c, size_t bytes);
  void watch(Connection& c, bool on);

  TransportOptions options_;
  Dispatcher dispatcher_;
  MemoryTrimmer trimmer_;
  std::unique_ptr<WorkerPool> workers_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: a worker returned a connection, or drain() was called
  std::unordered_map<int, std::unique_ptr<Connection>> connections_;
  // Counts phase starts, to order connections (several start in one clock tick).
  uint64_t phases_started_ = 0;  // connections whose request is queued or being answered
  Clock::time_point accept_paused_until_{};
  std::atomic<bool> drain_asked_{false};
  bool draining_ = false;
  std::atomic<uint64_t> charged_{0};  // body bytes held for requests being read or answered
  std::mutex returned_lock_;
  std::vector<Connection*> returned_;  // answered by a worker, back to the reading thread
};

}  // namespace lora_share::server
