// Token generation, following lora_share/inference/generate.py exactly: a prompt
// longer than the program's prefill chunk is fed in calls of at most that
// many tokens at positions 0, chunk, 2 * chunk, ...; row 0 of the logits is
// taken at the last prompt position, row i (i >= 1) after feeding
// generated token i; max_new_tokens tokens and rows come out, and the last
// position used is len(prompt) + max_new_tokens - 2.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "adapter.h"
#include "status.h"
#include "token_picker.h"

namespace lora_share {

struct Generation {
  std::vector<int64_t> tokens;
  std::vector<float> logits;  // rows x vocab, row-major; empty unless kept
  int64_t rows = 0;
  int64_t vocab = 0;
  uint64_t prompt_fed = 0;             // prompt tokens run through the model (n choices share them)
  uint64_t drafted = 0, accepted = 0;  // speculative decoding: drafts verified, and those kept
  double prefill_ms = 0, decode_ms = 0;
  std::optional<double> prefill_tokens_per_s, decode_tokens_per_s;
};

// Refuses requests the exported program cannot take (usage errors), with the
// same wording as the Python check_request.
// `tokens_label` names where the ids came from in the message.
Status check_request(const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t vocab_size,
                     int64_t max_seq_len, const std::string& tokens_label = "--tokens");

// Prefill then decode, each token picked as `picking` says (token_picker.h):
// temperature 0 is greedy (argmax, first index on ties, as numpy); above 0 it
// samples with a generator seeded by `seed`. The C++ and numpy random streams
// differ, so sampled ids match Python only in distribution.
// `on_token`, if given, sees each token as soon as it is picked; returning
// false stops generation there (the tokens so far are the result).
// A token in `stop_ids` (the build's EOS ids) ends generation after it, as
// transformers' generate does: it is the last token (and on_token sees it).
// With picking.choices = n > 1 the choices run one after the other from the
// one prefill: the prompt's KV rows are never written by decoding (position p
// is row p + 1), so each choice starts at the prompt's end; a program with
// ring slabs (sliding windows) may overwrite them, so there each later choice
// feeds the prompt again. `on_token` returning false ends that choice only;
// Generation::tokens are every choice's, in order.
using TokenCallback = std::function<bool(const TokenInfo& token)>;
StatusOr<Generation> generate(Adapter& adapter, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                              const Picking& picking, bool keep_logits, const TokenCallback& on_token = nullptr,
                              const std::vector<int64_t>& stop_ids = {});

}  // namespace lora_share
