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
  int64_t completion = 0;
  for (const Choice& c : answer.choices) completion += static_cast<int64_t>(c.tokens.size());
  return {{"prompt_tokens", answer.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", answer.prompt_tokens + completion},
          {"completion_tokens_details",
           {{"accepted_prediction_tokens", answer.accepted_prediction_tokens},
            {"rejected_prediction_tokens", answer.rejected_prediction_tokens}}}};
}

json envelope(const AnswerId& id, bool chunk) {
  const bool chat = id.kind == Kind::kChat;
  return {{"id", id.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", id.created},
          {"model", id.model}};
}

// A token's bytes as OpenAI's "bytes": their values, 0-255.
json byte_values(const std::string& bytes) {
  json out = json::array();
  for (unsigned char b : bytes) out.push_back(b);
  return out;
}

// Chat's logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}.
json chat_logprobs(const std::vector<TokenLogprob>& tokens) {
  json content = json::array();
  for (const TokenLogprob& t : tokens) {
    json top = json::array();
    for (const auto& [bytes, logprob] : t.top)
      top.push_back({{"token", bytes}, {"logprob", logprob}, {"bytes", byte_values(bytes)}});
    content.push_back(
        {{"token", t.bytes}, {"logprob", t.logprob}, {"bytes", byte_values(t.bytes)}, {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// Completions' legacy logprobs: parallel lists, top_logprobs as {token: logprob}.
json legacy_logprobs(const std::vector<TokenLogprob>& tokens, size_t offset) {
  json text = json::array(), logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const TokenLogprob& t : tokens) {
    text.push_back(t.bytes);
    logprobs.push_back(t.logprob);
    json likeliest = json::object();
    for (const auto& [bytes, logprob] : t.top) likeliest[bytes] = logprob;
    top.push_back(likeliest);
    offsets.push_back(offset);
    offset += t.bytes.size();
  }
  return {{"tokens", text}, {"token_logprobs", logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json logprobs_json(Kind kind, const std::vector<TokenLogprob>& tokens, size_t offset) {
  return kind == Kind::kChat ? chat_logprobs(tokens) : legacy_logprobs(tokens, offset);
}

json calls_json(const std::vector<ToolCall>& calls, bool indexed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = {{"id", calls[i].id},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) call["index"] = i;
    out.push_back(call);
  }
  return out;
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
  json choices = json::array();
  for (size_t i = 0; i < answer.choices.size(); ++i) {
    const Choice& c = answer.choices[i];
    json choice = {{"index", i},
                   {"finish_reason", c.finish_reason},
                   {"tokens", c.tokens},
                   {"logprobs", answer.logprobs ? logprobs_json(id.kind, c.logprobs, 0) : json(nullptr)}};
    if (id.kind == Kind::kChat && !c.tool_calls.empty())
      choice["message"] = {
          {"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls_json(c.tool_calls, false)}};
    else if (id.kind == Kind::kChat)
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else
      choice["text"] = c.text;
    choices.push_back(choice);
  }
  json out = envelope(id, /*chunk=*/false);
  out["choices"] = choices;
  out["usage"] = usage(answer);
  return text_of(out);
}

std::string role_chunk_json(const AnswerId& id, size_t index) {
  json out = envelope(id, /*chunk=*/true);
  out["choices"] = json::array({{{"index", index},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"tokens", json::array()},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
  return text_of(out);
}

std::string chunk_json(const AnswerId& id, size_t index, const std::string& text, const std::vector<int64_t>& tokens,
                       const std::vector<TokenLogprob>& logprobs, const std::optional<std::string>& finish_reason) {
  json choice = {{"index", index},
                 {"tokens", tokens},
                 {"logprobs", logprobs.empty() ? json(nullptr) : logprobs_json(id.kind, logprobs, 0)},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
  if (id.kind == Kind::kChat)
    choice["delta"] = finish_reason ? json::object() : json{{"content", text}};
  else
    choice["text"] = text;
  json out = envelope(id, /*chunk=*/true);
  out["choices"] = json::array({choice});
  return text_of(out);
}

std::string tool_calls_chunk_json(const AnswerId& id, size_t index, const std::vector<ToolCall>& calls,
                                  const std::vector<TokenLogprob>& logprobs) {
  json out = envelope(id, /*chunk=*/true);
  out["choices"] = json::array({{{"index", index},
                                 {"delta", {{"tool_calls", calls_json(calls, true)}}},
                                 {"tokens", json::array()},
                                 {"logprobs", logprobs.empty() ? json(nullptr) : logprobs_json(id.kind, logprobs, 0)},
                                 {"finish_reason", nullptr}}});
  return text_of(out);
}

std::string usage_chunk_json(const AnswerId& id, const Answer& answer) {
  json out = envelope(id, /*chunk=*/true);
  out["choices"] = json::array();
  out["usage"] = usage(answer);
  return text_of(out);
}

}  // namespace lora_share::requests
