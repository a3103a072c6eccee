// Planned memory for loaded methods: the buffers ExecuTorch's memory planning
// lays out a method's activations in (one per memory id), and the KV cache
// the runtime keeps for the program (forward_io.h), one more buffer.
//
// The runner gives every loaded adapter program ONE arena, sized buffer by
// buffer to the largest program, so a further adapter costs its own bytes
// and not another KV cache and activation set. That is correct because the
// runner serves one request at a time and every request starts at position
// 0: a request writes every cache row it reads (a call at position P reads
// rows 1..P, all written earlier in the same request, and the row 0 sink of
// each slab, which stays zero because nothing writes row 0), so programs
// sharing the arena never see each other's state, and a program's own KV
// state does not survive to its next request. Inputs have no planned memory
// (the export leaves them out): execute reads them, the KV cache included, in
// place; outputs are copied out right after it, before another method runs.
//
// The KV cache is buffer 0 and a method's planned buffers follow it, so that
// every program's cache lands in the same buffer whatever the number of its
// planned buffers: no program's activations overwrite another's sink rows.
#pragma once

#include <executorch/runtime/core/span.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "status.h"

namespace lora_share {

class PlannedArena {
 public:
  // Zeroed buffers of `sizes` bytes. calloc: the kernel backs a page only
  // once it is touched, so a long context costs address space until used.
  static StatusOr<std::unique_ptr<PlannedArena>> allocate(const std::vector<size_t>& sizes);

  // Buffer i is the largest buffer i of any of `programs` (each a list of a
  // method's planned buffer sizes).
  static std::vector<size_t> largest(const std::vector<std::vector<size_t>>& programs);

  // Spans for `count` buffers from buffer `first` (at most up to size()),
  // for a HierarchicalAllocator; they stay valid as long as the arena.
  executorch::runtime::Span<executorch::runtime::Span<uint8_t>> spans(size_t count, size_t first = 0);
  // Buffer i (i < size()).
  executorch::runtime::Span<uint8_t> buffer(size_t i) const { return spans_[i]; }

  size_t size() const { return spans_.size(); }
  // Whether buffer i is at least sizes[i] bytes for every i.
  bool holds(const std::vector<size_t>& sizes) const;
  // Bytes allocated (reserved; not necessarily touched).
  size_t total_bytes() const;

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> buffers_;
  std::vector<executorch::runtime::Span<uint8_t>> spans_;
};

}  // namespace lora_share
