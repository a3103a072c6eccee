// forward's inputs from plain C++ values, and a method's outputs read back
// into them, with a clear error when the program does not follow the export
// contract: forward(tokens [1, T] int64, cache_positions [P + T] int64) ->
// logits, feeding T tokens at positions P.. (lora_share/model.py).
#pragma once

#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/core/evalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

// forward's two inputs for `tokens` at positions pos, pos + 1, ...:
// the ids, and cache_positions = 0 .. pos + T - 1, whose length is the number
// of cache slots attended. The ids are borrowed (they must outlive this); the
// runtime copies both into its planned input buffers.
struct ForwardInputs {
  ForwardInputs(const std::vector<int64_t>& tokens, int64_t pos);
  std::vector<int64_t> positions;
  executorch::extension::TensorPtr tokens, cache_positions;
};

// The refusal for a program without get_prefill_chunk: exported before the
// forward(tokens, cache_positions) contract, so no input this runner builds fits it.
Status pre_chunk_program(const std::string& pte);

// A constant method's single int64 (get_max_seq_len, get_vocab_size).
StatusOr<int64_t> int_from_output(const executorch::runtime::EValue& value,
                                  const std::string& what);

// forward's float32 [1, vocab] logits, copied into `out`.
Status logits_from_output(const executorch::runtime::EValue& value,
                          int64_t vocab_size, const std::string& what,
                          std::vector<float>* out);

}  // namespace lora_share
