// The one request schema of every door (lora_share.h, REQUESTS): the OpenAI
// body of a completion or a chat completion, read into a Request by one table
// of fields (request_schema.cpp). Each entry names a field, the endpoints
// that take it and how its value is checked and stored; adding a field is
// one entry there and its use where the request runs (request_run.cpp).
// Fields that would change the answer and are not served are entries too,
// refused by name unless they hold their no-op value; any other field is
// refused as unknown, so a client always knows what was honoured.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "status.h"
#include "tool_calls.h"

namespace lora_share::requests {

enum class Kind { kCompletion, kChat };

struct Message {
  std::string role;  // as given; "developer" is read as "system"
  std::string content;
  std::vector<ToolCall> tool_calls;  // an assistant's calls (tool_calls.h)
  std::string tool_call_id;          // a "tool" message: the call it answers
};

// One adapter of a per-request mix (the "lora" field): ls_lora_term's.
struct LoraTerm {
  std::string name;
  double scale = 1;
};

// What constrains the answer (lora_share.h, STRUCTURED OUTPUT), and the
// field that asked for it, which its errors name.
struct Constraint {
  int kind = 0;       // ls_constraint_kind; 0: free text
  std::string text;   // a schema's JSON text or a grammar; "" for json_object
  std::string field;  // "response_format.json_schema.schema", "grammar", ...
};

struct Request {
  Kind kind = Kind::kCompletion;
  std::string model;  // the adapter's name; "base": the foundation alone
  // "lora": a mix of adapters (ls_adapter_mix) on the foundation, with model
  // "base"; empty: model's adapter as it is.
  std::vector<LoraTerm> lora;
  std::string prompt;               // completions: a text prompt
  std::vector<int64_t> prompt_ids;  // completions: a prompt of token ids
  bool prompt_is_ids = false;
  std::vector<Message> messages;      // chat
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
  // response_format, or llama-server's grammar / json_schema: one at most.
  Constraint constraint;
  // logprobs: each token's log-probability; top_logprobs: that many likeliest
  // (chat: top_logprobs; completions: logprobs' integer, OpenAI's legacy shape).
  bool logprobs = false;
  int top_logprobs = 0;
  std::vector<int64_t> logit_bias_ids;  // logit_bias, in the order given
  std::vector<double> logit_bias_values;
  int n = 1;    // choices, sharing one prefill of the prompt
  Tools tools;  // tools and tool_choice (chat)
  // OpenAI's Predicted Outputs ({"type": "content", "content": ...}): the
  // answer as the client expects it, drafted from (ls_generate_options).
  std::optional<std::string> prediction;
  bool speculative = true;  // false: this request never drafts
};

// Reads and checks a parsed body (bounded_json.h) of `kind`. Every problem is
// a usage Status naming the field ("max_tokens must be an integer from 1 to
// 2147483647, got -3"), quoting at most a short prefix of the value.
StatusOr<Request> read_request(const nlohmann::json& body, Kind kind);

// The endpoint of `kind`, for messages: "/v1/chat/completions" or "/v1/completions".
const char* endpoint(Kind kind);

}  // namespace lora_share::requests
