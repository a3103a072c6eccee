// Where a request's drafts come from (issue 60, Deliver 1), one Drafter per
// request: its prompt and answer so far (prompt lookup: the tokens that
// followed the latest earlier occurrence of the answer's last few tokens), and
// its prediction (OpenAI's Predicted Outputs: the answer as the client expects
// it). The drafts are verified by BatchEngine::verify and kept by
// accept_greedy or accept_sampled (drafts.h).
//
// How many it proposes adapts to what the request keeps: the length doubles
// while every draft is accepted (up to max_drafts), falls to one more than
// was accepted when some are, and after a step that accepts none the drafter
// pauses, proposing nothing for 1, 2, 4, .. steps (at most max_pause), then
// probes with one draft. Drafts that fail cost a wider step; a free answer,
// whose lookups rarely hold, so pays for a few probes, and a copied one
// drafts long.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lora_share {

struct DrafterOptions {
  size_t max_drafts = 8;    // a verified row's most drafts (decode_batch's)
  size_t min_ngram = 2;     // the shortest suffix of the answer looked up
  size_t max_ngram = 4;     // the longest, tried first
  size_t first_length = 4;  // drafts proposed before any feedback
  size_t max_pause = 64;    // the longest pause (steps) after failed drafts
};

class Drafter {
 public:
  Drafter(std::vector<int64_t> prompt, std::vector<int64_t> prediction, DrafterOptions options = {});

  // The answer gained `n` tokens (the first from the prompt, then each step's).
  void extend(const int64_t* tokens, size_t n);
  // This step's drafts: up to length() tokens guessed to follow the answer so
  // far; none while paused or when nothing matches.
  std::vector<int64_t> propose();
  // What the step made of the last proposal: `accepted` of its `drafted`.
  void feedback(size_t drafted, size_t accepted);

  size_t length() const { return length_; }  // 0 while paused
  size_t pause() const { return pause_; }    // steps left without drafts

 private:
  // Up to `n` tokens that followed the latest earlier occurrence of the answer's suffix in `seq` (the
  // prompt and answer), or the prediction's occurrence nearest after its last use.
  std::vector<int64_t> from_context(size_t n) const;
  std::vector<int64_t> from_prediction(size_t n);

  DrafterOptions options_;
  std::vector<int64_t> seq_;  // the prompt, then the answer
  size_t prompt_ = 0;         // the prompt's length in seq_
  std::vector<int64_t> prediction_;
  size_t cursor_ = 0;  // in prediction_: just after the last drafts taken from it
  size_t length_;
  size_t pause_ = 0;
  size_t misses_ = 0;  // steps in a row that accepted nothing
};

}  // namespace lora_share
