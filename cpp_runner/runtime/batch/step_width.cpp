#include "step_width.h"

#include <algorithm>

namespace lora_share {
namespace {

// A new step's weight in its shape's average: a few steps follow a change (a longer context, another process on
// the cores), one slow step (a page fault, a preemption) moves it by a fifth.
constexpr double kWeight = 0.2;
// Before any measurement near it, a step is assumed to cost the same up to kKnee positions (the weights'
// stream), then in proportion to its positions (compute): the low end of what was measured (6 on 2 cores).
constexpr double kKnee = 4;
// The tokens per millisecond of a width not yet measured count this much more: enough to try a wider step
// once when the estimate puts it close to the best, not enough to keep trying one that loses.
constexpr double kExplore = 1.25;

double shape(size_t positions) { return std::max(1.0, static_cast<double>(positions) / kKnee); }

}  // namespace

StepCosts::StepCosts(size_t rows, size_t width) : rows_(rows), width_(width), ms_(rows * width, 0.0) {}

bool StepCosts::inside(size_t rows, size_t width) const {
  return rows >= 1 && rows <= rows_ && width >= 1 && width <= width_;
}

bool StepCosts::measured(size_t rows, size_t width) const { return inside(rows, width) && at(rows, width) > 0; }

void StepCosts::record(size_t rows, size_t width, double ms) {
  if (!inside(rows, width) || !(ms > 0)) return;
  double& m = at(rows, width);
  // One outlier moves the average by at most its weight times the average again.
  m = m > 0 ? m + kWeight * (std::min(ms, 2 * m) - m) : ms;
}

double StepCosts::estimate(size_t rows, size_t width) const {
  if (measured(rows, width)) return at(rows, width);
  const double positions = shape(rows * width);
  if (inside(rows, width)) {
    size_t below = 0, above = 0;  // the nearest widths run with as many rows
    for (size_t w = width; w-- > 1;)
      if (at(rows, w) > 0) {
        below = w;
        break;
      }
    for (size_t w = width + 1; w <= width_; ++w)
      if (at(rows, w) > 0) {
        above = w;
        break;
      }
    if (below > 0 && above > 0) {  // on the line through them
      double t = static_cast<double>(width - below) / static_cast<double>(above - below);
      return at(rows, below) + t * (at(rows, above) - at(rows, below));
    }
    if (below > 0) return at(rows, below) * positions / shape(rows * below);
    if (above > 0) return at(rows, above) * positions / shape(rows * above);
  }
  // No step of as many rows yet: a plain step of the nearest row count (the weights' stream), scaled.
  for (size_t d = 1; d < rows_ + rows; ++d)
    for (size_t r : {rows - std::min(d, rows), rows + d})
      if (r >= 1 && r <= rows_ && at(r, 1) > 0) return at(r, 1) * positions / shape(r);
  return positions;  // nothing measured: only ratios between widths matter
}

std::vector<double> chained_kept(double acceptance, size_t n) {
  std::vector<double> kept(n + 1, 0.0);
  double chain = 1;
  for (size_t k = 1; k <= n; ++k) {
    chain *= acceptance;
    kept[k] = kept[k - 1] + chain;
  }
  return kept;
}

size_t best_width(const std::vector<RowDrafts>& rows, const StepCosts& costs) {
  size_t widest = 1;
  for (const RowDrafts& r : rows) widest = std::max(widest, r.expected_kept.size());
  size_t best = 1;
  double best_rate = 0;
  for (size_t width = 1; width <= widest; ++width) {
    double gained = 0;  // each row's next token, and the drafts it expects to keep of the first width - 1
    for (const RowDrafts& r : rows)
      gained += 1 + (r.expected_kept.empty() ? 0 : r.expected_kept[std::min(width, r.expected_kept.size()) - 1]);
    double rate = gained / costs.estimate(rows.size(), width);
    if (width > 1 && !costs.measured(rows.size(), width)) rate *= kExplore;
    if (rate > best_rate) best = width, best_rate = rate;
  }
  return best;
}

}  // namespace lora_share
