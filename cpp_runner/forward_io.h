// forward's inputs from plain C++ values, and a method's outputs read back
// into them, with a clear error when the program does not follow the export
// contract: forward(tokens [1, T] int64, input_pos [1] int64) -> logits.
#pragma once

#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/core/evalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

// forward's two inputs. They only borrow `tokens` and `*pos`, which must
// outlive them; the runtime copies them into its planned input buffers.
struct ForwardInputs {
  ForwardInputs(const std::vector<int64_t>& tokens, int64_t* pos);
  executorch::extension::TensorPtr tokens, input_pos;
};

// A constant method's single int64 (get_max_seq_len, get_vocab_size).
StatusOr<int64_t> int_from_output(const executorch::runtime::EValue& value,
                                  const std::string& what);

// forward's float32 [1, vocab] logits, copied into `out`.
Status logits_from_output(const executorch::runtime::EValue& value,
                          int64_t vocab_size, const std::string& what,
                          std::vector<float>* out);

}  // namespace lora_share
