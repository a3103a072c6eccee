// The bytes each token of a runtime's vocabulary stands for (xgrammar's
// decoded vocabulary), and two filters over them that every constrained
// row's mask also goes through, for what xgrammar 0.2.8 lets through:
//
//   - JSON kinds: tokens with a control byte (0x00-0x1F) are never allowed.
//     Compact JSON has none outside strings and escapes them inside, but
//     xgrammar's strings with minLength/maxLength let them through raw.
//   - every kind: the answer's bytes stay valid UTF-8 (Utf8State). xgrammar
//     matches on bytes and accepts the 3-byte encodings of the surrogates
//     U+D800-DFFF, which no UTF-8 decoder takes; a real model does not emit
//     them, a random one sampled hot does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lora_share::constraint {

struct TokenBytes {
  // `decoded`: by id, the token's bytes ("" for special tokens); `vocab`: the model's ids.
  TokenBytes(std::vector<std::string> decoded, int64_t vocab);

  std::vector<std::string> bytes;
  // Bitmasks in xgrammar's layout (bit i of word i / 32: token i allowed).
  std::vector<int32_t> no_control;     // no byte below 0x20
  std::vector<int32_t> from_boundary;  // its bytes, after a whole character, are UTF-8 (maybe cut at the end)
};

// Where a row's bytes stand in UTF-8: after a whole character, or inside one.
class Utf8State {
 public:
  // Clears from `bitmask` every token whose bytes would not continue the
  // answer as UTF-8 from here.
  void restrict(const TokenBytes& vocab, std::vector<int32_t>& bitmask) const;
  void advance(const std::string& bytes);

 private:
  int need_ = 0;                         // continuation bytes still due
  unsigned char lo_ = 0x80, hi_ = 0xBF;  // the range of the next one
};

}  // namespace lora_share::constraint
