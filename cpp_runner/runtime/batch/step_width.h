// How wide a step that verifies drafts should be (issue 60, "Drafts in the
// batch"): decode_batch runs every row at the step's width (its widest row's
// last token and drafts; the others padded), so one row's long drafts make
// every row pay for them. On a device with few cores a step of many
// positions is compute-bound: on 2 cores SmolLM2-135M's step costs the same
// up to ~6 positions, then ~2 ms a position (benchmarks/verify_step.py), so 4
// rows of 8 drafts cost 3.2x a plain step. The scheduler therefore picks the
// width that gains the most tokens per millisecond: each row's expected kept
// drafts (its drafter's acceptance, chained_kept) against what a step of
// that many rows and width costs, learned from the steps it ran (StepCosts;
// rows cost more than positions alone say: each attends over its own
// context, with its own adapter).
// The width changes how fast, never what: a greedy or sampled row's tokens
// are the same whichever drafts are verified.
#pragma once

#include <cstddef>
#include <vector>

namespace lora_share {

// What a decode_batch step of some rows, each `width` tokens wide, costs in
// milliseconds: the steps run, timed, averaged per shape (recent steps
// weighing most); a shape not yet run is estimated from the nearest that were.
class StepCosts {
 public:
  // Shapes of 1..rows rows and 1..width tokens a row (the engine's).
  StepCosts(size_t rows, size_t width);

  void record(size_t rows, size_t width, double ms);
  double estimate(size_t rows, size_t width) const;
  bool measured(size_t rows, size_t width) const;

 private:
  double& at(size_t rows, size_t width) { return ms_[(rows - 1) * width_ + width - 1]; }
  double at(size_t rows, size_t width) const { return ms_[(rows - 1) * width_ + width - 1]; }
  bool inside(size_t rows, size_t width) const;

  size_t rows_, width_;
  std::vector<double> ms_;  // [rows - 1][width - 1]: 0 until a step of that shape ran
};

// How many of the first k drafts (k = 0..n) are expected kept when each is kept with chance `acceptance`
// if the one before it was: acceptance + acceptance^2 + .. + acceptance^k.
std::vector<double> chained_kept(double acceptance, size_t n);

// One row of a step about to run: the drafts its drafter proposed, and how
// many of the first k of them it expects to keep (expected_kept[k], k = 0..drafts).
struct RowDrafts {
  std::vector<double> expected_kept;
};

// The step's width (1: no drafts, a plain step; at most the longest
// proposal + 1) that gains the most tokens per estimated millisecond. A width
// whose cost is not yet measured gets a bonus (its estimate may be
// pessimistic), so the first steps try it once.
size_t best_width(const std::vector<RowDrafts>& rows, const StepCosts& costs);

}  // namespace lora_share
