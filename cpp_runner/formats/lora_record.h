// lora-share's records (schema/lora_share.fbs) as the runner reads them, and
// the CRC-32 of an adapter's seal (lora_share/formats/seal.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

constexpr char kFoundationKey[] = "lora_share.foundation";
constexpr char kAdapterKey[] = "lora_share.adapter";

// One slot of a program's LoRA envelope: a linear of one layer whose A and B
// are two inputs of forward.
struct EnvelopeSlot {
  uint32_t layer = 0;
  std::string target;
};

// An adapter's LoRA on one envelope slot: the sha256 keys of A [rank, in] and
// B [out, rank] (float32), in its .pte's named data or adapters_shared.ptd.
struct LoraKeys {
  uint32_t slot = 0;
  uint32_t rank = 0;
  std::string a, b;
};

// One rewrite of the table that makes an envelope slot's LoRA nodes dead code
// in the program's XNNPACK payloads (schema/FORMAT.md, "slot_patches";
// lora_share/formats/xnnpack_prune.py): the 4-byte word at `offset` in program
// segment `segment` holds value id `old_value`, and a variant that skips the
// slot holds `new_value` there.
struct SlotPatch {
  uint32_t slot = 0, segment = 0, offset = 0, old_value = 0, new_value = 0;
};

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
  // Adapters only: the program the file carries (every adapter of a
  // deployment carries the same one), its LoRA envelope in forward's input
  // order, and the slots this adapter has.
  std::string program_sha256;
  uint32_t envelope_max_rank = 0;
  std::vector<EnvelopeSlot> envelope;
  std::vector<LoraKeys> lora;
  // Every envelope slot's rewrites (empty in older files, and in files whose
  // program already skips the adapter's absent slots: lora_envelope.skip_absent).
  std::vector<SlotPatch> slot_patches;
};

// Decodes the Metadata flatbuffer at data[start, start + size), bounds-checked;
// `adapter` selects which table is expected. `what` prefixes errors.
Status decode_record(const uint8_t* data, uint64_t start, uint64_t size, bool adapter, const std::string& what,
                     Record* out);

// CRC-32 as zlib computes it (reflected polynomial 0xEDB88320), continuing
// from `crc` (0 to start).
uint32_t crc32(uint32_t crc, const uint8_t* data, uint64_t size);

}  // namespace lora_share
