#include "manifest.h"

#include <fstream>
#include <map>
#include <memory>
#include <sstream>

namespace lora_share {
namespace {

// A parsed JSON value: just enough structure to walk a manifest.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  std::string text;  // kString
  std::vector<Json> items;  // kArray
  std::map<std::string, Json> fields;  // kObject

  const Json* get(const std::string& key) const {
    auto it = fields.find(key);
    return (kind == kObject && it != fields.end()) ? &it->second : nullptr;
  }
};

// Recursive descent over the whole text; `error` is set at the first fault.
class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  bool parse(Json* out) {
    if (!value(out, 0)) return false;
    skip();
    return pos_ == s_.size() || fail("text after the end of the document");
  }
  const std::string& error() const { return error_; }

 private:
  static constexpr int kMaxDepth = 64;  // a hostile file cannot exhaust the stack

  bool fail(const std::string& what) {
    if (error_.empty()) error_ = what + " at byte " + std::to_string(pos_);
    return false;
  }
  void skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' ||
                                s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(pos_, n, word) != 0) return fail("unexpected text");
    pos_ += n;
    return true;
  }
  bool value(Json* out, int depth) {
    if (depth > kMaxDepth) return fail("nesting too deep");
    skip();
    if (pos_ >= s_.size()) return fail("unexpected end of file");
    char c = s_[pos_];
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') { out->kind = Json::kString; return string(&out->text); }
    if (c == 't') { out->kind = Json::kBool; return literal("true"); }
    if (c == 'f') { out->kind = Json::kBool; return literal("false"); }
    if (c == 'n') { out->kind = Json::kNull; return literal("null"); }
    return number(out);
  }
  bool number(Json* out) {
    size_t start = pos_;
    while (pos_ < s_.size() && std::string("+-0123456789.eE").find(s_[pos_]) != std::string::npos)
      ++pos_;
    if (pos_ == start) return fail("unexpected character");
    out->kind = Json::kNumber;
    return true;
  }
  bool string(std::string* out) {
    ++pos_;  // the opening quote
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c != '\\') { out->push_back(c); continue; }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      if (e == 'u') {  // names and files are ASCII; keep other escapes as '?'
        if (pos_ + 4 > s_.size()) return fail("bad \\u escape");
        pos_ += 4;
        out->push_back('?');
      } else {
        const std::string from = "\"\\/bfnrt", to = "\"\\/\b\f\n\r\t";
        size_t k = from.find(e);
        if (k == std::string::npos) return fail("bad escape");
        out->push_back(to[k]);
      }
    }
    if (pos_ >= s_.size()) return fail("unterminated string");
    ++pos_;
    return true;
  }
  bool array(Json* out, int depth) {
    out->kind = Json::kArray;
    ++pos_;
    skip();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return true; }
    while (true) {
      out->items.emplace_back();
      if (!value(&out->items.back(), depth + 1)) return false;
      skip();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return true; }
      return fail("expected , or ]");
    }
  }
  bool object(Json* out, int depth) {
    out->kind = Json::kObject;
    ++pos_;
    skip();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return true; }
    while (true) {
      skip();
      if (pos_ >= s_.size() || s_[pos_] != '"') return fail("expected a key");
      std::string key;
      if (!string(&key)) return false;
      skip();
      if (pos_ >= s_.size() || s_[pos_] != ':') return fail("expected :");
      ++pos_;
      if (!value(&out->fields[key], depth + 1)) return false;
      skip();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return true; }
      return fail("expected , or }");
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
  std::string error_;
};

// A file name from the manifest must stay inside the deployment folder.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." &&
         name != "..";
}

}  // namespace

StatusOr<Manifest> read_manifest(const std::string& dir) {
  std::string path = dir + "/manifest.json";
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::failure(path + ": cannot read it (is " + dir +
                           " a folder written by lora-share build?)");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  Json root;
  Parser parser(text);
  if (!parser.parse(&root))
    return Status::failure(path + ": not valid JSON (" + parser.error() +
                           "): rebuild the folder with lora-share build");
  auto bad = [&](const std::string& what) {
    return Status::failure(path + ": " + what +
                           ": rebuild the folder with lora-share build");
  };
  Manifest m;
  const Json* foundation = root.get("foundation");
  const Json* ffile = foundation ? foundation->get("file") : nullptr;
  if (!ffile || ffile->kind != Json::kString || !plain_file_name(ffile->text))
    return bad("foundation.file is missing or not a file name");
  m.foundation_file = ffile->text;
  if (const Json* shared = root.get("shared")) {
    const Json* sfile = shared->get("file");
    if (!sfile || sfile->kind != Json::kString || !plain_file_name(sfile->text))
      return bad("shared.file is missing or not a file name");
    m.shared_file = sfile->text;
  }
  const Json* adapters = root.get("adapters");
  if (!adapters || adapters->kind != Json::kArray || adapters->items.empty())
    return bad("it lists no adapters");
  for (size_t i = 0; i < adapters->items.size(); ++i) {
    const Json& a = adapters->items[i];
    const Json* name = a.get("name");
    const Json* file = a.get("file");
    if (!name || name->kind != Json::kString || name->text.empty() || !file ||
        file->kind != Json::kString || !plain_file_name(file->text))
      return bad("adapters[" + std::to_string(i) + "] lacks a name or a file");
    m.adapters.push_back({name->text, file->text});
  }
  return m;
}

}  // namespace lora_share
