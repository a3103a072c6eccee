#include "worker_pool.h"

namespace lora_share::server {

WorkerPool::WorkerPool(size_t threads, size_t reserved) : long_limit_(threads > reserved ? threads - reserved : 1) {
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::submit(std::function<void()> job, bool quick) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    (quick ? quick_ : long_).push_back(std::move(job));
  }
  wake_.notify_all();
}

void WorkerPool::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    const bool long_ready = !long_.empty() && long_running_ < long_limit_;
    if (quick_.empty() && !long_ready) {
      if (stopping_ && long_.empty()) return;
      wake_.wait(lock);
      continue;
    }
    const bool quick = !quick_.empty();
    std::deque<std::function<void()>>& queue = quick ? quick_ : long_;
    std::function<void()> job = std::move(queue.front());
    queue.pop_front();
    if (!quick) ++long_running_;
    lock.unlock();
    job();
    job = nullptr;  // what it holds (a request's bytes) goes now, not at the next job
    lock.lock();
    if (!quick) {
      --long_running_;
      wake_.notify_all();  // a long job may start now
    }
  }
}

}  // namespace lora_share::server
