// How the next token is picked from a step's logits: greedy, or sampled with
// transformers' filters, after OpenAI's and transformers' penalties.
//
//   1. repeat_penalty (transformers' repetition_penalty): every id already in
//      the prompt or the answer has its logit divided by it when positive,
//      multiplied when negative;
//   2. presence_penalty / frequency_penalty (OpenAI's): an id the answer
//      already holds c times loses presence + c * frequency;
//   3. temperature 0: argmax (first index on ties, as numpy); above 0, as
//      transformers' sampling warpers, in their order: logits / temperature,
//      top_k (the k likeliest ids), top_p (the likeliest ids whose
//      probabilities add up to top_p, at least one), min_p (ids at least
//      min_p x the likeliest one's probability), then one draw from what is
//      left, from a generator seeded by `seed` (the same seed, the same ids).
// With every filter and penalty off, the draw is the plain softmax's.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace lora_share {

struct Sampling {
  double temperature = 0;  // 0: greedy
  uint64_t seed = 0;
  int64_t top_k = 0;             // 0: off
  double top_p = 1;              // 1: off
  double min_p = 0;              // 0: off
  double repeat_penalty = 1;     // 1: off
  double presence_penalty = 0;   // 0: off
  double frequency_penalty = 0;  // 0: off
};

class Sampler {
 public:
  Sampler(const Sampling& sampling, const std::vector<int64_t>& prompt);
  // The next id from `logits` (penalised in place); it is remembered for the
  // penalties of the next picks.
  int64_t pick(std::vector<float>& logits);

 private:
  void penalise(std::vector<float>& logits) const;
  int64_t draw(const std::vector<float>& logits);

  Sampling sampling_;
  std::mt19937_64 rng_;
  std::vector<int64_t> prompt_;
  std::vector<int64_t> answer_;
};

}  // namespace lora_share
