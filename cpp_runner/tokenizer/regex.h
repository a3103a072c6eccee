// A compiled PCRE2 pattern (UTF + Unicode properties), the engine the
// tokenizer uses for the Oniguruma patterns of tokenizer.json: PCRE2 has the
// look-ahead `\s+(?!\S)` the GPT-2 / Llama 3 split patterns rely on.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "status.h"

namespace lora_share::tok {

class Regex {
 public:
  // `where` names the file and key for the error message.
  static StatusOr<Regex> compile(const std::string& pattern, const std::string& where);
  // A pattern matching `text` literally.
  static StatusOr<Regex> literal(const std::string& text, const std::string& where);

  // Every non-overlapping match, left to right, as [start, end) byte offsets.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject) const;
  // True when the pattern matches somewhere in `subject`.
  bool search(std::string_view subject) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8, freed by its deleter
};

}  // namespace lora_share::tok
