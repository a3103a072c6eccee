// The HTTP surface: OpenAI-style completions and chat completions over one
// lora-share runtime, /v1/models from the deployment's manifest, /health and
// /v1/stats. Requests are served one at a time in arrival order (fifo_gate.h);
// no request, however malformed or abandoned, stops the server.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "adapter_watch.h"
#include "deployment.h"
#include "fifo_gate.h"
#include "lora_share.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace lora_share::server {

class App {
 public:
  // Takes ownership of `runtime`.
  App(ls_runtime* runtime, Deployment deployment);
  ~App();
  App(const App&) = delete;
  App& operator=(const App&) = delete;

  // Registers every route on `http`.
  void install(httplib::Server& http);

  // Serves the adapters `lora-share add` writes into the folder from now on
  // (adapter_watch.h), manifest.json polled every `interval`.
  void watch_folder(std::chrono::milliseconds interval);

 private:
  void completions(const httplib::Request& req, httplib::Response& res, bool chat);
  void stats(httplib::Response& res);

  // The adapters served (deployment_.adapters) under adapters_lock_: the
  // folder watch adds to them while requests read them.
  bool serves(const std::string& name) const;

  ls_runtime* runtime_;
  Deployment deployment_;
  mutable std::mutex adapters_lock_;
  std::unique_ptr<AdapterWatch> watch_;  // stopped before the runtime closes
  FifoGate gate_;
};

}  // namespace lora_share::server
