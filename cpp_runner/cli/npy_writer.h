// .npy files (format 1.0) and .npz archives of them, readable with
// numpy.load: the logits of --dump-logits, and the outputs of a program's
// forward (--output).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

// A tensor to write: numpy's dtype string ('<f4', '<i8', ...), shape, bytes.
struct NpyTensor {
  std::string descr;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// The bytes of a .npy file holding `t`.
std::string npy_bytes(const NpyTensor& t);

Status write_npy_float32(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols);

// One tensor as .npy, several as .npz (output_0.npy, output_1.npy, ...),
// written to a temporary file and renamed: whole or not at all. `flag`
// names the path in errors.
Status write_tensors(const std::string& path, const std::vector<NpyTensor>& tensors, const std::string& flag);

}  // namespace lora_share
