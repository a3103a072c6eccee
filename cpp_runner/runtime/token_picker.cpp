#include "token_picker.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "row_constraint.h"

namespace lora_share {
namespace {

Sampling seeded(Sampling s, size_t choice) {
  s.seed += choice;
  return s;
}

// OpenAI's logit_bias: -100 "should result in a ban".
constexpr float kBan = -100.0f;

}  // namespace

TokenPicker::TokenPicker(const Picking& picking, const std::vector<int64_t>& prompt,
                         const std::vector<int64_t>& stop_ids, size_t choice)
    : picking_(&picking), choice_(choice), sampler_(seeded(picking.sampling, choice), prompt) {
  if (picking.constraint)
    constraint_ = std::make_unique<constraint::RowConstraint>(picking.constraint, stop_ids, picking.constraint_stats);
}

TokenPicker::~TokenPicker() = default;
TokenPicker::TokenPicker(TokenPicker&&) noexcept = default;
TokenPicker& TokenPicker::operator=(TokenPicker&&) noexcept = default;

void TokenPicker::prepare() {
  if (constraint_) constraint_->prepare(picking_->mask_worker);
}

// log_softmax in double (the sum of 49k exponentials in float loses the last bits), and the
// likeliest ids by one pass keeping them sorted (top_logprobs is at most 20).
void TokenPicker::log_probabilities(const std::vector<float>& logits, TokenInfo& info) const {
  double max = -std::numeric_limits<double>::infinity();
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  info.logprob = static_cast<float>(logits[static_cast<size_t>(info.token)] - log_z);
  const size_t k = static_cast<size_t>(picking_->top_logprobs);
  if (k == 0) return;
  std::vector<std::pair<int64_t, float>> top;  // likeliest first; equal logits: lower id first
  top.reserve(k + 1);
  for (size_t id = 0; id < logits.size(); ++id) {
    if (top.size() == k && !(logits[id] > top.back().second)) continue;
    auto at = std::upper_bound(top.begin(), top.end(), logits[id],
                               [](float value, const std::pair<int64_t, float>& e) { return value > e.second; });
    top.insert(at, {static_cast<int64_t>(id), logits[id]});
    if (top.size() > k) top.pop_back();
  }
  for (auto& [id, value] : top) value = static_cast<float>(value - log_z);
  info.top = std::move(top);
}

StatusOr<TokenInfo> TokenPicker::pick(std::vector<float>& logits) {
  TokenInfo info;
  info.choice = choice_;
  std::vector<float> raw;
  if (picking_->logprobs) raw = logits;  // the model's own distribution, before the bias and the mask
  const int64_t vocab = static_cast<int64_t>(logits.size());
  // Scores that are not numbers come from the model itself (an adapter whose weights or scale overflow),
  // not from the request's bias or constraint: said so, as no sampler can pick from them.
  const auto usable = [](float l) { return l > -std::numeric_limits<float>::infinity(); };  // false for NaN
  if (std::any_of(logits.begin(), logits.end(), [](float l) { return std::isnan(l); }) ||
      std::none_of(logits.begin(), logits.end(), usable))
    return Status::usage("token " + std::to_string(picked_) + " of choice " + std::to_string(choice_) +
                         ": no token can be picked, the model's scores are not numbers (NaN) or all minus "
                         "infinity: the adapter's weights or its scale overflow; check the adapter and its lora "
                         "scale");
  for (const auto& [id, bias] : picking_->logit_bias)
    if (id >= 0 && id < vocab) logits[id] = bias <= kBan ? -std::numeric_limits<float>::infinity() : logits[id] + bias;
  if (constraint_) constraint_->apply(logits.data(), vocab);
  if (std::none_of(logits.begin(), logits.end(), usable))
    return Status::usage("token " + std::to_string(picked_) + " of choice " + std::to_string(choice_) +
                         ": no token is left to pick (logit_bias bans every token " +
                         (constraint_ ? "the constraint allows there)" : "there)"));
  info.token = sampler_.pick(logits);
  ++picked_;
  if (constraint_ && !constraint_->accept(info.token))
    return Status::failure("the constraint refused token " + std::to_string(info.token) +
                           ", which its own mask allowed");
  if (picking_->logprobs) log_probabilities(raw, info);
  return info;
}

}  // namespace lora_share
