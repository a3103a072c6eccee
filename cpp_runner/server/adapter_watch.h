// Adapters added to the served folder while the server runs: `lora-share add
// --to DIR` rewrites DIR/manifest.json, and the watch, polling that file's
// modification time and size, offers each adapter it lists to the server
// (App::add_adapter, adapter_routes.cpp: the one way an adapter joins the
// served set, POST /v1/adapters's too), which registers those it does not
// serve yet.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace lora_share::server {

class AdapterWatch {
 public:
  // `offer(name, pte)` is called for each adapter manifest.json lists, once
  // when the watch starts and again after each change of the file.
  AdapterWatch(std::string dir, std::chrono::milliseconds interval,
               std::function<void(const std::string& name, const std::string& pte)> offer);
  ~AdapterWatch();  // stops and joins the polling thread
  AdapterWatch(const AdapterWatch&) = delete;
  AdapterWatch& operator=(const AdapterWatch&) = delete;

 private:
  void run();
  void offer_listed();

  std::string dir_;
  std::chrono::milliseconds interval_;
  std::function<void(const std::string&, const std::string&)> offer_;
  std::mutex lock_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace lora_share::server
