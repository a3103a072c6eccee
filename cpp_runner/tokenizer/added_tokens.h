// The added tokens of a tokenizer.json (special or not), found in the text
// before the model sees it: leftmost-longest matching as the Rust library's
// Aho-Corasick, with its lstrip / rstrip / single_word rules. Tokens with
// normalized=false are matched in the raw text, the others in the
// normalized text (their content normalized too).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "components.h"
#include "regex.h"

namespace lora_share::tok {

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A stretch of text: either an added token's id or text for the model.
struct Segment {
  std::optional<int64_t> id;
  std::string text;
  bool at_start = false;  // begins at offset 0 of its input
};

// One matching set (the raw or the normalized one).
class AddedTokenMatcher {
 public:
  AddedTokenMatcher();
  // `pattern`: what is searched for (the content, or its normalized form).
  void add(const AddedToken& token, const std::string& pattern);
  // After the last add(): orders each bucket longest pattern first.
  void finish();
  bool empty() const { return count_ == 0; }
  // Cuts `text` into added tokens and the text between them (empty text dropped).
  std::vector<Segment> split(const std::string& text, bool at_start) const;

 private:
  struct Entry {
    std::string pattern;
    AddedToken token;
  };
  std::optional<size_t> longest_at(const std::string& text, size_t pos) const;

  std::array<std::vector<Entry>, 256> by_first_byte_;  // each longest pattern first
  size_t count_ = 0;
  Regex word_start_, word_end_;
};

}  // namespace lora_share::tok
