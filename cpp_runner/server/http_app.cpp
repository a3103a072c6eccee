#include "http_app.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "page_assets.h"

namespace lora_share::server {
namespace {

// HTTP status for a library error: the caller's fault (4xx) or ours (5xx).
int http_status(ls_status code) {
  switch (code) {
    case LS_ERR_ARGUMENT:
    case LS_ERR_REQUEST:
      return 400;
    case LS_ERR_NOT_FOUND:
      return 404;
    case LS_ERR_BUDGET:
      return 507;  // the budget cannot hold the adapter
    default:
      return 500;
  }
}

// The server-sent events of one streamed request, written as the library
// hands them out; a failed write (the client left) stops generation.
struct EventStream {
  httplib::DataSink* sink;
  bool write(const std::string& event) { return sink->is_writable() && sink->write(event.data(), event.size()); }
  static int on_event(const char* json, size_t length, void* self) {
    auto* stream = static_cast<EventStream*>(self);
    return stream->write("data: " + std::string(json, length) + "\n\n") ? 0 : 1;
  }
};

int collect_event(const char* json, size_t length, void* body) {
  static_cast<std::string*>(body)->assign(json, length);
  return 0;
}

const char* finish_name(ls_finish_reason reason) {
  switch (reason) {
    case LS_FINISH_LENGTH:
      return "length";
    case LS_FINISH_EOS:
    case LS_FINISH_STOP:
      return "stop";
    case LS_FINISH_CALLBACK:
      return "client gone";
  }
  return "?";
}

// One stderr line per request: what the memory budget did for it.
void log_request(ls_runtime* runtime, const std::string& model, const ls_text_result& result, const char* how) {
  ls_runtime_stats s;
  ls_error err;
  if (ls_stats(runtime, &s, &err) != LS_OK) return;
  std::cerr << "served " << model << " (" << how << "): " << result.prompt_tokens << " prompt + "
            << result.completion_tokens << " new tokens, " << finish_name(result.finish_reason) << "; resident "
            << s.adapters_resident << "/" << s.adapters_known << ", loads " << s.loads << ", evictions " << s.evictions
            << ", last load " << s.last_load_ms << " ms" << std::endl;
}

nlohmann::json model_object(const std::string& name) {
  return {{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "lora-share"}};
}

}  // namespace

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param) {
  const std::string type = status < 500 ? "invalid_request_error" : "server_error";
  const nlohmann::json error = {{"message", message},
                                {"type", type},
                                {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
                                {"code", status}};
  res.status = status;
  res.set_content(nlohmann::json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  kJson);
}

App::App(ls_runtime* runtime, std::string dir) : runtime_(runtime), dir_(std::move(dir)) {
  // The adapters the runtime read from the folder's manifest.json, in its order.
  ls_runtime_stats stats;
  ls_error err;
  if (ls_stats(runtime_, &stats, &err) != LS_OK) return;
  for (size_t i = 0; i < stats.adapters_known; ++i)
    if (ls_adapter* a = ls_adapter_at(runtime_, i, &err)) adapters_.push_back(ls_adapter_name(a));
}

App::~App() {
  watch_.reset();
  ls_close(runtime_);
}

bool App::serves(const std::string& name) const {
  std::lock_guard<std::mutex> lock(adapters_lock_);
  return name == LS_BASE_NAME || std::find(adapters_.begin(), adapters_.end(), name) != adapters_.end();
}

void App::watch_folder(std::chrono::milliseconds interval) {
  watch_ = std::make_unique<AdapterWatch>(
      dir_, interval, [this](const std::string& name, const std::string& pte) { offer_from_folder(name, pte); });
}

void App::install(httplib::Server& http) {
  // Every error has a JSON body: the routes' own, or one said here (an
  // unknown route, a body over --max-body, a handler that threw).
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string message =
        res.status == 404
            ? "no route " + req.method + " " + req.path +
                  " (the routes: GET / (the page), POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                  "GET /v1/models/ID, POST /v1/adapters, DELETE /v1/adapters/NAME, GET /v1/stats, GET /health)"
        : res.status == 413 ? "the request body is larger than the server's --max-body"
                            : "the request failed (HTTP " + std::to_string(res.status) + ")";
    send_error(res, res.status, message);
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr e) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    send_error(res, 500, "the server failed on this request: " + what);
  });
  install_page(http);
  http.Get("/health",
           [](const httplib::Request&, httplib::Response& res) { res.set_content("{\"status\": \"ok\"}", kJson); });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    std::unique_lock<std::mutex> lock(adapters_lock_);
    nlohmann::json data = nlohmann::json::array();
    for (const std::string& name : adapters_) data.push_back(model_object(name));
    lock.unlock();
    data.push_back(model_object(LS_BASE_NAME));
    res.set_content(nlohmann::json{{"object", "list"}, {"data", data}}.dump(), kJson);
  });
  http.Get(R"(/v1/models/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) { model(req, res); });
  http.Get("/v1/stats", [this](const httplib::Request&, httplib::Response& res) { stats(res); });
  http.Post("/v1/adapters", [this](const httplib::Request& req, httplib::Response& res) { post_adapter(req, res); });
  http.Delete(R"(/v1/adapters/([^/]+))",
              [this](const httplib::Request& req, httplib::Response& res) { delete_adapter(req, res); });
  http.Post("/v1/completions",
            [this](const httplib::Request& req, httplib::Response& res) { completions(req, res, /*chat=*/false); });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { completions(req, res, /*chat=*/true); });
}

void App::stats(httplib::Response& res) {
  ls_runtime_stats s;
  ls_error err;
  if (ls_stats(runtime_, &s, &err) != LS_OK) return send_error(res, 500, err.message);
  // [b - 1]: decode steps that ran b rows, for b = 1..parallel (the rest are 0).
  const std::vector<uint64_t> batch_sizes(s.batch_size_counts,
                                          s.batch_size_counts + std::min<size_t>(s.parallel, LS_MAX_PARALLEL));
  nlohmann::json out = {{"parallel", s.parallel},
                        {"slots_in_use", s.slots_in_use},
                        {"slot_bytes", s.slot_bytes},
                        {"prefix_hits", s.prefix_hits},
                        {"prefix_tokens", s.prefix_tokens},
                        {"slots_cleared", s.slots_cleared},
                        {"batch_steps", s.batch_steps},
                        {"batch_size_counts", batch_sizes},
                        {"drafted_tokens", s.drafted_tokens},
                        {"accepted_tokens", s.accepted_tokens},
                        {"requests", requests_.load()},
                        {"adapters_known", s.adapters_known},
                        {"adapters_resident", s.adapters_resident},
                        {"loads", s.loads},
                        {"evictions", s.evictions},
                        {"hits", s.hits},
                        {"last_load_ms", s.last_load_ms},
                        {"total_load_ms", s.total_load_ms},
                        {"budget_bytes", s.budget_bytes},
                        {"foundation_bytes", s.foundation_bytes},
                        {"program_bytes", s.program_bytes},
                        {"arena_bytes", s.arena_bytes},
                        {"resident_adapter_bytes", s.resident_adapter_bytes},
                        {"process_pss_bytes", s.process_pss_bytes}};
  res.set_content(out.dump(), kJson);
}

void App::model(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  if (!serves(id))
    return send_error(res, 404,
                      "The model '" + id + "' does not exist: GET /v1/models lists this deployment's adapters and base",
                      "model");
  res.set_content(model_object(id).dump(), kJson);
}

void App::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  ls_error err;
  std::shared_ptr<ls_request> request(
      ls_request_parse(chat ? LS_REQUEST_CHAT : LS_REQUEST_COMPLETION, req.body.data(), req.body.size(), &err),
      ls_request_free);
  if (!request) return send_error(res, 400, err.message);
  const std::string model = ls_request_model(request.get());
  // The served set, not the runtime's: a DELETEd adapter is refused from the
  // moment it is taken out, before the library forgets it.
  if (!serves(model))
    return send_error(res, 404,
                      "no adapter called '" + model +
                          "' in this deployment: GET /v1/models lists them ('base' is the foundation alone)",
                      "model");
  // Refused before any byte is sent, so a streamed request gets a plain 4xx too.
  if (ls_request_prepare(runtime_, request.get(), &err) != LS_OK)
    return send_error(res, http_status(err.code), err.message);

  if (!ls_request_stream(request.get())) {
    std::string body;
    ls_text_result result;
    if (ls_request_run(runtime_, request.get(), collect_event, &body, &result, &err) != LS_OK)
      return send_error(res, http_status(err.code), err.message);
    ++requests_;
    log_request(runtime_, model, result, "whole");
    res.set_content(body, kJson);
    return;
  }

  // Streamed: the provider runs after this handler returns, on the same
  // connection's thread. A client that hung up fails a write: the library
  // then frees the request's row at its next step.
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, request, model](size_t, httplib::DataSink& sink) {
    EventStream stream{&sink};
    ls_error e;
    ls_text_result result{};
    const ls_status status = ls_request_run(runtime_, request.get(), &EventStream::on_event, &stream, &result, &e);
    if (status == LS_OK && result.finish_reason == LS_FINISH_CALLBACK) return false;  // nothing more to say to nobody
    if (status != LS_OK) {
      const nlohmann::json error = {
          {"error",
           {{"message", e.message}, {"type", "server_error"}, {"param", nullptr}, {"code", http_status(e.code)}}}};
      stream.write("data: " + error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n");
    } else {
      ++requests_;
      log_request(runtime_, model, result, "streamed");
    }
    stream.write("data: [DONE]\n\n");
    sink.done();
    return true;
  });
}

}  // namespace lora_share::server
