#include "npy_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace lora_share {

Status write_npy_float32(const std::string& path, const std::vector<float>& data,
                         int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + ", " + std::to_string(cols) +
                       "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces
  // and ended by '\n' so the data starts on a 64-byte boundary.
  size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr)
    return Status::failure("--dump-logits " + path + ": " + std::strerror(errno));
  const unsigned char preamble[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  uint16_t len = static_cast<uint16_t>(header.size());
  const unsigned char len_le[2] = {static_cast<unsigned char>(len & 0xff),
                                   static_cast<unsigned char>(len >> 8)};
  // float32 is written in the machine's byte order, which '<f4' declares as
  // little-endian: true of every platform the runner builds for.
  bool ok = std::fwrite(preamble, 1, 8, f) == 8 &&
            std::fwrite(len_le, 1, 2, f) == 2 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return Status::failure("--dump-logits " + path + ": write failed");
  return Status();
}

}  // namespace lora_share
