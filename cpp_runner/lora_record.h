// lora-share's records (schema/lora_share.fbs) as the runner reads them, and
// the CRC-32 of an adapter's seal (lora_share/formats/seal.py).
#pragma once

#include <cstdint>
#include <string>

#include "status.h"

namespace lora_share {

constexpr char kFoundationKey[] = "lora_share.foundation";
constexpr char kAdapterKey[] = "lora_share.adapter";

// lora-share's record found in a file. `present` is false for files
// lora-share did not write (or older builds).
struct Record {
  bool present = false;
  std::string name;         // adapter name (adapters only)
  std::string fingerprint;  // foundation: its own; adapter: the one it needs
  // Adapter seal: file size (0 = not sealed) and the CRC-32 of the file
  // without the record's segment.
  uint64_t content_bytes = 0;
  uint32_t content_crc32 = 0;
};

// Decodes the Metadata flatbuffer at data[start, start + size), bounds-checked;
// `adapter` selects which table is expected. `what` prefixes errors.
Status decode_record(const uint8_t* data, uint64_t start, uint64_t size,
                     bool adapter, const std::string& what, Record* out);

// CRC-32 as zlib computes it (reflected polynomial 0xEDB88320), continuing
// from `crc` (0 to start).
uint32_t crc32(uint32_t crc, const uint8_t* data, uint64_t size);

}  // namespace lora_share
