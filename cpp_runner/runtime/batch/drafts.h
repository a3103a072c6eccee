// What a row that verified drafts (BatchEngine::verify) commits: the
// acceptance rules of speculative decoding, greedy and sampled, apart from who
// drafted (drafter.h) and who schedules (issue 60).
#pragma once

#include <cstdint>
#include <random>
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

// Speculative sampling (Leviathan, Kalman and Matias, 2023), which keeps the
// target's distribution whatever the drafts. `probs`: the row's tokens.size()
// x `vocab` distributions the sampler draws from after each token (its
// penalties, temperature and filters applied; each sums to 1). `draft_probs`:
// the drafter's distributions of each draft (tokens.size() - 1 rows), or
// nullptr for drafts that are certain (prompt lookup, a prediction: q = 1 at
// the draft). Draft i is kept with probability min(1, p(d) / q(d)); at the
// first rejection the token is drawn from max(0, p - q), renormalised (a
// certain draft: p without the draft); with every draft kept the next is
// drawn from the last row. Each token gained is distributed as one-token
// sampling would draw it. Uniform numbers come from `rng`, in order, one or
// two per position: the same seed, the same tokens. Returns the tokens gained
// (1..tokens.size()).
std::vector<int64_t> accept_sampled(const std::vector<int64_t>& tokens, const float* probs, int64_t vocab,
                                    const float* draft_probs, std::mt19937_64& rng);

}  // namespace lora_share
