#include "openai.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

namespace lora_share::server {
namespace {

using nlohmann::json;

// Reads an optional integer field into `out`, within [lo, hi].
Status read_int(const json& body, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    return Status::usage(std::string(key) + " must be an integer, got " + it->dump());
  }
  // Unsigned values above int64's range would wrap: take them as too large.
  const bool too_big = it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t value = too_big ? hi : it->get<int64_t>();
  if (too_big || value < lo || value > hi) {
    return Status::usage(std::string(key) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                         ", got " + it->dump());
  }
  *out = value;
  return {};
}

Status read_prompt(const json& body, CompletionRequest* request) {
  auto it = body.find("prompt");
  if (it == body.end()) return Status::usage("prompt is missing: give a string or an array of token ids");
  if (it->is_string()) {
    request->prompt = it->get<std::string>();
    return {};
  }
  // A one-element batch of prompts is one prompt; larger batches are not served.
  const json* p = &*it;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    request->prompt = p->get<std::string>();
    return {};
  }
  if (!p->is_array() || p->empty()) {
    return Status::usage("prompt must be a string or a non-empty array of token ids");
  }
  for (const json& id : *p) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return Status::usage(
          "prompt must be a string or an array of token ids (integers >= 0); "
          "several prompts in one request are not served");
    }
    request->prompt_ids.push_back(id.get<int64_t>());
  }
  request->prompt_is_ids = true;
  return {};
}

Status read_messages(const json& body, CompletionRequest* request) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return Status::usage("messages must be a non-empty array of {\"role\", \"content\"}");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return Status::usage(where + " needs a string \"role\"");
    }
    if (!m.contains("content") || !m["content"].is_string()) {
      return Status::usage(where + ".content must be a string");
    }
    request->messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return {};
}

// "lora": a non-empty array of {"name": adapter, "scale": finite number},
// which mixes adapters on the foundation alone (model "base").
Status read_lora(const json& body, CompletionRequest* request) {
  auto it = body.find("lora");
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_array() || it->empty())
    return Status::usage("lora must be a non-empty array of {\"name\": adapter, \"scale\": number}, got " + it->dump());
  for (size_t i = 0; i < it->size(); ++i) {
    const json& term = (*it)[i];
    const std::string where = "lora[" + std::to_string(i) + "]";
    if (!term.is_object())
      return Status::usage(where + " must be {\"name\": adapter, \"scale\": number}, got " + term.dump());
    for (const auto& [key, value] : term.items())
      if (key != "name" && key != "scale")
        return Status::usage(
            where + " has the key '" + key +
            "': give {\"name\": adapter, \"scale\": number} (adapters by name, as GET /v1/models lists them)");
    auto name = term.find("name");
    if (name == term.end() || !name->is_string() || name->get<std::string>().empty())
      return Status::usage(where + ".name must be an adapter's name (GET /v1/models lists them)");
    auto scale = term.find("scale");
    if (scale == term.end() || !scale->is_number() || !std::isfinite(scale->get<double>()))
      return Status::usage(where + ".scale must be a finite number, got " +
                           (scale == term.end() ? std::string("nothing") : scale->dump()));
    request->lora.push_back({name->get<std::string>(), scale->get<double>()});
  }
  if (request->model != "base")
    return Status::usage(
        "with lora, model must be 'base' (the mix of lora's adapters runs on the foundation "
        "alone), got '" +
        request->model + "'");
  return {};
}

// Fields that would change the answer and are not served: refused by name
// unless they hold their no-op value (null, false, 1, an empty list...).
struct Unserved {
  const char* key;
  const char* why;
  std::function<bool(const json&)> is_noop;
};

const std::vector<Unserved>& unserved_fields() {
  auto is_false = [](const json& v) { return v.is_boolean() && !v.get<bool>(); };
  auto is_one = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; };
  auto is_empty = [](const json& v) { return (v.is_array() || v.is_object() || v.is_string()) && v.empty(); };
  static const std::vector<Unserved> table = {
      {"n", "n must be 1: one answer per request is served", is_one},
      {"best_of", "best_of must be 1: one answer per request is served", is_one},
      {"logprobs", "logprobs are not served", [=](const json& v) { return is_false(v) || v == 0; }},
      {"top_logprobs", "top_logprobs are not served", [](const json& v) { return v == 0; }},
      {"echo", "echo is not served", is_false},
      {"suffix", "suffix (insertion) is not served", is_empty},
      {"logit_bias", "logit_bias is not served", is_empty},
      {"tools", "tools (function calling) are not served", is_empty},
      {"tool_choice", "tools (function calling) are not served", [](const json& v) { return v == "none"; }},
      {"functions", "functions (function calling) are not served", is_empty},
      {"function_call", "functions (function calling) are not served", [](const json& v) { return v == "none"; }},
      {"response_format", "response_format other than {\"type\": \"text\"} is not served",
       [](const json& v) { return v.is_object() && v.size() == 1 && v.value("type", "") == "text"; }},
      {"modalities", "modalities other than [\"text\"] are not served",
       [](const json& v) { return v == json::array({"text"}); }},
      {"audio", "audio output is not served", [](const json&) { return false; }},
      {"prediction", "predicted outputs are not served", [](const json&) { return false; }},
  };
  return table;
}

// Fields read below, and fields that change nothing about the answer.
bool known_field(const std::string& key, bool chat) {
  static const std::vector<std::string> common = {"model", "lora", "stream", "stream_options", "max_tokens",
                                                  "temperature", "seed", "ignore_eos", "stop", "cache_prompt", "top_p",
                                                  "top_k", "min_p", "presence_penalty", "frequency_penalty",
                                                  "repeat_penalty", "repetition_penalty",
                                                  // accepted, and change nothing here
                                                  "user", "metadata", "store", "service_tier", "parallel_tool_calls"};
  if (std::find(common.begin(), common.end(), key) != common.end()) return true;
  return chat ? key == "messages" || key == "max_completion_tokens" : key == "prompt";
}

Status read_bool(const json& body, const char* key, bool* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_boolean()) return Status::usage(std::string(key) + " must be true or false, got " + it->dump());
  *out = it->get<bool>();
  return {};
}

// Reads an optional number field into `out`, within [lo, hi].
Status read_number(const json& body, const char* key, double lo, double hi, double* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < lo || it->get<double>() > hi) {
    auto text = [](double x) {
      std::ostringstream out;
      out << x;  // 0, 1, 0.01: as a person writes them
      return out.str();
    };
    return Status::usage(std::string(key) + " must be a number between " + text(lo) + " and " + text(hi) + ", got " +
                         it->dump());
  }
  *out = it->get<double>();
  return {};
}

// `stop`: a string or an array of up to 4, none empty.
Status read_stop(const json& body, CompletionRequest* request) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return {};
  const json list = it->is_string() ? json::array({*it}) : *it;
  bool ok = list.is_array() && list.size() <= 4;
  for (const json& s : ok ? list : json::array()) ok = ok && s.is_string() && !s.get<std::string>().empty();
  if (!ok) return Status::usage("stop must be a non-empty string or an array of up to 4, got " + it->dump());
  for (const json& s : list) request->stop.push_back(s.get<std::string>());
  return {};
}

Status parse_sampling(const json& body, CompletionRequest* request) {
  if (auto t = body.find("temperature"); t != body.end() && !t->is_null()) {
    if (!t->is_number() || !std::isfinite(t->get<double>()) || t->get<double>() < 0 || t->get<double>() > 2) {
      return Status::usage("temperature must be a number between 0 and 2, got " + t->dump());
    }
    request->temperature = t->get<double>();
  }
  Status s = read_int(body, "top_k", 0, std::numeric_limits<int32_t>::max(), &request->top_k);
  if (s.ok()) s = read_number(body, "top_p", 0, 1, &request->top_p);
  if (s.ok()) s = read_number(body, "min_p", 0, 1, &request->min_p);
  if (s.ok()) s = read_number(body, "presence_penalty", -2, 2, &request->presence_penalty);
  if (s.ok()) s = read_number(body, "frequency_penalty", -2, 2, &request->frequency_penalty);
  // repetition_penalty: vLLM's and transformers' name for llama-server's repeat_penalty.
  for (const char* key : {"repeat_penalty", "repetition_penalty"}) {
    if (s.ok()) s = read_number(body, key, 0.01, 100, &request->repeat_penalty);
  }
  if (s.ok()) s = read_stop(body, request);
  return s;
}

Status parse_fields(const json& body, bool chat, CompletionRequest* request) {
  if (!body.is_object()) return Status::usage("the request body must be a JSON object");
  request->chat = chat;
  for (const auto& [key, value] : body.items()) {
    auto unserved = std::find_if(unserved_fields().begin(), unserved_fields().end(),
                                 [&](const Unserved& u) { return key == u.key; });
    if (unserved != unserved_fields().end()) {
      if (value.is_null() || unserved->is_noop(value)) continue;
      return Status::usage(std::string(unserved->why) + " (got " + key + ": " + value.dump() + "): leave it out");
    }
    if (!known_field(key, chat)) {
      return Status::usage("unknown field '" + key + "' for " + (chat ? "/v1/chat/completions" : "/v1/completions") +
                           ": this server does not read it, so it would change nothing; leave it out");
    }
  }
  auto model = body.find("model");
  if (model == body.end() || !model->is_string() || model->get<std::string>().empty()) {
    return Status::usage("model is missing: name one of the adapters GET /v1/models lists");
  }
  request->model = model->get<std::string>();
  Status s = read_lora(body, request);
  if (s.ok()) s = chat ? read_messages(body, request) : read_prompt(body, request);
  if (!s.ok()) return s;
  // max_completion_tokens is the newer chat name for max_tokens.
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    int64_t max_tokens = 0;
    s = read_int(body, key, 1, std::numeric_limits<int32_t>::max(), &max_tokens);
    if (!s.ok()) return s;
    if (max_tokens > 0) request->max_tokens = max_tokens;
  }
  int64_t seed = 0;
  s = read_int(body, "seed", 0, std::numeric_limits<int64_t>::max(), &seed);
  if (!s.ok()) return s;
  request->seed = static_cast<uint64_t>(seed);
  if (s = parse_sampling(body, request); !s.ok()) return s;
  if (s = read_bool(body, "stream", &request->stream); !s.ok()) return s;
  if (s = read_bool(body, "ignore_eos", &request->ignore_eos); !s.ok()) return s;
  if (s = read_bool(body, "cache_prompt", &request->cache_prompt); !s.ok()) return s;
  if (auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) return Status::usage("stream_options must be an object, got " + so->dump());
    if (s = read_bool(*so, "include_usage", &request->include_usage); !s.ok()) {
      return Status::usage("stream_options." + s.message());
    }
  }
  return {};
}

json usage_json(const Answer& answer) {
  const auto completion = static_cast<int64_t>(answer.tokens.size());
  return {{"prompt_tokens", answer.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", answer.prompt_tokens + completion}};
}

}  // namespace

StatusOr<CompletionRequest> parse_request(const std::string& body, bool chat) {
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Status::usage("the request body is not valid JSON");
  CompletionRequest request;
  try {
    Status s = parse_fields(parsed, chat, &request);
    if (!s.ok()) return s;
  } catch (const json::exception& e) {  // a type the checks above missed: still a bad request
    return Status::usage(std::string("bad request: ") + e.what());
  }
  return request;
}

std::string response_json(const CompletionRequest& request, const std::string& id, int64_t created,
                          const Answer& answer) {
  json choice = {
      {"index", 0}, {"finish_reason", answer.finish_reason}, {"tokens", answer.tokens}, {"logprobs", nullptr}};
  if (request.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", answer.text}};
  } else {
    choice["text"] = answer.text;
  }
  json out = {{"id", id},
              {"object", request.chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", request.model},
              {"choices", json::array({choice})},
              {"usage", usage_json(answer)}};
  // Invalid UTF-8 cannot come from the tokenizer's decode; replace, never throw.
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string stream_event(const CompletionRequest& request, const std::string& id, int64_t created,
                         const std::string& text, const std::vector<int64_t>& tokens,
                         const std::optional<std::string>& finish_reason) {
  json choice = {
      {"index", 0}, {"tokens", tokens}, {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
  if (request.chat) {
    choice["delta"] = finish_reason ? json::object() : json{{"content", text}};
  } else {
    choice["text"] = text;
  }
  json out = {{"id", id},
              {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", request.model},
              {"choices", json::array({choice})}};
  return "data: " + out.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string usage_event(const CompletionRequest& request, const std::string& id, int64_t created,
                        const Answer& answer) {
  json out = {{"id", id},
              {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", request.model},
              {"choices", json::array()},
              {"usage", usage_json(answer)}};
  return "data: " + out.dump() + "\n\n";
}

std::string error_json(const std::string& message, const std::string& type, int http_status) {
  json out = {{"error", {{"message", message}, {"type", type}, {"code", http_status}}}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string models_json(const std::vector<std::string>& names) {
  json data = json::array();
  for (const std::string& name : names) {
    data.push_back({{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "lora-share"}});
  }
  data.push_back({{"id", "base"}, {"object", "model"}, {"created", 0}, {"owned_by", "lora-share"}});
  return json{{"object", "list"}, {"data", data}}.dump();
}

}  // namespace lora_share::server
