#include "lora_record.h"

#include "flat_reader.h"

namespace lora_share {

namespace {
// 2: adapter records name their program, its envelope and their LoRA keys.
constexpr uint32_t kMetadataVersion = 2;
}  // namespace

Status decode_record(const uint8_t* data, uint64_t start, uint64_t size, bool adapter, const std::string& what,
                     Record* out) {
  FlatReader fb(data, start, start + size);
  if (!fb.failed() && fb.identifier() != "LSM1") fb.fail("identifier is not LSM1");
  FlatReader::Table root = fb.root("Metadata");
  uint32_t version = fb.u32(root, 0);
  FlatReader::Table body = fb.table(root, adapter ? 2 : 1, adapter ? "Adapter" : "Foundation");
  if (!fb.failed() && version < kMetadataVersion)
    fb.fail("written by an older lora-share (record version " + std::to_string(version) + ", this runner reads " +
            std::to_string(kMetadataVersion) + "): rebuild it with this version");
  else if (!fb.failed() && version != kMetadataVersion)
    fb.fail("lora-share metadata version " + std::to_string(version) + ", this runner reads " +
            std::to_string(kMetadataVersion));
  if (!fb.failed() && !body.present) fb.fail("the record has no body");
  if (adapter) {
    out->name = fb.string(body, 0);
    out->fingerprint = fb.string(body, 1);
    out->content_bytes = fb.u64(body, 11);
    out->content_crc32 = fb.u32(body, 12);
    out->program_sha256 = fb.string(body, 13);
    out->envelope_max_rank = fb.u32(body, 14);
    FlatReader::Vector envelope = fb.vector(body, 15, 4);
    for (uint32_t i = 0; i < envelope.count && !fb.failed(); ++i) {
      FlatReader::Table t = fb.table_at(envelope, i, "EnvelopeSlot");
      out->envelope.push_back({fb.u32(t, 0), fb.string(t, 1)});
    }
    FlatReader::Vector lora = fb.vector(body, 16, 4);
    for (uint32_t i = 0; i < lora.count && !fb.failed(); ++i) {
      FlatReader::Table t = fb.table_at(lora, i, "LoraTensors");
      LoraKeys keys{fb.u32(t, 0), fb.u32(t, 1), fb.string(t, 2), fb.string(t, 3)};
      if (!fb.failed() && (keys.slot >= out->envelope.size() || keys.rank == 0 || keys.rank > out->envelope_max_rank))
        fb.fail("LoRA tensors of slot " + std::to_string(keys.slot) + " at rank " + std::to_string(keys.rank) +
                " do not fit its envelope of " + std::to_string(out->envelope.size()) + " slots, ranks 1.." +
                std::to_string(out->envelope_max_rank));
      out->lora.push_back(std::move(keys));
    }
    FlatReader::Vector patches = fb.vector(body, 19, 4);
    if (!fb.failed() && patches.count % 5 != 0)
      fb.fail(std::to_string(patches.count) + " slot patch values, not a multiple of 5");
    for (uint32_t i = 0; i + 4 < patches.count && !fb.failed(); i += 5) {
      SlotPatch p{fb.u32_at(patches, i), fb.u32_at(patches, i + 1), fb.u32_at(patches, i + 2),
                  fb.u32_at(patches, i + 3), fb.u32_at(patches, i + 4)};
      if (p.slot >= out->envelope.size())
        fb.fail("a slot patch names slot " + std::to_string(p.slot) + " of an envelope of " +
                std::to_string(out->envelope.size()) + " slots");
      out->slot_patches.push_back(p);
    }
  } else {
    out->fingerprint = fb.string(body, 0);
  }
  if (fb.failed())
    return Status::failure(what + ": bad lora-share record (" + (adapter ? kAdapterKey : kFoundationKey) +
                           "): " + fb.error());
  out->present = true;
  return Status();
}

uint32_t crc32(uint32_t crc, const uint8_t* data, uint64_t size) {
  static uint32_t table[256];
  static bool ready = false;
  if (!ready) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    ready = true;
  }
  crc = ~crc;
  for (uint64_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

}  // namespace lora_share
