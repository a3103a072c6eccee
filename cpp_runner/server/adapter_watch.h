// Adapters added to the served folder while the server runs: `lora-share add
// --to DIR` rewrites DIR/manifest.json, and the watch, polling that file's
// modification time and size, registers each adapter it lists that the
// runtime does not know yet (ls_load_adapter: checked against the foundation,
// then served). An adapter whose file does not verify is refused with one
// stderr line; the others keep serving. Requests in flight finish first (the
// runtime's lock), on what they started with.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "lora_share.h"

namespace lora_share::server {

class AdapterWatch {
 public:
  // `added(name)` is called for each adapter registered; `known(name)` says
  // whether the server serves it already.
  AdapterWatch(ls_runtime* runtime, std::string dir, std::chrono::milliseconds interval,
               std::function<bool(const std::string&)> known, std::function<void(const std::string&)> added);
  ~AdapterWatch();  // stops and joins the polling thread
  AdapterWatch(const AdapterWatch&) = delete;
  AdapterWatch& operator=(const AdapterWatch&) = delete;

 private:
  void run();
  void register_new();

  ls_runtime* runtime_;
  std::string dir_;
  std::chrono::milliseconds interval_;
  std::function<bool(const std::string&)> known_;
  std::function<void(const std::string&)> added_;
  std::mutex lock_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace lora_share::server
