#include "binding.h"

#include <algorithm>
#include <fstream>

#include "sha256.h"

namespace lora_share::tok {

namespace {

std::string join(const std::string& folder, const std::string& name) {
  return folder == "." ? name : folder + "/" + name;
}

// Every listed file that is present must be the one the build wrote.
Status check_files(const std::vector<std::pair<std::string, std::string>>& files, const std::string& folder,
                   const std::string& manifest_path, const std::string& ptd) {
  std::string tokenizer_json = join(folder, "tokenizer.json");
  const bool listed_json =
      std::any_of(files.begin(), files.end(), [](const auto& f) { return f.first == "tokenizer.json"; });
  if (!listed_json || !std::ifstream(tokenizer_json)) {
    return Status::usage(tokenizer_json + ": missing, but " + ptd + "'s build has it (listed in " + manifest_path +
                         "): copy tokenizer.json from the same build");
  }
  for (const auto& [name, listed] : files) {
    std::string path = join(folder, name);
    if (!std::ifstream(path)) continue;
    auto actual = sha256_file(path);
    if (!actual.ok()) return actual.status();
    if (actual.value() != listed) {
      return Status::usage(path + " (sha256 " + short_digest(actual.value()) + ") is not the tokenizer " + ptd +
                           " was built with (manifest.json lists " + short_digest(listed) + "): copy " + name +
                           " from the same build");
    }
  }
  return Status();
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

StatusOr<std::optional<BoundTokenizer>> bind_tokenizer(const Manifest& manifest, const std::string& folder_in,
                                                       const std::string& ptd, const std::string& ptd_fingerprint) {
  std::string folder =
      folder_in.size() > 1 && folder_in.back() == '/' ? folder_in.substr(0, folder_in.size() - 1) : folder_in;
  if (!manifest.tokenizer) return std::optional<BoundTokenizer>();
  if (ptd_fingerprint.empty()) {
    return Status::usage(ptd +
                         " has no lora-share foundation record, so no tokenizer can be bound to it: "
                         "rebuild it with lora-share build, or pass --tokens ids");
  }
  Status s = check_tokenizer_foundation(manifest, ptd, ptd_fingerprint);
  if (!s.ok()) return s;
  s = check_files(manifest.tokenizer->files, folder, manifest.path, ptd);
  if (!s.ok()) return s;
  auto tokenizer = Tokenizer::load(join(folder, "tokenizer.json"));
  if (!tokenizer.ok()) return tokenizer.status();
  const ManifestTokenizer& section = *manifest.tokenizer;
  return std::optional<BoundTokenizer>(BoundTokenizer{folder, std::move(tokenizer.value()), section.eos_token_ids,
                                                      section.bos_token_id, section.chat_format});
}

}  // namespace lora_share::tok
