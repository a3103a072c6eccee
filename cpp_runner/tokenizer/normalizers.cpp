// Normalizers: Sequence, Prepend, Replace, and the Unicode forms NFC / NFD /
// NFKC / NFKD (through utf8proc). Others are refused at load.
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include "components.h"
#include "regex.h"

namespace lora_share::tok {

namespace {

using json = nlohmann::json;

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string normalize(std::string s) const override {
    for (const auto& p : parts_) s = p->normalize(std::move(s));
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string s) const override { return s.empty() ? s : prefix_ + s; }

 private:
  std::string prefix_;
};

// Replaces every match of the pattern (a literal or a regex) by `content`.
class Replace : public Normalizer {
 public:
  Replace(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string s) const override {
    std::string out;
    size_t prev = 0;
    for (auto [start, end] : pattern_.find_all(s)) {
      out.append(s, prev, start - prev);
      out += content_;
      prev = end;
    }
    out.append(s, prev, std::string::npos);
    return out;
  }

 private:
  Regex pattern_;
  std::string content_;
};

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(int options) : options_(options) {}
  std::string normalize(std::string s) const override {
    utf8proc_uint8_t* out = nullptr;
    utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                     static_cast<utf8proc_option_t>(options_));
    if (n < 0) return s;  // only on invalid UTF-8, which encode() rejects before
    std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    free(out);
    return result;
  }

 private:
  int options_;
};

}  // namespace

StatusOr<Regex> make_pattern(const json& j, const Where& where) {
  if (j.contains("String")) return Regex::literal(j.at("String").get<std::string>(), where.str());
  if (j.contains("Regex")) return Regex::compile(j.at("Regex").get<std::string>(), where.str());
  return Status::failure(where.str() + ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

StatusOr<std::unique_ptr<Normalizer>> make_normalizer(const json& j, const Where& where) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  const std::string type = j.at("type").get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const json& list = j.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i) {
      auto part = make_normalizer(list[i], where.at(".normalizers[" + std::to_string(i) + "]"));
      if (!part.ok()) return part.status();
      if (*part) parts.push_back(std::move(part.value()));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  if (type == "Prepend") return std::unique_ptr<Normalizer>(new Prepend(j.at("prepend").get<std::string>()));
  if (type == "Replace") {
    auto pattern = make_pattern(j.at("pattern"), where.at(".pattern"));
    if (!pattern.ok()) return pattern.status();
    return std::unique_ptr<Normalizer>(new Replace(std::move(pattern.value()), j.at("content").get<std::string>()));
  }
  const int stable = UTF8PROC_STABLE;
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeForm(stable | UTF8PROC_COMPOSE));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeForm(stable | UTF8PROC_DECOMPOSE));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeForm(stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  if (type == "NFKD")
    return std::unique_ptr<Normalizer>(new UnicodeForm(stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  return unsupported(where, type);
}

Status unsupported(const Where& where, const std::string& type) {
  return Status::failure(where.str() + " type '" + type + "' is not supported by this runtime");
}

}  // namespace lora_share::tok
