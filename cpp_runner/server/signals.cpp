#include "signals.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <ctime>
#include <iostream>
#include <thread>

namespace lora_share::server {
namespace {

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

[[noreturn]] void exit_now(int signal, const char* why) {
  std::cerr << why << std::endl;
  _exit(128 + signal);  // no destructors: they would wait for the requests still running
}

}  // namespace

StopSignals::StopSignals() {
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void StopSignals::watch(std::chrono::milliseconds grace) {
  std::thread([this, grace] { wait_for_signals(grace); }).detach();
}

void StopSignals::on_first(std::function<void()> drain) {
  std::lock_guard<std::mutex> lock(mutex_);
  drain_ = std::move(drain);
}

void StopSignals::wait_for_signals(std::chrono::milliseconds grace) {
  const sigset_t set = stop_signals();
  int first = 0;
  while (sigwait(&set, &first) != 0) {
  }
  std::function<void()> drain;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    drain = drain_;
  }
  if (!drain) exit_now(first, "stopped before serving");
  std::cerr << "draining: no new requests; the open ones have " << grace.count() / 1000.0
            << " s to finish (a second signal exits now)" << std::endl;
  drain();
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) exit_now(first, "drain: the grace period (--drain-timeout) is over: exiting now");
    timespec wait{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
    const int second = sigtimedwait(&set, nullptr, &wait);
    if (second > 0) exit_now(second, "a second signal: exiting now");
    if (errno != EAGAIN && errno != EINTR) exit_now(first, "drain: cannot wait for signals: exiting now");
  }
}

}  // namespace lora_share::server
