// How one row's next token is picked from the model's logits, for the one-row
// path (generate.h) and each row of the batch (batch/scheduler.h) alike
// (docs/structured-output.md):
//
//   1. logprobs, when asked: log_softmax of the model's raw logits (its own
//      distribution, before everything below: no temperature, penalty, bias
//      or mask), the picked token's and the top_logprobs likeliest ids';
//   2. logit_bias (OpenAI's): each listed id's logit plus its bias; -100 bans
//      the id outright (-inf), as OpenAI documents it;
//   3. the constraint's mask (constraint/row_constraint.h): every token the
//      grammar forbids next is -inf; EOS only where the grammar can end;
//   4. the Sampler (sampler.h): penalties, temperature, filters, one id.
// The picked token then advances the constraint, and prepare() starts the
// next mask on the mask worker while the model computes the next logits.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "sampler.h"
#include "status.h"

namespace lora_share {

namespace constraint {
struct Compiled;
struct Stats;
class MaskWorker;
class RowConstraint;
}  // namespace constraint

// A picked token and what the caller asked to know of it.
struct TokenInfo {
  int64_t token = 0;
  size_t choice = 0;                           // which of the request's n answers
  std::optional<float> logprob;                // with logprobs: log_softmax of the raw logits
  std::vector<std::pair<int64_t, float>> top;  // top_logprobs ids and logprobs, likeliest first
};

// A request's settings for picking its tokens.
struct Picking {
  Sampling sampling;
  std::vector<std::pair<int64_t, float>> logit_bias;  // id, bias in [-100, 100]
  bool logprobs = false;
  int top_logprobs = 0;                                    // 0..20, with logprobs
  std::shared_ptr<const constraint::Compiled> constraint;  // null: free text
  constraint::MaskWorker* mask_worker = nullptr;           // fills masks beside the step; null: at pick time
  constraint::Stats* constraint_stats = nullptr;
  // n: answers to the same prompt, sharing its prefill; choice i samples with seed + i.
  size_t choices = 1;
};

class TokenPicker {
 public:
  // Choice `choice` of a request with `prompt` (the penalties') ending at
  // `stop_ids` (the constraint's end).
  TokenPicker(const Picking& picking, const std::vector<int64_t>& prompt, const std::vector<int64_t>& stop_ids,
              size_t choice);
  ~TokenPicker();
  TokenPicker(TokenPicker&&) noexcept;
  TokenPicker& operator=(TokenPicker&&) noexcept;

  // Before the model's step whose logits the next pick() takes: starts the
  // constraint's mask on the mask worker. Nothing without a constraint.
  void prepare();
  // The next token from `logits` (changed in place). A failure when the bias
  // and the constraint leave no token at all.
  StatusOr<TokenInfo> pick(std::vector<float>& logits);

 private:
  void log_probabilities(const std::vector<float>& logits, TokenInfo& info) const;

  const Picking* picking_;  // the request's, alive while it runs
  size_t choice_;
  Sampler sampler_;
  std::unique_ptr<constraint::RowConstraint> constraint_;
  size_t picked_ = 0;
};

}  // namespace lora_share
