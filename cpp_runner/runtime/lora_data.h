// An adapter's LoRA weights, as its program's inputs.
//
// A deployment's program takes LoRA on every slot (layer, linear) of its
// envelope as forward inputs (lora_share/model/decoder.py): after the tokens and the
// KV slabs come A [r, in] and B [out, r] of slot 0, of slot 1, ..., with
// 1 <= r <= the envelope's largest rank, a dynamic size of its own. So one
// loaded program serves every adapter of the deployment, and an adapter is
// only data: its record (lora_record.h) names the sha256 key of each of its
// tensors, found in its .pte's own named data (mapped here, read in place: its
// pages are the adapter's only memory) or in adapters_shared.ptd. A slot the
// adapter leaves alone gets a zero pair of rank 1, views of one zero buffer
// its program keeps for all its adapters.
#pragma once

#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/core/freeable_buffer.h>
#include <executorch/runtime/core/named_data_map.h>
#include <executorch/runtime/executor/method_meta.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "file_check.h"
#include "foundation.h"
#include "status.h"

namespace lora_share {

// One envelope slot's inputs: A [max_rank, in], B [out, max_rank] at most.
struct LoraShape {
  int64_t in = 0, out = 0, max_rank = 0;
};

// The shapes of forward's LoRA inputs: its last 2 * `slots` inputs, two per
// slot (the record's envelope size). Refuses a program whose inputs are not
// float32 [max_rank, in] / [out, max_rank] pairs.
StatusOr<std::vector<LoraShape>> read_lora_shapes(const executorch::runtime::MethodMeta& forward, size_t slots,
                                                  const std::string& pte);

class LoraData {
 public:
  struct Slot {
    int64_t rank = 0;  // 0: the adapter has no LoRA here
    const float* a = nullptr;
    const float* b = nullptr;
  };

  // Maps `pte` and finds every tensor its record (`info`) names: in its own
  // named data, else in `data`'s adapters_shared.ptd, each with the bytes its
  // rank and `shapes` need (never fewer: nothing is read past).
  static StatusOr<std::unique_ptr<LoraData>> open(const std::string& pte, const PteInfo& info, const Foundation& data,
                                                  const std::vector<LoraShape>& shapes);
  // One term of a mix: an adapter's data and the factor its B is scaled by.
  struct Term {
    const LoraData* data;
    double scale;
  };
  // A mix of adapters as one adapter's data, in memory of its own (the terms'
  // files may be unmapped after): on each slot, the terms' A stacked along the
  // rank in term order and their B, each scaled by its term's scale, stacked
  // alike. Each B already carries its adapter's LoRA scale, so this is peft's
  // add_weighted_adapter(combination_type="cat"). A failure names the slot
  // whose summed rank exceeds what `shapes` take (`names`: the envelope's
  // slots, as "q_proj in layer 3").
  static StatusOr<std::unique_ptr<LoraData>> compose(const std::vector<Term>& terms,
                                                     const std::vector<LoraShape>& shapes,
                                                     const std::vector<std::string>& names);
  ~LoraData();
  LoraData(const LoraData&) = delete;
  LoraData& operator=(const LoraData&) = delete;

  // By envelope slot, in forward's input order.
  const std::vector<Slot>& slots() const { return slots_; }
  // Bytes of the tensors read from the .pte itself (hoisted ones excluded);
  // a mix's: all of its tensors.
  uint64_t own_bytes() const { return own_bytes_; }

 private:
  LoraData() = default;
  const uint8_t* map_ = nullptr;
  uint64_t map_size_ = 0;
  uint64_t map_offset_ = 0;  // the file offset map_ starts at (a page boundary)
  std::vector<executorch::runtime::FreeableBuffer> shared_;
  std::vector<Slot> slots_;
  uint64_t own_bytes_ = 0;
  std::vector<float> composed_;  // a mix's tensors (compose), which slots_ point into
};

// forward's LoRA inputs for `data` (null: no adapter, every slot zero):
// tensors over its mapped weights, or over `zeros` (at least the largest in
// or out of `shapes` floats, all zero) where it has no LoRA. Made once per
// adapter and handed to every call: set_input points the method at them.
std::vector<executorch::extension::TensorPtr> lora_input_tensors(const LoraData* data,
                                                                 const std::vector<LoraShape>& shapes,
                                                                 const float* zeros);

// The floats of zeros every slot's zero pair needs: the largest in or out.
size_t zero_floats_needed(const std::vector<LoraShape>& shapes);

}  // namespace lora_share
