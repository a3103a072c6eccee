#include "http_app.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "page_assets.h"
#include "stop_strings.h"

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

std::string next_id(bool chat) {
  static std::atomic<uint64_t> counter{0};
  return std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(++counter);
}

// One generation: collects ids until EOS, a stop string or max_tokens,
// decodes text as the ids arrive, holds back what may be the start of a stop
// string, and hands each piece to `on_piece` (streaming), which returns false
// when the client is gone, so generation stops there.
struct Run {
  Run(const Deployment& deployment, const CompletionRequest& request, int64_t prompt_tokens)
      : deployment(&deployment), ignore_eos(request.ignore_eos), stops(request.stop) {
    if (deployment.tokenizer) decoder.emplace(*deployment.tokenizer, true);
    answer.finish_reason = "length";
    answer.prompt_tokens = prompt_tokens;
  }

  const Deployment* deployment;
  bool ignore_eos;
  std::optional<tok::StreamDecoder> decoder;
  StopStrings stops;
  Answer answer;
  std::function<bool(const std::string& piece, int64_t id)> on_piece;
  bool client_gone = false;

  static int on_token(int64_t id, void* self) {
    auto* run = static_cast<Run*>(self);
    const auto& eos = run->deployment->eos_ids;
    if (!run->ignore_eos && std::find(eos.begin(), eos.end(), id) != eos.end()) {
      run->answer.finish_reason = "stop";
      return 1;
    }
    run->answer.tokens.push_back(id);
    const std::string piece = run->stops.push(run->decoder ? run->decoder->push(id) : std::string());
    run->answer.text += piece;
    if (run->on_piece && !run->on_piece(piece, id)) {
      run->client_gone = true;
      return 1;
    }
    if (run->stops.stopped()) {
      run->answer.finish_reason = "stop";
      return 1;
    }
    return 0;
  }

  // The text still held back (an incomplete UTF-8 tail, the start of a stop
  // string that never came), once generation ends.
  std::string finish() {
    std::string tail = stops.push(decoder ? decoder->finish() : std::string());
    if (stops.stopped()) answer.finish_reason = "stop";
    tail += stops.finish();
    answer.text += tail;
    return tail;
  }
};

// Everything a request needs after parsing: its ids and a place in the queue.
struct Prepared {
  CompletionRequest request;
  std::string adapter;              // what the library runs: model, or the mix's name
  std::shared_ptr<ls_adapter> mix;  // the lora field's mix, released when the response is done with
  std::vector<int64_t> ids;
  std::string id;
  int64_t created = 0;
};

ls_generate_options generate_options(const CompletionRequest& request, int64_t max_new_tokens) {
  ls_generate_options g;
  ls_generate_options_init(&g);
  g.max_new_tokens = max_new_tokens;
  g.temperature = request.temperature;
  g.seed = request.seed;
  g.top_k = request.top_k;
  g.top_p = request.top_p;
  g.min_p = request.min_p;
  g.repeat_penalty = request.repeat_penalty;
  g.presence_penalty = request.presence_penalty;
  g.frequency_penalty = request.frequency_penalty;
  g.ignore_eos = request.ignore_eos ? 1 : 0;
  g.cache_prompt = request.cache_prompt ? 1 : 0;
  return g;
}

// One stderr line per request: what the memory budget did for it.
void log_request(ls_runtime* runtime, const CompletionRequest& request, const Answer& answer, const char* how) {
  ls_runtime_stats s;
  ls_error err;
  if (ls_stats(runtime, &s, &err) != LS_OK) return;
  std::cerr << "served " << request.model << " (" << how << "): " << answer.prompt_tokens << " prompt + "
            << answer.tokens.size() << " new tokens, " << answer.finish_reason << "; resident " << s.adapters_resident
            << "/" << s.adapters_known << ", loads " << s.loads << ", evictions " << s.evictions << ", last load "
            << s.last_load_ms << " ms" << std::endl;
}

}  // namespace

void send_error(httplib::Response& res, int status, const std::string& message) {
  const std::string type = status < 500 ? "invalid_request_error" : "server_error";
  res.status = status;
  res.set_content(error_json(message, type, status), kJson);
}

App::App(ls_runtime* runtime, Deployment deployment) : runtime_(runtime), deployment_(std::move(deployment)) {}

App::~App() {
  watch_.reset();
  ls_close(runtime_);
}

bool App::serves(const std::string& name) const {
  std::lock_guard<std::mutex> lock(adapters_lock_);
  return deployment_.knows(name);
}

void App::watch_folder(std::chrono::milliseconds interval) {
  watch_ = std::make_unique<AdapterWatch>(
      deployment_.dir, interval,
      [this](const std::string& name, const std::string& pte) { offer_from_folder(name, pte); });
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
                  "POST /v1/adapters, DELETE /v1/adapters/NAME, GET /v1/stats, GET /health)"
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
    const std::vector<std::string> adapters = deployment_.adapters;
    lock.unlock();
    res.set_content(models_json(adapters), kJson);
  });
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
                        {"batch_steps", s.batch_steps},
                        {"batch_size_counts", batch_sizes},
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

void App::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto parsed = parse_request(req.body, chat);
  if (!parsed.ok()) return send_error(res, 400, parsed.status().message());
  auto prepared = std::make_shared<Prepared>();
  prepared->request = std::move(parsed.value());
  const CompletionRequest& request = prepared->request;
  if (!serves(request.model)) {
    return send_error(res, 404,
                      "no adapter called '" + request.model +
                          "' in this deployment: GET /v1/models lists them ('base' is the foundation alone)");
  }
  ls_error err;
  prepared->adapter = request.model;
  if (!request.lora.empty()) {
    std::vector<ls_lora_term> terms;
    for (size_t i = 0; i < request.lora.size(); ++i) {
      const std::string& name = request.lora[i].name;
      if (name == "base" || !serves(name)) {
        return send_error(res, 400,
                          "lora[" + std::to_string(i) + "].name: no adapter called '" + name +
                              "' in this deployment: GET /v1/models lists them ('base', the foundation "
                              "alone, is no adapter to mix)");
      }
      terms.push_back({name.c_str(), request.lora[i].scale});
    }
    ls_adapter* mix = ls_adapter_mix(runtime_, terms.data(), terms.size(), &err);
    if (mix == nullptr) return send_error(res, http_status(err.code), std::string("lora: ") + err.message);
    prepared->mix.reset(mix, [](ls_adapter* a) { ls_adapter_release(a, nullptr); });
    prepared->adapter = ls_adapter_name(mix);
  }
  if (!request.stop.empty() && !deployment_.tokenizer) {
    return send_error(res, 400,
                      "stop needs the text of the answer, and this deployment has no tokenizer (" +
                          deployment_.no_tokenizer_reason + "): leave stop out");
  }
  auto ids = deployment_.prompt_ids(request);
  if (!ids.ok()) return send_error(res, 400, ids.status().message());
  prepared->ids = std::move(ids.value());
  prepared->id = next_id(chat);
  prepared->created = static_cast<int64_t>(std::time(nullptr));

  // No max_tokens: until EOS or the end of the context, as OpenAI's and
  // llama-server's (a prompt that fills the context asks for one token, so
  // the check below says it is too long).
  int64_t max_new_tokens = request.max_tokens.value_or(0);
  if (!request.max_tokens) {
    int64_t context = 0;
    if (ls_context_length(runtime_, prepared->adapter.c_str(), &context, &err) != LS_OK) {
      return send_error(res, http_status(err.code), err.message);
    }
    max_new_tokens = std::max<int64_t>(1, context - static_cast<int64_t>(prepared->ids.size()) + 1);
  }
  // Refused before any byte is sent, so a streamed request gets a plain 400 too.
  if (ls_check_request(runtime_, prepared->adapter.c_str(), prepared->ids.data(), prepared->ids.size(), max_new_tokens,
                       &err) != LS_OK) {
    return send_error(res, http_status(err.code), err.message);
  }
  const ls_generate_options options = generate_options(request, max_new_tokens);

  if (!request.stream) {
    Run run(deployment_, request, static_cast<int64_t>(prepared->ids.size()));
    if (ls_generate_named(runtime_, prepared->adapter.c_str(), prepared->ids.data(), prepared->ids.size(), &options,
                          &Run::on_token, &run, &err) != LS_OK) {
      return send_error(res, http_status(err.code), err.message);
    }
    run.finish();
    ++requests_;
    log_request(runtime_, request, run.answer, "whole");
    res.set_content(response_json(request, prepared->id, prepared->created, run.answer), kJson);
    return;
  }

  // Streamed: the provider runs after this handler returns, on the same
  // connection's thread. A client that hung up fails a write: the callback
  // then returns non-zero and the library frees the request's row.
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, prepared, options](size_t, httplib::DataSink& sink) {
    const CompletionRequest& rq = prepared->request;
    auto send = [&sink](const std::string& event) {
      return sink.is_writable() && sink.write(event.data(), event.size());
    };
    Run run(deployment_, rq, static_cast<int64_t>(prepared->ids.size()));
    run.on_piece = [&](const std::string& piece, int64_t id) {
      return send(stream_event(rq, prepared->id, prepared->created, piece, {id}, std::nullopt));
    };
    ls_error e;
    const ls_status status = ls_generate_named(runtime_, prepared->adapter.c_str(), prepared->ids.data(),
                                               prepared->ids.size(), &options, &Run::on_token, &run, &e);
    if (run.client_gone) return false;  // nothing more to say to nobody
    if (status != LS_OK) {
      send("data: " + error_json(e.message, "server_error", http_status(e.code)) + "\n\n");
    } else {
      const std::string tail = run.finish();
      if (!tail.empty()) send(stream_event(rq, prepared->id, prepared->created, tail, {}, std::nullopt));
      send(stream_event(rq, prepared->id, prepared->created, "", {}, run.answer.finish_reason));
      if (rq.include_usage) send(usage_event(rq, prepared->id, prepared->created, run.answer));
      ++requests_;
      log_request(runtime_, rq, run.answer, "streamed");
    }
    send(kStreamDone);
    sink.done();
    return true;
  });
}

}  // namespace lora_share::server
