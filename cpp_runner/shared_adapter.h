// The shared loading path: each adapter program is loaded by hand (Program +
// Method) so that all of them resolve their external weights against the ONE
// foundation map (foundation.h) and run in planned memory the session owns
// (planned_arena.h), KV cache included. Loading takes two steps so that the
// session can size one arena for every program before any forward method is
// loaded.
#pragma once

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>

#include <memory>
#include <string>
#include <vector>

#include "adapter.h"
#include "forward_io.h"
#include "foundation.h"
#include "planned_arena.h"

namespace lora_share {

// A method's allocators over planned buffers someone else owns.
struct MethodMemory {
  explicit MethodMemory(
      executorch::runtime::Span<executorch::runtime::Span<uint8_t>> planned);
  executorch::extension::MallocMemoryAllocator method_allocator;
  executorch::extension::MallocMemoryAllocator temp_allocator;
  executorch::runtime::HierarchicalAllocator planned;
  executorch::runtime::MemoryManager manager;
};

class SharedAdapter final : public Adapter {
 public:
  // Step 1: maps and checks `pte`, runs its constant methods and reads the
  // sizes of forward's planned buffers and KV cache.
  Status open(const std::string& pte);
  // The arena buffers forward needs: its KV cache's bytes, then its planned
  // buffers in memory-id order (planned_arena.h says why in that order).
  const std::vector<size_t>& planned_sizes() const { return planned_sizes_; }

  // Step 2: loads forward against `foundation`, in `arena`'s buffers (which
  // must hold planned_sizes() and outlive this adapter, as `foundation` must).
  Status load_forward(PlannedArena& arena, const Foundation& foundation,
                      const executorch::runtime::LoadBackendOptionsMap* backend_options);

  Status step(const std::vector<int64_t>& tokens, int64_t pos,
              std::vector<float>* logits) override;

 private:
  StatusOr<int64_t> run_constant_method(const char* method_name);
  StatusOr<std::vector<executorch::runtime::EValue>> execute_forward(
      const std::vector<executorch::runtime::EValue>& inputs);
  Status explain_load_failure(executorch::runtime::Error error,
                              const Foundation& foundation);

  // Declaration order is destruction order in reverse: the method goes
  // first, then its allocators, then the program, then the file mapping.
  std::unique_ptr<executorch::extension::MmapDataLoader> loader_;
  std::unique_ptr<executorch::runtime::Program> program_;
  std::unique_ptr<KeyRecordingDataMap> data_map_;
  std::vector<size_t> planned_sizes_;
  KvCache kv_;  // its data is arena buffer 0, set by load_forward
  std::unique_ptr<MethodMemory> memory_;
  std::unique_ptr<executorch::runtime::Method> forward_;
};

}  // namespace lora_share
