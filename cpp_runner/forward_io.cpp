// What both adapter implementations share: forward's inputs, the program's outputs.
#include "forward_io.h"

#include <cstring>
#include <numeric>

namespace lora_share {

using executorch::aten::ScalarType;
using executorch::runtime::EValue;

ForwardInputs::ForwardInputs(const std::vector<int64_t>& token_ids, int64_t pos)
    : positions(static_cast<size_t>(pos) + token_ids.size()),
      tokens(executorch::extension::make_tensor_ptr(
          {1, static_cast<int32_t>(token_ids.size())},
          const_cast<int64_t*>(token_ids.data()), ScalarType::Long)) {
  std::iota(positions.begin(), positions.end(), int64_t{0});
  cache_positions = executorch::extension::make_tensor_ptr(
      {static_cast<int32_t>(positions.size())}, positions.data(), ScalarType::Long);
}

Status pre_chunk_program(const std::string& pte) {
  return Status::failure(pte +
                         ": built by an older lora-share (its forward takes input_pos, not "
                         "cache_positions): rebuild it with this version");
}

StatusOr<int64_t> int_from_output(const EValue& value,
                                  const std::string& what) {
  if (value.isInt()) return value.toInt();
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    if (t.numel() == 1 && t.scalar_type() == ScalarType::Long)
      return t.const_data_ptr<int64_t>()[0];
    if (t.numel() == 1 && t.scalar_type() == ScalarType::Int)
      return static_cast<int64_t>(t.const_data_ptr<int32_t>()[0]);
  }
  return Status::failure(what + " did not return one integer");
}

Status logits_from_output(const EValue& value, int64_t vocab_size,
                          const std::string& what, std::vector<float>* out) {
  if (!value.isTensor())
    return Status::failure(what + " did not return a tensor");
  const auto& t = value.toTensor();
  if (t.scalar_type() != ScalarType::Float)
    return Status::failure(what + " returned a non-float32 tensor");
  if (t.numel() != vocab_size)
    return Status::failure(what + " returned " + std::to_string(t.numel()) +
                           " values; expected vocab_size " +
                           std::to_string(vocab_size));
  out->resize(static_cast<size_t>(vocab_size));
  std::memcpy(out->data(), t.const_data_ptr<float>(),
              out->size() * sizeof(float));
  return Status();
}

}  // namespace lora_share
