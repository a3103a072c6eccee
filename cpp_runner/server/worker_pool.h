// The threads that run whole requests (transport.h hands them over once read).
// A request that may take long (a completion waits for a slot and generates;
// an adapter loads) runs on at most threads - reserved of them, so `reserved`
// threads are always there for the quick ones (GET /health, /v1/models,
// /v1/stats) however many completions are running or waiting.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lora_share::server {

class WorkerPool {
 public:
  WorkerPool(size_t threads, size_t reserved);
  // Runs what is queued, then joins the threads.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Quick jobs go first, on any free thread.
  void submit(std::function<void()> job, bool quick);

 private:
  void work();

  const size_t long_limit_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> quick_, long_;
  size_t long_running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace lora_share::server
