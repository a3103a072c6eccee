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

std::string string_at(const json* object, const char* key) {
  const json* value = field(object, key);
  return value != nullptr && value->is_string() ? value->get<std::string>() : "";
}

// What a manifest holds at `key`, as Python's json.dumps writes it, or "none".
std::string found(const json& root, const char* key) {
  const json* value = field(&root, key);
  return value == nullptr ? "none" : value->dump();
}

// The file parsed and checked to be a JSON object of kManifestFormat and
// kManifestVersion.
StatusOr<json> read_json(const std::string& path) {
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

StatusOr<ChatPieces> read_chat_pieces(const json& j, const std::string& where) {
  const json* prefix = field(&j, "prefix");
  const json* generation = field(&j, "generation_prompt");
  const json* roles = field(&j, "roles");
  if (prefix == nullptr || !prefix->is_string() || generation == nullptr || !generation->is_string() ||
      roles == nullptr || !roles->is_object())
    return Status::usage(where + " needs string prefix and generation_prompt and a roles object: rebuild");
  ChatPieces pieces;
  pieces.prefix = prefix->get<std::string>();
  pieces.generation_prompt = generation->get<std::string>();
  if (const json* trim = field(&j, "trim_content")) {
    if (!trim->is_boolean()) return Status::usage(where + ".trim_content must be true or false: rebuild");
    pieces.trim_content = trim->get<bool>();
  }
  if (const json* system = field(&j, "default_system")) {
    if (!system->is_string()) return Status::usage(where + ".default_system must be a string: rebuild");
    pieces.default_system = system->get<std::string>();
  }
  for (const auto& [role, texts] : roles->items()) {
    if (!texts.is_array() || texts.size() != 2 || !texts[0].is_string() || !texts[1].is_string())
      return Status::usage(where + ".roles." + role + " must be [before, after] strings: rebuild");
    pieces.roles.push_back({role, {texts[0].get<std::string>(), texts[1].get<std::string>()}});
  }
  return pieces;
}

// The integers of `section`[key] (others skipped, as the Python reader does).
std::vector<int64_t> ids_at(const json& section, const char* key) {
  std::vector<int64_t> out;
  const json* list = field(&section, key);
  if (list == nullptr || !list->is_array()) return out;
  for (const json& v : *list)
    if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  return out;
}

StatusOr<ManifestTokenizer> read_tokenizer(const json& section, const std::string& path) {
  ManifestTokenizer t;
  t.foundation_fingerprint = string_at(&section, "foundation_fingerprint");
  if (const json* files = field(&section, "files"); files != nullptr && files->is_object())
    for (const auto& [name, entry] : files->items()) t.files.emplace_back(name, string_at(&entry, "sha256"));
  t.eos_token_ids = ids_at(section, "eos_token_ids");
  if (const json* bos = field(&section, "bos_token_id"); bos != nullptr && bos->is_number_integer())
    t.bos_token_id = bos->get<int64_t>();
  if (const json* chat = field(&section, "chat_format"); chat != nullptr && chat->is_object()) {
    auto pieces = read_chat_pieces(*chat, path + ": tokenizer.chat_format");
    if (!pieces.ok()) return pieces.status();
    t.chat_format = std::move(pieces.value());
  }
  return t;
}

}  // namespace

std::string short_digest(const std::string& digest) { return digest.substr(0, 12) + "\xE2\x80\xA6"; }

StatusOr<Manifest> parse_manifest(const std::string& path) {
  auto parsed = read_json(path);
  if (!parsed.ok()) return parsed.status();
  const json& root = parsed.value();
  auto bad = [&](const std::string& what) {
    return Status::usage(path + ": " + what + ": rebuild the folder with lora-share build");
  };
  Manifest m;
  m.path = path;
  const json* foundation = field(&root, "foundation");
  if (const json* file = field(foundation, "file")) {
    if (!plain_file_name(file)) return bad("foundation.file is not a file name");
    m.foundation_file = file->get<std::string>();
  }
  m.foundation_fingerprint = string_at(foundation, "fingerprint");
  if (const json* shared = field(&root, "shared")) {
    const json* file = field(shared, "file");
    if (!plain_file_name(file)) return bad("shared.file is missing or not a file name");
    m.shared_file = file->get<std::string>();
  }
  if (const json* adapters = field(&root, "adapters"); adapters != nullptr && adapters->is_array()) {
    for (size_t i = 0; i < adapters->size(); ++i) {
      const json* a = &(*adapters)[i];
      const json* name = field(a, "name");
      const json* file = field(a, "file");
      if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty() ||
          !plain_file_name(file))
        return bad("adapters[" + std::to_string(i) + "] lacks a name or a file");
      m.adapters.push_back({name->get<std::string>(), file->get<std::string>()});
    }
  }
  if (const json* section = field(&root, "tokenizer"); section != nullptr && section->is_object()) {
    auto tokenizer = read_tokenizer(*section, path);
    if (!tokenizer.ok()) return tokenizer.status();
    m.tokenizer = std::move(tokenizer.value());
  }
  return m;
}

StatusOr<Manifest> read_manifest(const std::string& dir) {
  std::string path = dir + "/manifest.json";
  if (!std::ifstream(path))
    return Status::failure(path + ": cannot read it (is " + dir + " a folder written by lora-share build?)");
  auto parsed = parse_manifest(path);
  if (!parsed.ok()) return Status::failure(parsed.status().message());
  auto bad = [&](const std::string& what) {
    return Status::failure(path + ": " + what + ": rebuild the folder with lora-share build");
  };
  if (parsed->foundation_file.empty()) return bad("foundation.file is missing or not a file name");
  if (parsed->adapters.empty()) return bad("it lists no adapters");
  return parsed;
}

Status check_tokenizer_foundation(const Manifest& manifest, const std::string& ptd, const std::string& fingerprint) {
  if (manifest.foundation_fingerprint != fingerprint) {
    const size_t slash = ptd.find_last_of('/');
    const std::string ptd_name = slash == std::string::npos ? ptd : ptd.substr(slash + 1);
    return Status::usage(manifest.path + " describes foundation " + short_digest(manifest.foundation_fingerprint) +
                         ", not " + ptd + " (foundation " + short_digest(fingerprint) +
                         "): use the manifest.json and tokenizer files of " + ptd_name + "'s own build");
  }
  const std::string& section = manifest.tokenizer ? manifest.tokenizer->foundation_fingerprint : std::string();
  if (section != fingerprint) {
    return Status::usage(manifest.path + ": its tokenizer section is for foundation " + short_digest(section) +
                         ", not " + ptd + " (foundation " + short_digest(fingerprint) +
                         "): copy the tokenizer files and manifest.json from the same build");
  }
  return Status();
}

StatusOr<std::vector<int64_t>> eos_ids_of(const Manifest& manifest, const std::string& ptd,
                                          const std::string& fingerprint) {
  if (fingerprint.empty() || !manifest.tokenizer) return std::vector<int64_t>();
  const std::string& listed = manifest.tokenizer->foundation_fingerprint;
  if (listed != fingerprint)
    return Status::usage(manifest.path + ": its tokenizer section (the EOS ids) is for foundation " +
                         short_digest(listed) + ", not " + ptd + " (foundation " + short_digest(fingerprint) +
                         "): copy manifest.json from the same build");
  return manifest.tokenizer->eos_token_ids;
}

}  // namespace lora_share
