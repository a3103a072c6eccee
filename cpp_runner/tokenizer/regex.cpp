#include "regex.h"

#include <algorithm>

#include "utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace lora_share::tok {

namespace {

pcre2_code* code_of(const std::shared_ptr<void>& p) { return static_cast<pcre2_code*>(p.get()); }

// tokenizer.json patterns are written for Oniguruma, whose \s is \t-\r,
// space, U+0085 and the Z categories; PCRE2's \s (UCP) also takes U+180E, so
// the class is spelled out. Inside a class the items are inlined; outside
// they get brackets. (\S inside a class is left to PCRE2.)
std::string onig_compatible(const std::string& pattern) {
  static const std::string kSpace = "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\p{Z}";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char n = pattern[i + 1];
      if (n == 's') {
        out += in_class ? kSpace : "[" + kSpace + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + kSpace + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class)
      in_class = true;
    else if (c == ']' && in_class)
      in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

StatusOr<Regex> Regex::compile(const std::string& pattern, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  std::string translated = onig_compatible(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error, buffer, sizeof(buffer));
    return Status::failure(where + ": regex " + pattern + " does not compile (" + reinterpret_cast<char*>(buffer) +
                           " at offset " + std::to_string(offset) + ")");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is the fallback
  Regex r;
  r.code_ = std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
  return r;
}

StatusOr<Regex> Regex::literal(const std::string& text, const std::string& where) {
  // \Q...\E quotes everything but a literal "\E", which is split out of the quote.
  std::string quoted = "\\Q";
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "\\E") == 0) {
      quoted += "\\E\\\\E\\Q";
      ++i;
    } else {
      quoted += text[i];
    }
  }
  quoted += "\\E";
  return compile(quoted, where);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view subject) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_code* code = code_of(code_);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(pcre2_match_data_create_from_pattern(code, nullptr),
                                                                    pcre2_match_data_free);
  auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  uint32_t options = 0;
  while (start <= subject.size()) {
    int rc = pcre2_match(code, s, subject.size(), start, options | PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc < 0) {
      if (options == 0) break;
      // No non-empty match here after an empty one: step over one character.
      options = 0;
      if (start >= subject.size()) break;
      start += std::min(utf8_char_len(static_cast<unsigned char>(subject[start])), subject.size() - start);
      continue;
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    out.emplace_back(ov[0], ov[1]);
    start = ov[1];
    // After an empty match, look for a non-empty one at the same place first.
    options = ov[0] == ov[1] ? (PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED) : 0;
  }
  return out;
}

bool Regex::search(std::string_view subject) const {
  pcre2_code* code = code_of(code_);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(pcre2_match_data_create_from_pattern(code, nullptr),
                                                                    pcre2_match_data_free);
  return pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0, PCRE2_NO_UTF_CHECK,
                     md.get(), nullptr) >= 0;
}

}  // namespace lora_share::tok
