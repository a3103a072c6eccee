// Requests are served one at a time, in the order they arrived: every
// adapter of a runtime runs in one shared planned-memory arena, so two
// generations can never overlap. A plain mutex would not keep arrival order
// (its waiters wake in any order); tickets do.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace lora_share::server {

class FifoGate {
 public:
  // A place in the queue, taken when the request arrives; wait() blocks until
  // every earlier ticket has been released. Released on destruction.
  class Ticket {
   public:
    explicit Ticket(FifoGate& gate) : gate_(&gate), number_(gate.take()) {}
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { gate_->release(number_); }
    void wait() { gate_->wait_for(number_); }

   private:
    FifoGate* gate_;
    uint64_t number_;
  };

 private:
  uint64_t take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return next_++;
  }
  void wait_for(uint64_t number) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return serving_ == number; });
  }
  // A ticket is released once, in turn: a later ticket released early (its
  // request failed before waiting) must not let the queue skip ahead, so it
  // waits for its turn first.
  void release(uint64_t number) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return serving_ == number; });
    ++serving_;
    changed_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t next_ = 0;
  uint64_t serving_ = 0;
};

}  // namespace lora_share::server
