#include "drafts.h"

#include <algorithm>

namespace lora_share {

std::vector<int64_t> accept_greedy(const std::vector<int64_t>& tokens, const float* logits, int64_t vocab) {
  std::vector<int64_t> gained;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* row = logits + i * static_cast<size_t>(vocab);
    int64_t pick = std::max_element(row, row + vocab) - row;
    gained.push_back(pick);
    if (i + 1 == tokens.size() || tokens[i + 1] != pick) break;
  }
  return gained;
}

namespace {

// A uniform number in [0, 1) from `rng`: 53 random bits (std::generate_canonical's result is
// implementation-defined; this is the same on every library).
double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// An index drawn from weights w[0..n) (not all zero), in double.
int64_t draw(const std::vector<double>& w, std::mt19937_64& rng) {
  double total = 0;
  for (double x : w) total += x;
  double target = uniform(rng) * total, sum = 0;
  int64_t last = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0) continue;
    sum += w[i];
    last = static_cast<int64_t>(i);
    if (target < sum) return last;
  }
  return last;  // rounding left the target at the very end
}

}  // namespace

std::vector<int64_t> accept_sampled(const std::vector<int64_t>& tokens, const float* probs, int64_t vocab,
                                    const float* draft_probs, std::mt19937_64& rng) {
  std::vector<int64_t> gained;
  std::vector<double> w(static_cast<size_t>(vocab));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* p = probs + i * static_cast<size_t>(vocab);
    if (i + 1 == tokens.size()) {  // every draft kept: the next token from the last distribution
      for (int64_t v = 0; v < vocab; ++v) w[v] = p[v];
      gained.push_back(draw(w, rng));
      break;
    }
    int64_t d = tokens[i + 1];
    const float* q = draft_probs ? draft_probs + i * static_cast<size_t>(vocab) : nullptr;
    double pd = p[d], qd = q ? q[d] : 1.0;
    if (qd > 0 && uniform(rng) * qd < pd) {  // kept with probability min(1, p(d) / q(d))
      gained.push_back(d);
      continue;
    }
    // Rejected: the residual max(0, p - q); all zero only if p = q, where nothing is rejected (up to
    // rounding): then p itself.
    double left = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      double qv = q ? q[v] : (v == d ? 1.0 : 0.0);
      w[v] = std::max(0.0, static_cast<double>(p[v]) - qv);
      left += w[v];
    }
    if (left <= 0)
      for (int64_t v = 0; v < vocab; ++v) w[v] = p[v];
    gained.push_back(draw(w, rng));
    break;
  }
  return gained;
}

}  // namespace lora_share
