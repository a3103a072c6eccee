// SIGINT and SIGTERM. The first one drains: the server stops taking requests
// and finishes those it has (streams included), for --drain-timeout at most.
// A second one, or the end of that grace period, exits at once (status 128 +
// the signal's number), cutting whatever is still open. A signal that comes
// before the server listens exits at once too: there is nothing to drain.
//
// The signals are blocked in every thread and taken by one thread with
// sigwait, so no handler runs in the middle of other code.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>

namespace lora_share::server {

class StopSignals {
 public:
  // Blocks SIGINT and SIGTERM in this thread and the threads it starts from
  // now on: construct it before any other thread, at the top of main().
  StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Starts the thread that waits for the signals (it lives until the process ends).
  void watch(std::chrono::milliseconds grace);

  // What the first signal does from now on (the transport's drain; it must
  // return at once). Without one, the first signal exits.
  void on_first(std::function<void()> drain);

 private:
  void wait_for_signals(std::chrono::milliseconds grace);

  std::mutex mutex_;
  std::function<void()> drain_;
};

}  // namespace lora_share::server
