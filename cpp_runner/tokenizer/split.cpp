#include "split.h"

#include <algorithm>

namespace lora_share::tok {

std::vector<Range> ranges_from_matches(const std::vector<std::pair<size_t, size_t>>& matches, size_t size) {
  if (size == 0) return {{0, 0, false}};
  std::vector<Range> out;
  size_t prev = 0;
  for (auto [start, end] : matches) {
    if (prev != start) out.push_back({prev, start, false});
    out.push_back({start, end, true});
    prev = end;
  }
  if (prev != size) out.push_back({prev, size, false});
  return out;
}

namespace {

// MergedWithPrevious (and, on the reversed list, MergedWithNext): a match
// joins the range before it unless that range was a match too.
std::vector<Range> merge_matches_into_neighbour(const std::vector<Range>& ranges, bool backwards) {
  std::vector<Range> acc;
  bool previous_match = false;
  auto visit = [&](const Range& r) {
    if (r.is_match && !previous_match && !acc.empty()) {
      if (backwards)
        acc.back().start = r.start;
      else
        acc.back().end = r.end;
    } else {
      acc.push_back({r.start, r.end, false});
    }
    previous_match = r.is_match;
  };
  if (backwards)
    std::for_each(ranges.rbegin(), ranges.rend(), visit);
  else
    std::for_each(ranges.begin(), ranges.end(), visit);
  if (backwards) std::reverse(acc.begin(), acc.end());
  return acc;
}

std::vector<Range> contiguous(const std::vector<Range>& ranges) {
  std::vector<Range> acc;
  bool previous_match = false;
  for (const Range& r : ranges) {
    if (r.is_match == previous_match && !acc.empty())
      acc.back().end = r.end;
    else
      acc.push_back({r.start, r.end, false});
    previous_match = r.is_match;
  }
  return acc;
}

}  // namespace

std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<Range>& ranges, SplitBehavior behavior) {
  std::vector<Range> kept;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Range& r : ranges)
        if (!r.is_match) kept.push_back(r);
      break;
    case SplitBehavior::kIsolated:
      kept = ranges;
      break;
    case SplitBehavior::kContiguous:
      kept = contiguous(ranges);
      break;
    case SplitBehavior::kMergedWithPrevious:
      kept = merge_matches_into_neighbour(ranges, false);
      break;
    case SplitBehavior::kMergedWithNext:
      kept = merge_matches_into_neighbour(ranges, true);
      break;
  }
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(kept.size());
  for (const Range& r : kept) out.emplace_back(r.start, r.end);
  return out;
}

}  // namespace lora_share::tok
