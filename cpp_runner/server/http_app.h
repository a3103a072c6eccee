// The HTTP surface: OpenAI-style completions and chat completions over one
// lora-share runtime, /v1/models from the deployment's manifest, /health and
// /v1/stats. Requests are served one at a time in arrival order (fifo_gate.h);
// no request, however malformed or abandoned, stops the server.
#pragma once

#include <memory>
#include <string>

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

 private:
  void completions(const httplib::Request& req, httplib::Response& res, bool chat);
  void stats(httplib::Response& res);

  ls_runtime* runtime_;
  Deployment deployment_;
  FifoGate gate_;
};

}  // namespace lora_share::server
