// The OpenAI request and response shapes the server speaks: completions and
// chat completions, whole or streamed as server-sent events. Pure functions
// over JSON text, so every rule here is testable without a socket.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "status.h"

namespace lora_share::server {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// One adapter of a per-request mix (the "lora" field): ls_lora_term's.
struct LoraTerm {
  std::string name;
  double scale = 1;
};

struct CompletionRequest {
  bool chat = false;  // /v1/chat/completions
  std::string model;  // the adapter's name; "base": the foundation alone
  // "lora": [{"name", "scale"}, ...]: a mix of adapters (ls_adapter_mix) on
  // the foundation, with model "base"; empty: model's adapter as it is.
  std::vector<LoraTerm> lora;
  std::string prompt;               // completions: a text prompt
  std::vector<int64_t> prompt_ids;  // completions: a prompt of token ids
  bool prompt_is_ids = false;
  std::vector<ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;  // none: until EOS or the end of the context
  double temperature = 0;             // greedy unless asked: answers are reproducible
  uint64_t seed = 0;
  // Sampling filters and penalties, as ls_generate_options has them.
  int64_t top_k = 0;
  double top_p = 1, min_p = 0;
  double repeat_penalty = 1, presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::string> stop;  // up to 4 non-empty strings; none reaches the client
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool ignore_eos = false;     // as vLLM's: generate max_tokens past any EOS id
  bool cache_prompt = true;    // as llama-server's: continue from a KV slot holding the prompt's start
};

// Parses and checks a request body. Every problem is a usage Status naming
// the field ("max_tokens must be an integer >= 1, got -3"). A field that
// would change the answer and is not served (n > 1, logprobs, tools, ...) is
// refused by name, as is a field this server does not know; fields that
// change nothing (user, metadata, ...) are accepted.
StatusOr<CompletionRequest> parse_request(const std::string& body, bool chat);

// One finished answer: what generation produced.
struct Answer {
  std::string text;             // decoded text ("" without a tokenizer)
  std::vector<int64_t> tokens;  // generated ids (an EOS that stopped it excluded; kept with ignore_eos)
  std::string finish_reason;    // "stop" (EOS or a stop string) or "length"
  int64_t prompt_tokens = 0;
};

// The response object of a non-streamed request.
std::string response_json(const CompletionRequest& request, const std::string& id, int64_t created,
                          const Answer& answer);

// One server-sent event of a streamed request: a piece of text and the ids it
// came from, or (finish_reason set) the last chunk.
std::string stream_event(const CompletionRequest& request, const std::string& id, int64_t created,
                         const std::string& text, const std::vector<int64_t>& tokens,
                         const std::optional<std::string>& finish_reason);

// The chunk OpenAI sends last when stream_options.include_usage is set: no
// choices, the request's usage.
std::string usage_event(const CompletionRequest& request, const std::string& id, int64_t created, const Answer& answer);

// The event that ends a stream.
constexpr char kStreamDone[] = "data: [DONE]\n\n";

// {"error": {"message", "type", "code"}}, OpenAI's error shape.
std::string error_json(const std::string& message, const std::string& type, int http_status);

// /v1/models: the deployment's adapters, then "base" (the foundation alone).
std::string models_json(const std::vector<std::string>& names);

}  // namespace lora_share::server
