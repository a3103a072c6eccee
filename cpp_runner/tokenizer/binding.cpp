#include "binding.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "manifest.h"
#include "sha256.h"

namespace lora_share::tok {

namespace {

using json = nlohmann::json;

std::string short_digest(const std::string& digest) { return digest.substr(0, 12) + "\xE2\x80\xA6"; }

std::string base_name(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string join(const std::string& folder, const std::string& name) {
  return folder == "." ? name : folder + "/" + name;
}

std::string string_at(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>() : "";
}

// The manifest and its tokenizer section must both describe the .ptd's foundation.
Status check_fingerprints(const json& manifest, const std::string& manifest_path, const std::string& ptd,
                          const std::string& fingerprint) {
  std::string listed = string_at(manifest.value("foundation", json::object()), "fingerprint");
  if (listed != fingerprint) {
    return Status::usage(manifest_path + " describes foundation " + short_digest(listed) + ", not " + ptd +
                         " (foundation " + short_digest(fingerprint) +
                         "): use the manifest.json and tokenizer "
                         "files of " +
                         base_name(ptd) + "'s own build");
  }
  std::string section = string_at(manifest.at("tokenizer"), "foundation_fingerprint");
  if (section != fingerprint) {
    return Status::usage(manifest_path + ": its tokenizer section is for foundation " + short_digest(section) +
                         ", not " + ptd + " (foundation " + short_digest(fingerprint) +
                         "): copy the tokenizer files and manifest.json from the same build");
  }
  return Status();
}

// Every listed file that is present must be the one the build wrote.
Status check_files(const json& files, const std::string& folder, const std::string& manifest_path,
                   const std::string& ptd) {
  std::string tokenizer_json = join(folder, "tokenizer.json");
  if (!files.is_object() || !files.contains("tokenizer.json") || !std::ifstream(tokenizer_json)) {
    return Status::usage(tokenizer_json + ": missing, but " + ptd + "'s build has it (listed in " + manifest_path +
                         "): copy tokenizer.json from the same build");
  }
  for (const auto& [name, entry] : files.items()) {
    std::string path = join(folder, name);
    if (!std::ifstream(path)) continue;
    auto actual = sha256_file(path);
    if (!actual.ok()) return actual.status();
    std::string listed = string_at(entry, "sha256");
    if (actual.value() != listed) {
      return Status::usage(path + " (sha256 " + short_digest(actual.value()) + ") is not the tokenizer " + ptd +
                           " was built with (manifest.json lists " + short_digest(listed) + "): copy " + name +
                           " from the same build");
    }
  }
  return Status();
}

std::vector<int64_t> ids_at(const json& section, const char* key) {
  std::vector<int64_t> out;
  if (!section.contains(key) || !section.at(key).is_array()) return out;
  for (const json& v : section.at(key)) {
    if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  }
  return out;
}

}  // namespace

std::string folder_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string no_tokenizer_message(const std::string& folder) {
  return folder +
         " has no tokenizer (the build's checkpoint had none): pass --tokens ids, or add "
         "foundation.tokenizer to the config and rebuild";
}

StatusOr<std::optional<BoundTokenizer>> bind_tokenizer(const std::string& ptd, const std::string& ptd_fingerprint,
                                                       const std::string& folder_in) {
  std::string folder =
      folder_in.size() > 1 && folder_in.back() == '/' ? folder_in.substr(0, folder_in.size() - 1) : folder_in;
  std::string manifest_path = join(folder, "manifest.json");
  if (!std::ifstream(manifest_path)) return std::optional<BoundTokenizer>();
  auto manifest = read_manifest_json(manifest_path);
  if (!manifest.ok()) return manifest.status();
  if (!manifest->contains("tokenizer") || !manifest->at("tokenizer").is_object()) {
    return std::optional<BoundTokenizer>();
  }
  if (ptd_fingerprint.empty()) {
    return Status::usage(ptd +
                         " has no lora-share foundation record, so no tokenizer can be bound to it: "
                         "rebuild it with lora-share build, or pass --tokens ids");
  }
  const json& section = manifest->at("tokenizer");
  Status s = check_fingerprints(manifest.value(), manifest_path, ptd, ptd_fingerprint);
  if (!s.ok()) return s;
  s = check_files(section.value("files", json()), folder, manifest_path, ptd);
  if (!s.ok()) return s;
  auto tokenizer = Tokenizer::load(join(folder, "tokenizer.json"));
  if (!tokenizer.ok()) return tokenizer.status();
  std::optional<int64_t> bos;
  if (section.contains("bos_token_id") && section.at("bos_token_id").is_number_integer()) {
    bos = section.at("bos_token_id").get<int64_t>();
  }
  std::optional<ChatFormat> chat;
  if (section.contains("chat_format") && section.at("chat_format").is_object()) {
    auto format = read_chat_format(section.at("chat_format"), manifest_path + ": tokenizer.chat_format");
    if (!format.ok()) return format.status();
    chat = std::move(format.value());
  }
  return std::optional<BoundTokenizer>(
      BoundTokenizer{folder, std::move(tokenizer.value()), ids_at(section, "eos_token_ids"), bos, std::move(chat)});
}

}  // namespace lora_share::tok
