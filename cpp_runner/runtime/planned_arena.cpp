#include "planned_arena.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace lora_share {

using executorch::runtime::Span;

void PlannedArena::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

StatusOr<std::unique_ptr<PlannedArena>> PlannedArena::allocate(const std::vector<size_t>& sizes) {
  auto arena = std::unique_ptr<PlannedArena>(new PlannedArena());
  for (size_t size : sizes) {
    // A zero-sized buffer still needs a distinct, valid address.
    auto* p = static_cast<uint8_t*>(std::calloc(std::max<size_t>(size, 1), 1));
    if (p == nullptr)
      return Status::failure("out of memory allocating " + std::to_string(size) + " bytes of planned memory");
    arena->buffers_.emplace_back(p);
    arena->spans_.emplace_back(p, size);
  }
  return arena;
}

std::vector<size_t> PlannedArena::largest(const std::vector<std::vector<size_t>>& programs) {
  std::vector<size_t> out;
  for (const auto& sizes : programs) {
    if (sizes.size() > out.size()) out.resize(sizes.size(), 0);
    for (size_t i = 0; i < sizes.size(); ++i) out[i] = std::max(out[i], sizes[i]);
  }
  return out;
}

Span<Span<uint8_t>> PlannedArena::spans(size_t count, size_t first) {
  first = std::min(first, spans_.size());
  return Span<Span<uint8_t>>(spans_.data() + first, std::min(count, spans_.size() - first));
}

bool PlannedArena::holds(const std::vector<size_t>& sizes) const {
  if (sizes.size() > spans_.size()) return false;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (spans_[i].size() < sizes[i]) return false;
  return true;
}

size_t PlannedArena::total_bytes() const {
  size_t total = 0;
  for (const auto& s : spans_) total += s.size();
  return total;
}

}  // namespace lora_share
