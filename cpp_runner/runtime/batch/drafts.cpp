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

}  // namespace lora_share
