#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace lora_share {

Sampler::Sampler(const Sampling& sampling, const std::vector<int64_t>& prompt)
    : sampling_(sampling), rng_(sampling.seed), prompt_(prompt) {}

void Sampler::penalise(std::vector<float>& logits) const {
  const auto vocab = static_cast<int64_t>(logits.size());
  auto in_vocab = [vocab](int64_t id) { return id >= 0 && id < vocab; };
  if (sampling_.repeat_penalty != 1) {
    std::unordered_set<int64_t> seen(prompt_.begin(), prompt_.end());
    seen.insert(answer_.begin(), answer_.end());
    const float p = static_cast<float>(sampling_.repeat_penalty);
    for (int64_t id : seen) {
      if (!in_vocab(id)) continue;
      float& l = logits[id];
      l = l > 0 ? l / p : l * p;
    }
  }
  if (sampling_.presence_penalty != 0 || sampling_.frequency_penalty != 0) {
    std::unordered_map<int64_t, int64_t> counts;
    for (int64_t id : answer_) ++counts[id];
    for (const auto& [id, c] : counts) {
      if (!in_vocab(id)) continue;
      logits[id] -= static_cast<float>(sampling_.presence_penalty + c * sampling_.frequency_penalty);
    }
  }
}

int64_t Sampler::draw(const std::vector<float>& logits) {
  const double t = sampling_.temperature;
  if (t <= 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  double max_z = -INFINITY;
  for (float l : logits) max_z = std::max(max_z, l / t);
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) p[i] = std::exp(logits[i] / t - max_z);
  const auto vocab = static_cast<int64_t>(p.size());
  if (sampling_.top_k > 0 && sampling_.top_k < vocab) {
    std::vector<double> sorted = p;
    std::nth_element(sorted.begin(), sorted.begin() + (sampling_.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[sampling_.top_k - 1];
    for (double& q : p)
      if (q < kth) q = 0;  // ties with the k-th are kept, as transformers' TopK
  }
  if (sampling_.top_p < 1) {
    std::vector<int64_t> order(p.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    double kept = 0;
    size_t i = 0;
    for (; i < order.size() && kept < sampling_.top_p * total; ++i) kept += p[order[i]];
    for (i = std::max<size_t>(i, 1); i < order.size(); ++i) p[order[i]] = 0;
  }
  if (sampling_.min_p > 0) {
    const double floor = sampling_.min_p * *std::max_element(p.begin(), p.end());
    for (double& q : p)
      if (q < floor) q = 0;
  }
  const double sum = std::accumulate(p.begin(), p.end(), 0.0);
  double u = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  int64_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) continue;
    last = static_cast<int64_t>(i);
    u -= p[i];
    if (u < 0) return last;
  }
  return last;
}

int64_t Sampler::pick(std::vector<float>& logits) {
  penalise(logits);
  const int64_t id = draw(logits);
  answer_.push_back(id);
  return id;
}

}  // namespace lora_share
