// Writes a float32 matrix as a .npy file (format 1.0), readable with
// numpy.load: the same layout as the logits Python's generate() returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

Status write_npy_float32(const std::string& path, const std::vector<float>& data,
                         int64_t rows, int64_t cols);

}  // namespace lora_share
