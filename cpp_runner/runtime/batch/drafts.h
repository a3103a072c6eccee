// What a row that verified drafts (BatchEngine::verify) commits: the
// acceptance rule of speculative decoding, apart from who drafted and who
// schedules (issue 60).
#pragma once

#include <cstdint>
#include <vector>

namespace lora_share {

// Greedy acceptance. `tokens`: a verified row's last token, then its drafts;
// `logits`: the row's tokens.size() x `vocab` logits from verify (row i: after
// tokens[i]). Each draft is kept while it is the argmax after the token
// before it (the first index on ties, as the sampler picks); the first
// mismatch ends the row. Returns the tokens the sequence gains: the accepted
// drafts, then the argmax after the last of them (1..tokens.size() tokens,
// each the token one-token greedy decode picks at its position). Their K/V,
// but for the last one's, are in the slot already; the next step feeds the
// last one at its position.
std::vector<int64_t> accept_greedy(const std::vector<int64_t>& tokens, const float* logits, int64_t vocab);

}  // namespace lora_share
