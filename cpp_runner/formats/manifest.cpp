#include "manifest.h"

#include <fstream>

#include <nlohmann/json.hpp>

namespace lora_share {
namespace {

using nlohmann::json;

// A file name from the manifest must stay inside the deployment folder.
bool plain_file_name(const json* name) {
  if (name == nullptr || !name->is_string()) return false;
  const std::string& s = name->get_ref<const std::string&>();
  return !s.empty() && s.find('/') == std::string::npos && s != "." && s != "..";
}

// `object`[key], or null when `object` is not an object or has no such key.
const json* field(const json* object, const char* key) {
  if (object == nullptr || !object->is_object()) return nullptr;
  auto it = object->find(key);
  return it == object->end() ? nullptr : &*it;
}

std::string folder_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// What a manifest holds at `key`, as Python's json.dumps writes it, or "none".
std::string found(const json& root, const char* key) {
  const json* value = field(&root, key);
  return value == nullptr ? "none" : value->dump();
}

}  // namespace

StatusOr<json> read_manifest_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  json root = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return Status::usage(path +
                         ": not a readable manifest (not a JSON object; the file may be truncated): use "
                         "the manifest.json its build wrote, or rebuild with `lora-share build`");
  const std::string format = json(kManifestFormat).dump();
  const json* f = field(&root, "format");
  if (f == nullptr || *f != kManifestFormat)
    return Status::usage(path + ": not a lora-share manifest (format " + found(root, "format") +
                         "; this reader reads format " + format + " version " + std::to_string(kManifestVersion) +
                         "): give the manifest.json of a lora-share build");
  const json* v = field(&root, "version");
  if (v == nullptr || !v->is_number_integer() || v->get<int64_t>() != kManifestVersion)
    return Status::usage(path + ": written by another lora-share version (manifest version " + found(root, "version") +
                         "; this one reads version " + std::to_string(kManifestVersion) +
                         " only): rebuild the deployment with this version's `lora-share build`");
  return root;
}

StatusOr<std::vector<int64_t>> read_eos_ids(const std::string& ptd, const std::string& fingerprint) {
  std::vector<int64_t> ids;
  if (fingerprint.empty()) return ids;
  std::string path = folder_of(ptd) + "/manifest.json";
  if (!std::ifstream(path)) return ids;
  auto parsed = read_manifest_json(path);
  if (!parsed.ok()) return parsed.status();
  const json& root = parsed.value();
  const json* section = field(&root, "tokenizer");
  if (section == nullptr || !section->is_object()) return ids;
  const json* owner = field(section, "foundation_fingerprint");
  std::string listed = owner != nullptr && owner->is_string() ? owner->get<std::string>() : "";
  if (listed != fingerprint)
    return Status::usage(path + ": its tokenizer section (the EOS ids) is for foundation " + listed.substr(0, 12) +
                         "\xE2\x80\xA6, not " + ptd + " (foundation " + fingerprint.substr(0, 12) +
                         "\xE2\x80\xA6): copy manifest.json from the same build");
  const json* eos = field(section, "eos_token_ids");
  if (eos == nullptr || !eos->is_array()) return ids;
  for (const json& v : *eos)
    if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
  return ids;
}

StatusOr<Manifest> read_manifest(const std::string& dir) {
  std::string path = dir + "/manifest.json";
  if (!std::ifstream(path))
    return Status::failure(path + ": cannot read it (is " + dir + " a folder written by lora-share build?)");
  auto parsed = read_manifest_json(path);
  if (!parsed.ok()) return Status::failure(parsed.status().message());
  const json& root = parsed.value();
  auto bad = [&](const std::string& what) {
    return Status::failure(path + ": " + what + ": rebuild the folder with lora-share build");
  };
  Manifest m;
  const json* ffile = field(field(&root, "foundation"), "file");
  if (!plain_file_name(ffile)) return bad("foundation.file is missing or not a file name");
  m.foundation_file = ffile->get<std::string>();
  if (const json* shared = field(&root, "shared")) {
    const json* sfile = field(shared, "file");
    if (!plain_file_name(sfile)) return bad("shared.file is missing or not a file name");
    m.shared_file = sfile->get<std::string>();
  }
  const json* adapters = field(&root, "adapters");
  if (adapters == nullptr || !adapters->is_array() || adapters->empty()) return bad("it lists no adapters");
  for (size_t i = 0; i < adapters->size(); ++i) {
    const json* a = &(*adapters)[i];
    const json* name = field(a, "name");
    const json* file = field(a, "file");
    if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty() || !plain_file_name(file))
      return bad("adapters[" + std::to_string(i) + "] lacks a name or a file");
    m.adapters.push_back({name->get<std::string>(), file->get<std::string>()});
  }
  return m;
}

}  // namespace lora_share
