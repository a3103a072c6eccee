#include "slot_table.h"

#include <algorithm>

namespace lora_share {

SlotTable::SlotTable(size_t slots, bool ring) : slots_(slots), ring_(ring) {}

std::optional<SlotTable::Claim> SlotTable::claim(uint64_t adapter, const std::vector<int64_t>& tokens, bool reuse) {
  std::optional<size_t> best, lru;
  size_t kept = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.busy) continue;
    if (!lru || s.last_used < slots_[*lru].last_used) lru = i;
    if (!reuse || !s.used || s.adapter != adapter || tokens.empty()) continue;
    auto end = std::mismatch(s.tokens.begin(), s.tokens.end(), tokens.begin(), tokens.end());
    size_t k = std::min(static_cast<size_t>(end.first - s.tokens.begin()), tokens.size() - 1);
    // A ring's older rows are overwritten by later positions: only its end continues.
    if (ring_ && k < s.tokens.size()) k = 0;
    if (k > kept) best = i, kept = k;
  }
  if (!lru) return std::nullopt;
  if (best) {
    ++prefix_hits_;
    prefix_tokens_ += kept;
  }
  size_t chosen = best ? *best : *lru;
  Slot& s = slots_[chosen];
  size_t stale = s.tokens.size();
  s.adapter = adapter;
  s.used = true;
  s.tokens.resize(best ? kept : 0);
  s.busy = true;
  s.last_used = clock_++;
  return Claim{chosen, best ? kept : 0, stale};
}

void SlotTable::fed(size_t slot, const int64_t* tokens, size_t n) {
  slots_[slot].tokens.insert(slots_[slot].tokens.end(), tokens, tokens + n);
}

void SlotTable::release(size_t slot) {
  slots_[slot].busy = false;
  slots_[slot].last_used = clock_++;
}

void SlotTable::forget(size_t slot) {
  slots_[slot].tokens.clear();
  ++forgotten_;
}

size_t SlotTable::in_use() const {
  return static_cast<size_t>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.busy; }));
}

}  // namespace lora_share
