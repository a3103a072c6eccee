// Reads a .npy file (format 1.0-3.0, C order, little-endian) into a tensor
// for a program's forward (--input).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

struct NpyArray {
  std::string descr;  // numpy's dtype string, e.g. '<f4'
  int32_t dtype = 0;  // its ExecuTorch ScalarType code (lora_share.h, ls_tensor)
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// `flag` names the file in errors: one message for a file that is not a
// .npy of plain numbers, is Fortran-ordered, big-endian or truncated, or
// declares more data than it holds or than memory can. The header is checked
// before any data is read, and no byte past the data it declares is read: a
// pipe or device (/dev/zero, a FIFO) included. Never throws or aborts.
StatusOr<NpyArray> read_npy(const std::string& path, const std::string& flag);

// numpy's dtype string for an ExecuTorch ScalarType code ("" if none).
std::string npy_descr(int32_t dtype);

}  // namespace lora_share
