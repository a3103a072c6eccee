#include "xnnpack_keys.h"

#include <cstring>

#include "flat_reader.h"

namespace lora_share {

namespace {
constexpr uint64_t kHeaderLength = 30;
constexpr int kGraphConstantData = 8;  // XNNGraph slot
constexpr int kConstSize = 1, kConstNamedKey = 2;
}  // namespace

bool xnnpack_named_constants(const uint8_t* data, uint64_t start, uint64_t size, std::map<std::string, uint64_t>* out,
                             std::string* error) {
  uint64_t fb_start = start, fb_size = size;
  bool bare = size >= 8 && std::memcmp(data + start + 4, "XN01", 4) == 0;
  if (!bare) {
    if (size < kHeaderLength || std::memcmp(data + start + 4, "XH00", 4) != 0) {
      *error = "an XNNPACK payload has no XH00 header";
      return false;
    }
    uint16_t length;
    uint32_t offset, fb_len;
    std::memcpy(&length, data + start + 8, 2);
    std::memcpy(&offset, data + start + 10, 4);
    std::memcpy(&fb_len, data + start + 14, 4);
    if (length < kHeaderLength || offset < length || offset > size || fb_len > size - offset) {
      *error = "an XNNPACK payload's flatbuffer lies outside the payload";
      return false;
    }
    fb_start = start + offset;
    fb_size = fb_len;
  }
  FlatReader fb(data, fb_start, fb_start + fb_size);
  if (!fb.failed() && fb.identifier() != "XN01") fb.fail("an XNNPACK payload's flatbuffer is not XN01");
  FlatReader::Table graph = fb.root("XNNGraph");
  FlatReader::Vector constants = fb.vector(graph, kGraphConstantData, 4);
  for (uint32_t i = 0; i < constants.count && !fb.failed(); ++i) {
    FlatReader::Table c = fb.table_at(constants, i, "ConstantDataOffset");
    std::string key = fb.string(c, kConstNamedKey);
    uint64_t bytes = fb.u64(c, kConstSize);
    if (!key.empty() && !fb.failed()) {
      uint64_t& need = (*out)[key];
      if (bytes > need) need = bytes;
    }
  }
  if (fb.failed()) {
    *error = fb.error();
    return false;
  }
  return true;
}

}  // namespace lora_share
