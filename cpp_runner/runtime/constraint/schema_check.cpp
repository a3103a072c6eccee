#include "schema_check.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace lora_share::constraint {
namespace {

using json = nlohmann::json;

// Keywords xgrammar 0.2.8's JSON schema converter reads past (json_schema_converter.cc:
// WarnUnsupportedKeywords, which is silent unless verbose), and older drafts' forms of them.
const std::set<std::string>& unenforced() {
  static const std::set<std::string> keywords = {
      "not",           "if",         "then",        "else",        "dependentRequired", "dependentSchemas",
      "dependencies",  "contains",   "minContains", "maxContains", "additionalItems",   "$dynamicRef",
      "$recursiveRef", "uniqueItems"};
  return keywords;
}

// Keywords whose value is one schema, a list of them, or a map of names to them.
const std::set<std::string> kOneSchema = {"items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems",
                                          "propertyNames"};
const std::set<std::string> kSchemaList = {"anyOf", "oneOf", "allOf", "prefixItems"};
const std::set<std::string> kSchemaMap = {"properties", "patternProperties", "$defs", "definitions"};

// RFC 6901: "~" and "/" in a name are escaped.
std::string pointer_part(const std::string& name) {
  std::string out;
  for (char c : name) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

// xgrammar 0.2.8 writes a quote or a backslash that a pattern names ('"', '\\', \u0022, \u005C,
// in a character class or not) into the JSON string unescaped: invalid JSON, or another string than
// the pattern matches. Ranges and negated classes that merely include them are filtered properly.
// It also reads \x with any number of hex digits (ECMA-262: two): "\x22b" is one character to it.
Status check_pattern(const std::string& pattern, const std::string& where) {
  const char* problem = pattern.find('"') != std::string::npos ? "a quote" : nullptr;
  for (size_t i = 0; i + 1 < pattern.size() && problem == nullptr; ++i) {
    if (pattern[i] != '\\') continue;
    std::string code = pattern.substr(i + 1, 5);
    std::transform(code.begin(), code.end(), code.begin(), [](unsigned char c) { return std::tolower(c); });
    if (code[0] == '\\' || code == "u0022" || code == "u005c") problem = "a backslash to match";
    if (code[0] == 'x') problem = "a \\x escape (xgrammar reads any number of hex digits after it: write \\u and four)";
    ++i;  // the escaped character
  }
  if (problem == nullptr) return Status();
  return Status::usage("the pattern at " + where + " has " + problem +
                       ": the grammar engine (xgrammar) would not escape a quote or a backslash it names in the "
                       "JSON string");
}

Status walk(const json& schema, const std::string& where) {
  if (!schema.is_object()) return Status();  // true/false, or a value xgrammar refuses itself
  for (const auto& [key, value] : schema.items()) {
    const std::string at = where + "/" + pointer_part(key);
    // uniqueItems: false asks nothing.
    if (unenforced().count(key) && !(key == "uniqueItems" && value == false))
      return Status::usage("the keyword '" + key + "' at " + (where.empty() ? "/" : where) +
                           " is not supported: the grammar engine (xgrammar) cannot enforce it, so answers "
                           "could break it; remove it or express it with the keywords listed in "
                           "docs/structured-output.md");
    Status s;
    if (key == "pattern" && value.is_string()) s = check_pattern(value.get<std::string>(), at);
    if (key == "patternProperties" && value.is_object())
      for (auto it = value.begin(); it != value.end() && s.ok(); ++it) s = check_pattern(it.key(), at);
    if (!s.ok()) return s;
    if (kOneSchema.count(key)) {
      s = walk(value, at);
    } else if (kSchemaList.count(key) && value.is_array()) {
      for (size_t i = 0; i < value.size() && s.ok(); ++i) s = walk(value[i], at + "/" + std::to_string(i));
    } else if (kSchemaMap.count(key) && value.is_object()) {
      for (auto it = value.begin(); it != value.end() && s.ok(); ++it)
        s = walk(it.value(), at + "/" + pointer_part(it.key()));
    }
    if (!s.ok()) return s;
  }
  return Status();
}

}  // namespace

Status check_schema_keywords(const json& schema) { return walk(schema, ""); }

}  // namespace lora_share::constraint
