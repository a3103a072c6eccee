// The split step every pre-tokenizer shares (NormalizedString::split in the
// Rust library): a text cut into matched / unmatched ranges, regrouped by a
// SplitDelimiterBehavior.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lora_share::tok {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Range {
  size_t start, end;
  bool is_match;
};

// Matches -> the alternating matched / unmatched ranges covering `size` bytes.
std::vector<Range> ranges_from_matches(const std::vector<std::pair<size_t, size_t>>& matches, size_t size);

// Regroups ranges by `behavior` and returns the [start, end) of each piece to keep.
std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<Range>& ranges, SplitBehavior behavior);

}  // namespace lora_share::tok
