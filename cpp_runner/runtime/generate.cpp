#include "generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace lora_share {
namespace {

// Feeds the prompt from position 0 in forward calls of at most the program's
// prefill chunk; `logits` are the last call's.
Status prefill(Adapter& adapter, const std::vector<int64_t>& prompt, std::vector<float>* logits) {
  size_t chunk = static_cast<size_t>(std::max<int64_t>(adapter.prefill_chunk(), 1));
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    std::vector<int64_t> part(prompt.begin() + start, prompt.begin() + std::min(prompt.size(), start + chunk));
    Status s = adapter.step(part, static_cast<int64_t>(start), logits);
    if (!s.ok()) return s;
  }
  return Status();
}

}  // namespace

Status check_request(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t vocab_size,
                     int64_t max_seq_len, const std::string& tokens_label) {
  for (int64_t t : prompt) {
    if (t < 0 || t >= vocab_size)
      return Status::usage(tokens_label + ": id " + std::to_string(t) + " is outside the vocabulary [0, " +
                           std::to_string(vocab_size) + ")");
  }
  if (max_new_tokens < 1) return Status::usage("--max-new-tokens must be at least 1");
  // Unsigned: a huge max_new_tokens must not overflow into a small count.
  uint64_t needed = prompt.size() + static_cast<uint64_t>(max_new_tokens) - 1;
  if (needed > static_cast<uint64_t>(max_seq_len))
    return Status::usage(std::to_string(prompt.size()) + " prompt tokens + " + std::to_string(max_new_tokens) +
                         " new tokens need " + std::to_string(needed) +
                         " positions, but the program's context "
                         "(max_seq_len) is " +
                         std::to_string(max_seq_len) + ": shorten the request");
  return Status();
}

StatusOr<Generation> generate(Adapter& adapter, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                              const Picking& picking, bool keep_logits, const TokenCallback& on_token,
                              const std::vector<int64_t>& stop_ids) {
  using clock = std::chrono::steady_clock;
  Generation g;
  g.vocab = adapter.vocab_size();
  std::vector<float> first, logits;

  auto t0 = clock::now();
  // The first choice's mask is filled while the prompt runs.
  TokenPicker picker(picking, prompt, stop_ids, 0);
  picker.prepare();
  Status s = prefill(adapter, prompt, &first);
  if (!s.ok()) return s;
  g.prompt_fed = prompt.size();
  auto t1 = clock::now();
  for (size_t choice = 0; choice < std::max<size_t>(picking.choices, 1); ++choice) {
    if (choice > 0) {
      picker = TokenPicker(picking, prompt, stop_ids, choice);
      picker.prepare();
      if (adapter.ring_cache()) {
        s = prefill(adapter, prompt, &first);
        if (!s.ok()) return s;
        g.prompt_fed += prompt.size();
      }
    }
    logits = first;
    int64_t pos = static_cast<int64_t>(prompt.size());
    for (int64_t i = 0; i < max_new_tokens; ++i) {
      if (keep_logits) g.logits.insert(g.logits.end(), logits.begin(), logits.end());
      auto token = picker.pick(logits);
      if (!token.ok()) return token.status();
      g.tokens.push_back(token->token);
      if (on_token && !on_token(token.value())) break;
      if (std::find(stop_ids.begin(), stop_ids.end(), token->token) != stop_ids.end()) break;
      if (i + 1 < max_new_tokens) {
        picker.prepare();  // the next mask, beside the step
        s = adapter.step({token->token}, pos, &logits);
        if (!s.ok()) return s;
        ++pos;
      }
    }
  }
  auto t2 = clock::now();
  g.rows = keep_logits ? static_cast<int64_t>(g.tokens.size()) : 0;

  auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  double prefill_s = seconds(t1 - t0), decode_s = seconds(t2 - t1);
  g.prefill_ms = prefill_s * 1e3;
  g.decode_ms = decode_s * 1e3;
  if (prefill_s > 0) g.prefill_tokens_per_s = prompt.size() / prefill_s;
  int64_t decode_steps = static_cast<int64_t>(g.tokens.size()) - static_cast<int64_t>(picking.choices);
  if (decode_steps > 0 && decode_s > 0) g.decode_tokens_per_s = decode_steps / decode_s;
  return g;
}

}  // namespace lora_share
