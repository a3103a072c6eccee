// Decoders: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip,
// Metaspace, each with the Rust library's decode_chain semantics (the
// results are joined with "" by the caller). Others are refused at load.
#include <nlohmann/json.hpp>

#include "components.h"
#include "utf8.h"

namespace lora_share::tok {

namespace {

using json = nlohmann::json;
using Tokens = std::vector<std::string>;

const char* const kReplacementChar = "\xEF\xBF\xBD";

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  Tokens decode_chain(Tokens tokens) const override {
    for (const auto& p : parts_) tokens = p->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// All tokens -> bytes (a token with a char outside the table keeps its own
// UTF-8), then one lossy UTF-8 string.
class ByteLevelDecoder : public Decoder {
 public:
  Tokens decode_chain(Tokens tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      std::string mapped;
      bool all_mapped = true;
      for (size_t i = 0; i < t.size() && all_mapped;) {
        int b = char_to_byte(next_code_point(t, i));
        if (b < 0)
          all_mapped = false;
        else
          mapped += static_cast<char>(b);
      }
      bytes += all_mapped ? mapped : t;
    }
    return {utf8_lossy(bytes)};
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Tokens decode_chain(Tokens tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t prev = 0;
      for (auto [start, end] : pattern_.find_all(t)) {
        out.append(t, prev, start - prev);
        out += content_;
        prev = end;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
    return tokens;
  }

 private:
  Regex pattern_;
  std::string content_;
};

// Runs of <0xNN> tokens become their bytes when those are valid UTF-8, else
// one U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  Tokens decode_chain(Tokens tokens) const override {
    Tokens out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_valid(pending))
        out.push_back(pending);
      else
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementChar);
      pending.clear();
    };
    for (std::string& t : tokens) {
      int byte = parse_byte_token(t);
      if (byte >= 0) {
        pending += static_cast<char>(byte);
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    return out;
  }

 private:
  static int parse_byte_token(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; ++i) {
      char c = t[i];
      int d = (c >= '0' && c <= '9')   ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    return v;
  }
};

class FuseDecoder : public Decoder {
 public:
  Tokens decode_chain(Tokens tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    return {all};
  }
};

// Per token: up to `start` leading and `stop` trailing copies of `content` removed.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  Tokens decode_chain(Tokens tokens) const override {
    for (std::string& t : tokens) {
      std::vector<std::string_view> chars = utf8_chars(t);
      size_t start_cut = 0;
      for (size_t i = 0; i < std::min(start_, chars.size()) && is_content(chars[i]); ++i) start_cut = i + 1;
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size() && is_content(chars[chars.size() - i - 1]); ++i) {
        stop_cut = chars.size() - i - 1;
      }
      std::string out;
      for (size_t i = start_cut; i < stop_cut; ++i) out += chars[i];
      t = std::move(out);
    }
    return tokens;
  }

 private:
  bool is_content(std::string_view c) const {
    size_t i = 0;
    return next_code_point(c, i) == content_;
  }
  char32_t content_;
  size_t start_, stop_;
};

// The replacement char becomes a space, except in the first token when a
// prefix was prepended at encoding (there it is dropped).
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_in_first)
      : replacement_(std::move(replacement)), drop_in_first_(drop_in_first) {}
  Tokens decode_chain(Tokens tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      for (std::string_view c : utf8_chars(tokens[i])) {
        if (c != replacement_)
          out += c;
        else if (!(i == 0 && drop_in_first_))
          out += ' ';
      }
      tokens[i] = std::move(out);
    }
    return tokens;
  }

 private:
  std::string replacement_;
  bool drop_in_first_;
};

StatusOr<std::unique_ptr<Decoder>> make_strip(const json& j, const Where& where) {
  const std::string content = j.at("content").get<std::string>();
  std::vector<std::string_view> chars = utf8_chars(content);
  if (chars.size() != 1) return Status::failure(where.str() + ".content: must be one character");
  size_t i = 0;
  char32_t cp = next_code_point(content, i);
  return std::unique_ptr<Decoder>(new StripDecoder(cp, j.at("start").get<size_t>(), j.at("stop").get<size_t>()));
}

StatusOr<std::unique_ptr<Decoder>> make_metaspace_decoder(const json& j) {
  bool prepend = j.value("add_prefix_space", true);
  if (j.contains("prepend_scheme")) prepend = j.at("prepend_scheme").get<std::string>() != "never";
  return std::unique_ptr<Decoder>(new MetaspaceDecoder(j.value("replacement", std::string("\xE2\x96\x81")), prepend));
}

}  // namespace

StatusOr<std::unique_ptr<Decoder>> make_decoder(const json& j, const Where& where) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  const std::string type = j.at("type").get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    const json& list = j.at("decoders");
    for (size_t i = 0; i < list.size(); ++i) {
      auto part = make_decoder(list[i], where.at(".decoders[" + std::to_string(i) + "]"));
      if (!part.ok()) return part.status();
      if (*part) parts.push_back(std::move(part.value()));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") return make_strip(j, where);
  if (type == "Metaspace") return make_metaspace_decoder(j);
  if (type == "Replace") {
    auto pattern = make_pattern(j.at("pattern"), where.at(".pattern"));
    if (!pattern.ok()) return pattern.status();
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern.value()), j.at("content").get<std::string>()));
  }
  return unsupported(where, type);
}

}  // namespace lora_share::tok
