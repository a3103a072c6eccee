// The shared loading path: a deployment's program is loaded by hand
// (Program + Method) once per process, resolving its external weights
// against the ONE foundation map (foundation.h) and running in planned memory
// the adapter pool owns (planned_arena.h), KV cache included. Each adapter is its
// LoRA data (lora_data.h) bound to that program: the program's LoRA inputs
// point at the adapter's mapped tensors, so another adapter costs its own
// bytes. Loading a program takes two steps so that the pool can size one
// arena for every program before any forward method is loaded.
#pragma once

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "adapter.h"
#include "forward_io.h"
#include "foundation.h"
#include "lora_data.h"
#include "planned_arena.h"
#include "program_variants.h"

namespace lora_share {

// A method's allocators over planned buffers someone else owns.
struct MethodMemory {
  explicit MethodMemory(executorch::runtime::Span<executorch::runtime::Span<uint8_t>> planned);
  executorch::extension::MallocMemoryAllocator method_allocator;
  executorch::extension::MallocMemoryAllocator temp_allocator;
  executorch::runtime::HierarchicalAllocator planned;
  executorch::runtime::MemoryManager manager;
};

// The sizes of `method_name`'s planned buffers, in memory-id order.
StatusOr<std::vector<size_t>> planned_buffer_sizes(const executorch::runtime::Program& program,
                                                   const char* method_name);

// One loaded program, shared by every adapter whose record names it.
class SharedProgram {
 public:
  // Step 1: maps and checks `pte` (any adapter file that carries the
  // program), runs its constant methods and reads the sizes of its methods'
  // planned buffers, its KV cache and its `lora_slots` LoRA input pairs.
  // `kv_slots` N > 1: the KV buffer holds N slots (decode_batch's pools,
  // forward_io.h's KvCache) and decode_batch is loaded too, when the program
  // has it (batch/batch_engine.h runs it); N = 1: one cache, and decode_batch
  // only with `drafts` and a decode_batch that takes them (exporter revision
  // 14): a runtime of one slot verifies its drafts in it (docs/batching.md).
  Status open(const std::string& pte, size_t lora_slots, size_t kv_slots = 1, bool drafts = false);
  // The arena buffers the methods need: the KV cache's bytes (all slots), then
  // each planned buffer (memory-id order, planned_arena.h says why) at the
  // largest of forward's, decode's and decode_batch's sizes: one call runs at
  // a time, so the methods take turns in the same buffers.
  const std::vector<size_t>& planned_sizes() const { return planned_sizes_; }

  // Step 2: loads forward (and decode, decode_batch when opened for them) against
  // `foundation`, in `arena`'s buffers (which must hold planned_sizes() and
  // outlive this program, as `foundation` must).
  Status load_methods(PlannedArena& arena, const Foundation& foundation,
                      const executorch::runtime::LoadBackendOptionsMap* backend_options);

  // One call with an adapter's LoRA inputs (lora_input_tensors): decode for
  // one token when the program has it (its attention is one lora_share::attend
  // kernel per layer, which reads the cache in place), forward otherwise;
  // `absent`: the envelope slots the adapter leaves alone, which the call
  // skips when the program's slot table allows (program_variants.h);
  // `adapter_pte` names the adapter in errors.
  Status step(const std::vector<executorch::extension::TensorPtr>& lora, const SlotMask& absent,
              const std::vector<int64_t>& tokens, int64_t pos, std::vector<float>* logits,
              const std::string& adapter_pte);
  // step over `cache` (a slot of kv(): kv().at_slot(n)); `what` names the call in errors.
  Status step_in(const KvCache& cache, const std::vector<executorch::extension::TensorPtr>& lora,
                 const SlotMask& absent, const std::vector<int64_t>& tokens, int64_t pos, std::vector<float>* logits,
                 const std::string& what);
  // decode_batch on `inputs` (in its input order), skipping the slots `absent`
  // (those no row has); its outputs, valid until the next call.
  StatusOr<std::vector<executorch::runtime::EValue>> run_batch(const std::vector<executorch::runtime::EValue>& inputs,
                                                               const SlotMask& absent);

  // The table of every slot's rewrites (an adapter record's slot_patches),
  // before the first call; the budget's say on each variant method
  // (program_variants.h).
  void set_slot_patches(const std::vector<SlotPatch>& patches) { variants_.set_table(patches, lora_shapes_.size()); }
  void set_variant_budget(std::function<bool(uint64_t)> fits, uint64_t method_bytes) {
    variants_.set_budget(std::move(fits), method_bytes);
  }
  // Variants' accounted bytes, dropping them all, and what they did.
  uint64_t variant_bytes() const { return variants_.bytes(); }
  void drop_variants() { variants_.clear(); }
  VariantStats variant_stats() const { return variants_.stats(); }

  const std::string& pte() const { return pte_path_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t prefill_chunk() const { return prefill_chunk_; }
  // Whether the program has a decode method (programs before EXPORTER_REVISION 9 do not).
  bool has_decode() const { return has_decode_; }
  // Whether the file has decode_batch (EXPORTER_REVISION 11 and later builds),
  // and whether it was opened with it (kv_slots > 1, or one slot for drafts).
  bool file_has_batch() const { return file_has_batch_; }
  bool has_batch() const { return has_batch_; }
  // decode_batch's input and output metadata (has_batch() only).
  executorch::runtime::MethodMeta batch_meta() const;
  size_t kv_slots() const { return kv_.pool_slots; }
  // The KV cache: slot 0 of kv_slots() pools (valid once loaded).
  const KvCache& kv() const { return kv_; }
  double load_ms() const { return load_ms_; }
  const std::vector<LoraShape>& lora_shapes() const { return lora_shapes_; }
  // Zeros for the LoRA slots an adapter leaves alone: one buffer for all.
  const float* zeros() const { return zeros_.data(); }

 private:
  StatusOr<int64_t> run_constant_method(const char* method_name);
  // The method of `kind` to run for a call that leaves `absent` alone: a
  // variant's, or the whole program's.
  executorch::runtime::Method& pick(MethodKind kind, const SlotMask& absent);
  StatusOr<std::vector<executorch::runtime::EValue>> execute(executorch::runtime::Method& method,
                                                             const std::vector<executorch::runtime::EValue>& inputs,
                                                             const std::string& what);
  Status explain_load_failure(executorch::runtime::Error error, const Foundation& foundation);

  std::string pte_path_;
  int64_t vocab_size_ = 0, max_seq_len_ = 0, prefill_chunk_ = 0;
  double load_ms_ = 0;
  std::vector<LoraShape> lora_shapes_;
  std::vector<float> zeros_;
  // Declaration order is destruction order in reverse: the method goes
  // first, then its allocators, then the program, then the file mapping.
  std::unique_ptr<executorch::extension::MmapDataLoader> loader_;
  std::unique_ptr<executorch::runtime::Program> program_;
  std::unique_ptr<KeyRecordingDataMap> data_map_;
  std::vector<size_t> planned_sizes_;
  bool has_decode_ = false, file_has_batch_ = false, has_batch_ = false;
  KvCache kv_;  // its data is arena buffer 0, set by load_methods
  std::unique_ptr<MethodMemory> memory_, decode_memory_, batch_memory_;
  std::unique_ptr<executorch::runtime::Method> forward_, decode_, batch_;
  // Where variants load (set by load_methods); they go before everything above.
  ProgramVariants::LoadContext variant_context_;
  ProgramVariants variants_;
};

// An adapter of a loaded program: its LoRA data, bound to the program's inputs.
class SharedAdapter final : public Adapter {
 public:
  // `program` must outlive the adapter. Its name is `name`, or the file stem
  // of `pte` when empty; null `data` is the foundation alone (every LoRA
  // input a zero rank-1 pair), then `pte` is the program's file.
  SharedAdapter(const std::string& pte, SharedProgram* program, std::unique_ptr<LoraData> data, double load_ms,
                const std::string& name = "");
  Status step(const std::vector<int64_t>& tokens, int64_t pos, std::vector<float>* logits) override;
  void clear_rows(int64_t positions) override;  // of the program's cache (slot 0)
  // Its program and LoRA data (null: the foundation alone), for a BatchEngine row.
  SharedProgram* program() const { return program_; }
  const LoraData* lora_data() const { return data_.get(); }

 private:
  SharedProgram* program_;
  std::unique_ptr<LoraData> data_;
  std::vector<executorch::extension::TensorPtr> lora_;  // over data_'s tensors
  SlotMask absent_;                                     // the slots data_ leaves alone
};

}  // namespace lora_share
