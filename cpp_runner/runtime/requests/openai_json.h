// The OpenAI answer shapes of a request (lora_share.h, REQUESTS): the whole
// response, the chunks of a streamed one and its last usage chunk, as JSON
// text. Pure functions, the same for every door.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "request_schema.h"
#include "tool_calls.h"

namespace lora_share::requests {

// What identifies one answer: its id ("chatcmpl-..." / "cmpl-..."), its
// creation time and the model it names.
struct AnswerId {
  std::string id;
  int64_t created = 0;
  std::string model;
  Kind kind = Kind::kCompletion;
};

// A new id for a request of `kind`: unique in the process, unpredictable
// across processes.
AnswerId new_answer_id(Kind kind, const std::string& model);

// One token's log-probability and its likeliest alternatives (logprobs):
// bytes as the tokenizer decodes each token alone.
struct TokenLogprob {
  std::string bytes;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // likeliest first
};

// One choice of a finished answer: what generation produced.
struct Choice {
  std::string text;                    // decoded text ("" without a tokenizer)
  std::vector<int64_t> tokens;         // generated ids (an EOS that stopped it excluded; kept with ignore_eos)
  std::string finish_reason;           // "stop" (EOS or a stop string) or "length"
  std::vector<TokenLogprob> logprobs;  // with logprobs: one per token
  std::vector<ToolCall> tool_calls;    // the answer read as a call (tools): message.tool_calls
};

// A finished answer: its choices (n), each with its index.
struct Answer {
  std::vector<Choice> choices;
  int64_t prompt_tokens = 0;
  bool logprobs = false;  // the request asked for them: "logprobs" is filled, not null
  // Drafts kept and not (ls_generate_options.drafted, accepted).
  int64_t accepted_prediction_tokens = 0, rejected_prediction_tokens = 0;
};

// The response object of a non-streamed request.
std::string response_json(const AnswerId& id, const Answer& answer);

// A chat stream's first chunk of choice `index`: delta {"role": "assistant", "content": ""}.
std::string role_chunk_json(const AnswerId& id, size_t index);

// One chunk of a streamed request's choice `index`: a piece of text, the ids
// it came from and their logprobs (when asked), or (finish_reason set) the
// choice's last chunk.
std::string chunk_json(const AnswerId& id, size_t index, const std::string& text, const std::vector<int64_t>& tokens,
                       const std::vector<TokenLogprob>& logprobs, const std::optional<std::string>& finish_reason);

// A streamed choice's call, in one chunk: delta.tool_calls[{index, id, type,
// function: {name, arguments}}].
std::string tool_calls_chunk_json(const AnswerId& id, size_t index, const std::vector<ToolCall>& calls,
                                  const std::vector<TokenLogprob>& logprobs);

// The chunk OpenAI sends last when stream_options.include_usage is set: no
// choices, the request's usage.
std::string usage_chunk_json(const AnswerId& id, const Answer& answer);

}  // namespace lora_share::requests
