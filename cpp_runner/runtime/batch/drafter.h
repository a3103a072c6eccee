// Where a request's drafts come from (issue 60, Deliver 1), one Drafter per
// request: its prompt and answer so far (prompt lookup: the tokens that
// followed the latest earlier occurrence of the answer's last few tokens), and
// its prediction (OpenAI's Predicted Outputs: the answer as the client expects
// it). The drafts are verified by BatchEngine::verify and kept by
// accept_greedy or accept_sampled (drafts.h).
//
// It proposes all it finds, up to max_drafts, and estimates how many the
// request keeps (acceptance()); the scheduler verifies as many as pay for the
// step's width (step_width.h): on a device whose step costs the same for a
// few more positions, a free answer's few right guesses come free, and a
// wide step of many rows runs only for drafts likely kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lora_share {

struct DrafterOptions {
  size_t max_drafts = 8;  // a verified row's most drafts (decode_batch's)
  size_t min_ngram = 2;   // the shortest suffix of the answer looked up
  size_t max_ngram = 4;   // the longest, tried first
};

class Drafter {
 public:
  Drafter(std::vector<int64_t> prompt, std::vector<int64_t> prediction, DrafterOptions options = {});

  // The answer gained `n` tokens (the first from the prompt, then each step's).
  void extend(const int64_t* tokens, size_t n);
  // This step's drafts: up to max_drafts tokens guessed to follow the answer
  // so far; none when nothing matches.
  std::vector<int64_t> propose();
  // Weaker drafts, for a row that proposed none in a step that verifies
  // others' drafts (its padding is computed whatever it holds): up to
  // max_drafts tokens that followed the latest earlier occurrence of the
  // answer's last token alone. Its feedback is not the drafter's to hear.
  std::vector<int64_t> propose_loose() const;
  // What a step made of the first `drafted` drafts of the last proposal (the
  // scheduler may verify fewer than proposed): it kept `accepted`.
  void feedback(size_t drafted, size_t accepted);

  // The chance that a draft is kept when the one before it was: each step that verified its drafts
  // estimates it as kept / (kept + its first rejected one, if any); an average of those, recent steps
  // weighing most (a request that stops copying is seen within 2 or 3 steps), from one half.
  double acceptance() const { return acceptance_; }

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
  double acceptance_ = 0.5;
};

}  // namespace lora_share
