#include "token_bytes.h"

namespace lora_share::constraint {
namespace {

// One byte through UTF-8's well-formed sequences (Unicode table 3-7): `need` continuation bytes
// still due, the next one in [lo, hi]. False: the byte cannot come here.
bool step(unsigned char b, int& need, unsigned char& lo, unsigned char& hi) {
  if (need > 0) {
    if (b < lo || b > hi) return false;
    --need;
    lo = 0x80, hi = 0xBF;
    return true;
  }
  if (b < 0x80) return true;
  if (b >= 0xC2 && b <= 0xDF) return need = 1, true;
  if (b == 0xE0) return need = 2, lo = 0xA0, true;
  if (b == 0xED) return need = 2, hi = 0x9F, true;  // not the surrogates
  if (b >= 0xE1 && b <= 0xEF) return need = 2, true;
  if (b == 0xF0) return need = 3, lo = 0x90, true;
  if (b == 0xF4) return need = 3, hi = 0x8F, true;
  if (b >= 0xF1 && b <= 0xF3) return need = 3, true;
  return false;  // a continuation byte out of place, C0, C1, F5..FF
}

bool continues(const std::string& bytes, int need, unsigned char lo, unsigned char hi) {
  for (char c : bytes)
    if (!step(static_cast<unsigned char>(c), need, lo, hi)) return false;
  return true;
}

void clear(std::vector<int32_t>& mask, size_t id) { mask[id / 32] &= ~static_cast<int32_t>(1u << (id % 32)); }

}  // namespace

TokenBytes::TokenBytes(std::vector<std::string> decoded, int64_t vocab)
    : bytes(std::move(decoded)),
      no_control(static_cast<size_t>((vocab + 31) / 32), -1),
      from_boundary(static_cast<size_t>((vocab + 31) / 32), -1) {
  for (size_t id = 0; id < bytes.size(); ++id) {
    for (char c : bytes[id])
      if (static_cast<unsigned char>(c) < 0x20) clear(no_control, id);
    if (!continues(bytes[id], 0, 0x80, 0xBF)) clear(from_boundary, id);
  }
}

void Utf8State::restrict(const TokenBytes& vocab, std::vector<int32_t>& bitmask) const {
  if (need_ == 0) {
    for (size_t w = 0; w < bitmask.size(); ++w) bitmask[w] &= vocab.from_boundary[w];
    return;
  }
  // Inside a character (rare: text outside ASCII): each allowed token checked from here.
  for (size_t w = 0; w < bitmask.size(); ++w) {
    if (bitmask[w] == 0) continue;
    for (size_t id = w * 32; id < w * 32 + 32 && id < vocab.bytes.size(); ++id)
      if (((static_cast<uint32_t>(bitmask[w]) >> (id % 32)) & 1u) && !continues(vocab.bytes[id], need_, lo_, hi_))
        clear(bitmask, id);
  }
}

void Utf8State::advance(const std::string& bytes) {
  for (char c : bytes)
    if (!step(static_cast<unsigned char>(c), need_, lo_, hi_)) need_ = 0, lo_ = 0x80, hi_ = 0xBF;
}

}  // namespace lora_share::constraint
