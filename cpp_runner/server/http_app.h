// The HTTP surface: OpenAI-style completions and chat completions over one
// lora-share runtime, /v1/models (the runtime's adapters), /health and
// /v1/stats; adapters added and removed while serving (POST /v1/adapters,
// DELETE /v1/adapters/NAME and the folder watch: adapter_routes.cpp). A
// completion's body is the library's to read, check and answer (lora_share.h,
// REQUESTS: the schema every door shares); this layer maps its statuses to
// HTTP and its events to server-sent events. Each connection's thread calls
// the library, which runs up to ls_options.parallel requests at once in one
// batch (more wait for a slot); no request, however malformed or abandoned,
// stops the server.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "adapter_watch.h"
#include "lora_share.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace lora_share::server {

constexpr char kJson[] = "application/json";

// An error response in OpenAI's shape, {"error": {"message", "type", "param",
// "code"}}: a 4xx is the client's (invalid_request_error), a 5xx ours.
// `param`: the field at fault ("" = none: null).
void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "");

class App {
 public:
  // Takes ownership of `runtime`, opened on the deployment folder `dir`.
  App(ls_runtime* runtime, std::string dir);
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
  // GET /v1/models/ID: one adapter, or base; 404 for any other id.
  void model(const httplib::Request& req, httplib::Response& res);
  // POST /v1/adapters, DELETE /v1/adapters/NAME (adapter_routes.cpp).
  void post_adapter(const httplib::Request& req, httplib::Response& res);
  void delete_adapter(const httplib::Request& req, httplib::Response& res);

  // What registering an adapter came to: HTTP status 201, or the refusal's
  // status and message.
  struct Added {
    int http_status = 201;
    std::string name, message;
    ls_status code = LS_OK;
  };
  // The one way an adapter joins the served set (POST and the folder watch):
  // `pte` checked against the foundation and loaded (ls_load_adapter), named
  // by its file stem. Under registry_lock_.
  Added add_adapter(const std::string& pte);
  // The folder watch's offer: registers `name` unless it is served or was
  // removed with DELETE, and says on stderr what became of it.
  void offer_from_folder(const std::string& name, const std::string& pte);

  // An adapter served now, or "base" (adapters_ under adapters_lock_: the
  // folder watch adds to them while requests read them).
  bool serves(const std::string& name) const;

  ls_runtime* runtime_;
  const std::string dir_;
  std::vector<std::string> adapters_;  // served: the runtime's at start, in its order, then as added
  mutable std::mutex adapters_lock_;
  // One registration or removal at a time (POST, DELETE, the watch), so that a
  // name is never both being added and being removed.
  std::mutex registry_lock_;
  std::set<std::string> removed_;        // DELETEd: the folder watch does not bring them back
  std::unique_ptr<AdapterWatch> watch_;  // stopped before the runtime closes
  std::atomic<uint64_t> requests_{0};    // completions answered to the end (/v1/stats)
};

}  // namespace lora_share::server
