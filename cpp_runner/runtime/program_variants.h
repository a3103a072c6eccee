// The LoRA slots a call leaves alone, as dead code: variants of a loaded
// program, made at run time.
//
// Why: a deployment's one program takes LoRA on every slot of its envelope
// (lora_share/model/envelope.py), and computes every slot on every token: a
// slot the adapter leaves alone gets a zero rank-1 pair, which adds nothing
// but still costs its XNNPACK nodes (three in forward and decode, five in
// decode_batch), a threadpool hand-off among them. Through an all-linear
// rank-16 envelope a q/v adapter would decode at 0.72-0.74x its
// exact-recipe program (issue 60).
//
// How: every adapter record carries the program's table of rewrites that make
// each slot's nodes dead code (schema/FORMAT.md, "slot_patches"; computed by
// lora_share/formats/xnnpack_prune.py). A variant for a set of slots is the
// same program loaded again through SkippingLoader, which hands ExecuTorch
// each XNNPACK payload those slots' rewrites touch as a patched copy; XNNPACK's
// subgraph optimizer then drops the dead nodes when the delegate creates its
// runtime. The variant's methods read the same foundation weights (XNNPACK's
// weight cache packs each once for the process), run in the same planned
// memory (one call at a time) over the same KV cache, and take the same
// inputs: a caller picks the variant of the slots its call (a request, or
// every row of a batched step) leaves alone and feeds it as the whole program.
// Its outputs are the whole program's, bit for bit (the skipped slots add
// exact zeros there).
//
// A variant is made on first use (a fraction of a second; its payloads only
// are copied) and kept, up to kMaxVariants per program (the least recently
// used goes first). One that cannot be made (the memory budget has no room,
// or a load fails) leaves the call on the whole program, which is always
// correct; stats() counts both.
#pragma once

#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/core/data_loader.h>
#include <executorch/runtime/core/named_data_map.h>
#include <executorch/runtime/executor/method.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lora_data.h"
#include "lora_record.h"
#include "planned_arena.h"
#include "status.h"

namespace lora_share {

// A program's methods that take LoRA inputs.
enum class MethodKind : int { kForward = 0, kDecode = 1, kBatch = 2 };
inline constexpr int kMethodKinds = 3;
const char* method_name(MethodKind kind);

// Envelope slots, by index: true where a call leaves the slot alone.
using SlotMask = std::vector<bool>;

// A DataLoader over `base` (the program's file) that applies `patches` to the
// program segments they name, each time such a segment is loaded: a copy of
// the segment, patched, which the caller frees as usual. A patch whose word
// does not hold the value it expects fails the load (the record does not
// belong to this program).
class SkippingLoader final : public executorch::runtime::DataLoader {
 public:
  SkippingLoader(const executorch::runtime::DataLoader* base, std::vector<SlotPatch> patches);
  executorch::runtime::Result<executorch::runtime::FreeableBuffer> load(size_t offset, size_t size,
                                                                        const SegmentInfo& segment_info) const override;
  executorch::runtime::Result<size_t> size() const override;

 private:
  const executorch::runtime::DataLoader* base_;
  std::vector<SlotPatch> patches_;
};

struct VariantStats {
  uint64_t made = 0;      // variant methods loaded
  uint64_t refused = 0;   // not made: the memory budget had no room
  uint64_t failed = 0;    // not made: the load failed (the whole program ran)
  uint64_t resident = 0;  // variants kept now
  std::string last_error;
};

class ProgramVariants {
 public:
  static constexpr size_t kMaxVariants = 4;

  // What every variant's methods load against: the program's own.
  struct LoadContext {
    const executorch::runtime::DataLoader* file = nullptr;  // the program's .pte
    PlannedArena* arena = nullptr;                          // planned buffers from index 1
    size_t planned_buffers = 0;
    executorch::runtime::NamedDataMap* data_map = nullptr;
    const executorch::runtime::LoadBackendOptionsMap* backend_options = nullptr;
  };

  ProgramVariants();
  ~ProgramVariants();
  ProgramVariants(const ProgramVariants&) = delete;
  ProgramVariants& operator=(const ProgramVariants&) = delete;

  // The table of every slot's rewrites (an adapter record's slot_patches) for
  // an envelope of `slots` slots; the first non-empty table is kept (every
  // adapter of a program carries the same).
  void set_table(const std::vector<SlotPatch>& patches, size_t slots);
  // `fits(bytes)`: whether the memory budget has room for `bytes` more; each
  // variant method is accounted at `method_bytes`.
  void set_budget(std::function<bool(uint64_t)> fits, uint64_t method_bytes);

  // The slots of `absent` whose nodes the table can skip: a variant's key
  // (all false: the whole program is that variant).
  SlotMask skippable(const SlotMask& absent) const;
  // Method `kind` of the variant whose key is `key`, made or loaded on first
  // use; null when it cannot be (the caller runs the whole program).
  executorch::runtime::Method* method(MethodKind kind, const SlotMask& key, const LoadContext& context);

  // Every variant dropped (the pool makes room; the program is unloaded).
  void clear();
  // Accounted bytes: method_bytes per loaded variant method.
  uint64_t bytes() const;
  VariantStats stats() const;

 private:
  struct Variant;
  StatusOr<Variant*> variant(const SlotMask& key, const LoadContext& context);

  std::vector<std::vector<SlotPatch>> by_slot_;
  std::function<bool(uint64_t)> fits_;
  uint64_t method_bytes_ = 0;
  uint64_t clock_ = 0;
  VariantStats stats_;
  std::vector<std::unique_ptr<Variant>> variants_;
};

// The slots `lora` leaves alone (null: every slot).
SlotMask absent_slots(const LoraData* lora, size_t slots);

}  // namespace lora_share
