#include "added_tokens.h"

#include <algorithm>

#include "utf8.h"

namespace lora_share::tok {

namespace {

// Rust's \s: the Unicode White_Space property.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Start of the white space ending text[0, end).
size_t leftmost_space_at_end(const std::string& text, size_t begin, size_t end) {
  std::vector<std::string_view> chars = utf8_chars(std::string_view(text).substr(begin, end - begin));
  size_t start = end;
  for (auto it = chars.rbegin(); it != chars.rend(); ++it) {
    size_t i = 0;
    if (!is_white_space(next_code_point(*it, i))) break;
    start -= it->size();
  }
  return start;
}

// End of the white space starting at text[begin].
size_t rightmost_space_at_start(const std::string& text, size_t begin) {
  size_t i = begin;
  while (i < text.size()) {
    size_t next = i;
    if (!is_white_space(next_code_point(text, next))) break;
    i = next;
  }
  return i;
}

}  // namespace

// The `tokenizers` library tests single_word boundaries with Rust's regex crate,
// whose \w is Unicode's word class (UTS #18): Alphabetic, marks, decimal digits,
// connector punctuation and the join controls. PCRE2's \w (UCP) is letters and
// numbers and '_' instead: it would take "½" or "②" as word characters and not
// a combining mark or U+200D, so the class is spelled out.
constexpr char kRustWord[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";

AddedTokenMatcher::AddedTokenMatcher()
    : word_start_(Regex::compile(std::string("^") + kRustWord, "added tokens").value()),
      word_end_(Regex::compile(std::string(kRustWord) + "\\z", "added tokens").value()) {}

void AddedTokenMatcher::add(const AddedToken& token, const std::string& pattern) {
  if (pattern.empty()) return;
  by_first_byte_[static_cast<unsigned char>(pattern[0])].push_back({pattern, token});
  ++count_;
}

void AddedTokenMatcher::finish() {
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const Entry& a, const Entry& b) { return a.pattern.size() > b.pattern.size(); });
  }
}

std::optional<size_t> AddedTokenMatcher::longest_at(const std::string& text, size_t pos) const {
  const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[pos])];
  for (size_t k = 0; k < bucket.size(); ++k) {
    if (text.compare(pos, bucket[k].pattern.size(), bucket[k].pattern) == 0) return k;
  }
  return std::nullopt;
}

std::vector<Segment> AddedTokenMatcher::split(const std::string& text, bool at_start) const {
  std::vector<Segment> out;
  size_t start_offset = 0;
  auto emit_text = [&](size_t from, size_t to) {
    if (to > from) out.push_back({std::nullopt, text.substr(from, to - from), at_start && from == 0});
  };
  for (size_t pos = 0; pos < text.size();) {
    std::optional<size_t> k = count_ ? longest_at(text, pos) : std::nullopt;
    if (!k) {
      ++pos;
      continue;
    }
    const Entry& e = by_first_byte_[static_cast<unsigned char>(text[pos])][*k];
    size_t start = pos, stop = pos + e.pattern.size();
    pos = stop;  // the next search starts after this match, whatever it strips
    if (e.token.single_word) {
      bool start_space = start == 0 || !word_end_.search(std::string_view(text).substr(0, start));
      bool stop_space = stop == text.size() || !word_start_.search(std::string_view(text).substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (e.token.lstrip) start = std::max(leftmost_space_at_end(text, 0, start), start_offset);
    if (e.token.rstrip) stop = rightmost_space_at_start(text, stop);
    emit_text(start_offset, start);
    out.push_back({e.token.id, text.substr(start, stop - start), at_start && start == 0});
    start_offset = stop;
  }
  emit_text(start_offset, text.size());
  return out;
}

}  // namespace lora_share::tok
