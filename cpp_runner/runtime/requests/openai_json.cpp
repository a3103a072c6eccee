#include "openai_json.h"

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <random>

#include <nlohmann/json.hpp>

namespace lora_share::requests {
namespace {

using nlohmann::json;

// Invalid UTF-8 cannot come from the tokenizer's decode; replace, never throw.
std::string text_of(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage(const Answer& answer) {
  const auto completion = static_cast<int64_t>(answer.tokens.size());
  return {{"prompt_tokens", answer.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", answer.prompt_tokens + completion}};
}

json envelope(const AnswerId& id, bool chunk) {
  const bool chat = id.kind == Kind::kChat;
  return {{"id", id.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", id.created},
          {"model", id.model}};
}

}  // namespace

AnswerId new_answer_id(Kind kind, const std::string& model) {
  // A per-process random prefix and a counter: unique here, not guessable across processes.
  static const uint64_t process = std::random_device()() * uint64_t{0x100000001} ^ std::random_device()();
  static std::atomic<uint64_t> counter{0};
  char suffix[40];
  std::snprintf(suffix, sizeof(suffix), "%016" PRIx64 "%08" PRIx64, process, ++counter);
  return {std::string(kind == Kind::kChat ? "chatcmpl-" : "cmpl-") + suffix, static_cast<int64_t>(std::time(nullptr)),
          model, kind};
}

std::string response_json(const AnswerId& id, const Answer& answer) {
  json choice = {
      {"index", 0}, {"finish_reason", answer.finish_reason}, {"tokens", answer.tokens}, {"logprobs", nullptr}};
  if (id.kind == Kind::kChat)
    choice["message"] = {{"role", "assistant"}, {"content", answer.text}};
  else
    choice["text"] = answer.text;
  json out = envelope(id, /*chunk=*/false);
  out["choices"] = json::array({choice});
  out["usage"] = usage(answer);
  return text_of(out);
}

std::string role_chunk_json(const AnswerId& id) {
  json out = envelope(id, /*chunk=*/true);
  out["choices"] = json::array({{{"index", 0},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"tokens", json::array()},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
  return text_of(out);
}

std::string chunk_json(const AnswerId& id, const std::string& text, const std::vector<int64_t>& tokens,
                       const std::optional<std::string>& finish_reason) {
  json choice = {{"index", 0},
                 {"tokens", tokens},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
  if (id.kind == Kind::kChat)
    choice["delta"] = finish_reason ? json::object() : json{{"content", text}};
  else
    choice["text"] = text;
  json out = envelope(id, /*chunk=*/true);
  out["choices"] = json::array({choice});
  return text_of(out);
}

std::string usage_chunk_json(const AnswerId& id, const Answer& answer) {
  json out = envelope(id, /*chunk=*/true);
  out["choices"] = json::array();
  out["usage"] = usage(answer);
  return text_of(out);
}

}  // namespace lora_share::requests
