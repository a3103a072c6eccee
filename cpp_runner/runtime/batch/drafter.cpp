#include "drafter.h"

#include <algorithm>
#include <utility>

namespace lora_share {
namespace {

// Whether `seq` holds `suffix` (the last `g` tokens of `of`) at `i`.
bool holds(const std::vector<int64_t>& seq, size_t i, const std::vector<int64_t>& of, size_t g) {
  return std::equal(of.end() - static_cast<std::ptrdiff_t>(g), of.end(), seq.begin() + static_cast<std::ptrdiff_t>(i));
}

std::vector<int64_t> after(const std::vector<int64_t>& seq, size_t from, size_t n) {
  size_t end = std::min(seq.size(), from + n);
  return std::vector<int64_t>(seq.begin() + static_cast<std::ptrdiff_t>(from),
                              seq.begin() + static_cast<std::ptrdiff_t>(end));
}

}  // namespace

Drafter::Drafter(std::vector<int64_t> prompt, std::vector<int64_t> prediction, DrafterOptions options)
    : options_(options), seq_(std::move(prompt)), prompt_(seq_.size()), prediction_(std::move(prediction)) {
  options_.min_ngram = std::max<size_t>(options_.min_ngram, 1);
  options_.max_ngram = std::max(options_.max_ngram, options_.min_ngram);
}

void Drafter::extend(const int64_t* tokens, size_t n) { seq_.insert(seq_.end(), tokens, tokens + n); }

std::vector<int64_t> Drafter::propose() {
  if (options_.max_drafts == 0) return {};
  std::vector<int64_t> drafts = from_prediction(options_.max_drafts);
  return drafts.empty() ? from_context(options_.max_drafts) : drafts;
}

std::vector<int64_t> Drafter::propose_loose() const {
  if (seq_.size() < 2) return {};
  for (size_t i = seq_.size() - 1; i-- > 0;)
    if (seq_[i] == seq_.back()) return after(seq_, i + 1, options_.max_drafts);
  return {};
}

void Drafter::feedback(size_t drafted, size_t accepted) {
  if (drafted == 0) return;
  const double kept = static_cast<double>(accepted);
  acceptance_ += 0.4 * (kept / (kept + (accepted < drafted ? 1.0 : 0.0)) - acceptance_);
}

std::vector<int64_t> Drafter::from_prediction(size_t n) {
  if (prediction_.empty()) return {};
  size_t answer = seq_.size() - prompt_;
  if (answer < options_.min_ngram) {
    // Too little answer to look up: the prediction's start, if the answer so far is its start.
    if (answer >= prediction_.size() ||
        !std::equal(seq_.begin() + static_cast<std::ptrdiff_t>(prompt_), seq_.end(), prediction_.begin()))
      return {};
    cursor_ = answer;
    return after(prediction_, answer, n);
  }
  for (size_t g = std::min(options_.max_ngram, answer); g >= options_.min_ngram; --g) {
    // The occurrence whose end is nearest the cursor (where the answer was in the prediction), the later on
    // a tie: the answer moves through the prediction in order, repeats of a phrase elsewhere are not it.
    size_t best = prediction_.size(), best_distance = 0;
    for (size_t i = 0; i + g < prediction_.size(); ++i) {
      if (!holds(prediction_, i, seq_, g)) continue;
      size_t end = i + g;
      size_t distance = end > cursor_ ? end - cursor_ : cursor_ - end;
      if (best == prediction_.size() || distance <= best_distance) {
        best = end;
        best_distance = distance;
      }
    }
    if (best < prediction_.size()) {
      cursor_ = best;
      return after(prediction_, best, n);
    }
  }
  return {};
}

std::vector<int64_t> Drafter::from_context(size_t n) const {
  if (seq_.size() < 2) return {};
  for (size_t g = std::min(options_.max_ngram, seq_.size() - 1); g >= options_.min_ngram; --g) {
    // The latest earlier occurrence of the last g tokens (not the suffix itself).
    for (size_t i = seq_.size() - g; i-- > 0;)
      if (holds(seq_, i, seq_, g)) return after(seq_, i + g, n);
  }
  return {};
}

}  // namespace lora_share
