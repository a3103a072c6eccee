// Pre-tokenizers: Sequence, Split, ByteLevel, Digits, Metaspace. Others are
// refused at load.
#include <optional>

#include <nlohmann/json.hpp>

#include "components.h"
#include "split.h"
#include "utf8.h"

namespace lora_share::tok {

namespace {

using json = nlohmann::json;

// GPT-2's pattern, which ByteLevel applies when use_regex is set.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Cuts every piece at the ranges `find` reports, regrouped by `behavior`.
template <typename Find>
void split_pieces(std::vector<Piece>& pieces, SplitBehavior behavior, bool invert, Find find) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    std::vector<Range> ranges = ranges_from_matches(find(p.text), p.text.size());
    if (invert)
      for (Range& r : ranges) r.is_match = !r.is_match;
    for (auto [start, end] : apply_behavior(ranges, behavior)) {
      if (end > start) out.push_back({p.text.substr(start, end - start), p.at_start && start == 0});
    }
  }
  pieces = std::move(out);
}

// Each character of `s` for which `pred` holds, as its own match.
template <typename Pred>
std::vector<std::pair<size_t, size_t>> char_matches(const std::string& s, Pred pred) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t cp = next_code_point(s, i);
    if (pred(cp, start)) out.emplace_back(start, i);
  }
  return out;
}

class SequencePre : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPre : public PreTokenizer {
 public:
  SplitPre(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, behavior_, invert_, [&](const std::string& s) { return pattern_.find_all(s); });
  }

 private:
  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, std::optional<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (Piece& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
    }
    if (regex_) {
      split_pieces(pieces, SplitBehavior::kIsolated, false, [&](const std::string& s) { return regex_->find_all(s); });
    }
    for (Piece& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (unsigned char b : p.text) mapped += byte_to_char(b);
      p.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;
};

class DigitsPre : public PreTokenizer {
 public:
  DigitsPre(bool individual, Regex numeric) : individual_(individual), numeric_(std::move(numeric)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    // Rust's char::is_numeric is the Unicode N category; each digit is one match.
    split_pieces(pieces, individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false,
                 [&](const std::string& s) { return numeric_.find_all(s); });
  }

 private:
  bool individual_;
  Regex numeric_;  // \p{N}, one character per match
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePre : public PreTokenizer {
 public:
  MetaspacePre(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (Piece& p : pieces) {
      std::string replaced;
      for (char c : p.text) {
        if (c == ' ')
          replaced += replacement_;
        else
          replaced += c;
      }
      p.text = std::move(replaced);
      bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      bool prepend = scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start);
      if (prepend && !starts) p.text.insert(0, replacement_);
    }
    if (!split_) return;
    split_pieces(pieces, SplitBehavior::kMergedWithNext, false, [&](const std::string& s) {
      return char_matches(s,
                          [&](char32_t, size_t at) { return s.compare(at, replacement_.size(), replacement_) == 0; });
    });
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

StatusOr<SplitBehavior> parse_behavior(const json& j, const Where& where) {
  const std::string b = j.get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return Status::failure(where.str() + ": unknown split behavior '" + b + "'");
}

StatusOr<std::unique_ptr<PreTokenizer>> make_split(const json& j, const Where& where) {
  auto pattern = make_pattern(j.at("pattern"), where.at(".pattern"));
  if (!pattern.ok()) return pattern.status();
  auto behavior = parse_behavior(j.at("behavior"), where.at(".behavior"));
  if (!behavior.ok()) return behavior.status();
  return std::unique_ptr<PreTokenizer>(new SplitPre(std::move(pattern.value()), *behavior, j.value("invert", false)));
}

StatusOr<std::unique_ptr<PreTokenizer>> make_byte_level(const json& j, const Where& where) {
  std::optional<Regex> regex;
  if (j.value("use_regex", true)) {
    auto r = Regex::compile(kGpt2Pattern, where.str());
    if (!r.ok()) return r.status();
    regex = std::move(r.value());
  }
  return std::unique_ptr<PreTokenizer>(new ByteLevelPre(j.value("add_prefix_space", true), std::move(regex)));
}

StatusOr<std::unique_ptr<PreTokenizer>> make_metaspace(const json& j, const Where& where) {
  PrependScheme scheme = j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
  if (j.contains("prepend_scheme")) {
    const std::string s = j.at("prepend_scheme").get<std::string>();
    if (s == "always")
      scheme = PrependScheme::kAlways;
    else if (s == "first")
      scheme = PrependScheme::kFirst;
    else if (s == "never")
      scheme = PrependScheme::kNever;
    else
      return Status::failure(where.str() + ".prepend_scheme: unknown value '" + s + "'");
  }
  return std::unique_ptr<PreTokenizer>(
      new MetaspacePre(j.value("replacement", std::string("\xE2\x96\x81")), scheme, j.value("split", true)));
}

}  // namespace

StatusOr<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const json& j, const Where& where) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  const std::string type = j.at("type").get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const json& list = j.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      auto part = make_pre_tokenizer(list[i], where.at(".pretokenizers[" + std::to_string(i) + "]"));
      if (!part.ok()) return part.status();
      if (*part) parts.push_back(std::move(part.value()));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePre(std::move(parts)));
  }
  if (type == "Split") return make_split(j, where);
  if (type == "ByteLevel") return make_byte_level(j, where);
  if (type == "Metaspace") return make_metaspace(j, where);
  if (type == "Digits") {
    auto numeric = Regex::compile("\\p{N}", where.str());
    if (!numeric.ok()) return numeric.status();
    return std::unique_ptr<PreTokenizer>(
        new DigitsPre(j.value("individual_digits", false), std::move(numeric.value())));
  }
  return unsupported(where, type);
}

}  // namespace lora_share::tok
