// Reading a method's outputs into plain C++ values, with a clear error when
// the program does not follow the export contract.
#pragma once

#include <executorch/runtime/core/evalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

// A constant method's single int64 (get_max_seq_len, get_vocab_size).
StatusOr<int64_t> int_from_output(const executorch::runtime::EValue& value,
                                  const std::string& what);

// forward's float32 [1, vocab] logits, copied into `out`.
Status logits_from_output(const executorch::runtime::EValue& value,
                          int64_t vocab_size, const std::string& what,
                          std::vector<float>* out);

}  // namespace lora_share
