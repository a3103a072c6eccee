#include "deployment.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "binding.h"
#include "file_check.h"
#include "manifest.h"

namespace lora_share::server {
namespace {

using nlohmann::json;

// --dir's manifest.json, checked (manifest.h).
StatusOr<json> manifest_in(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  if (!std::ifstream(path))
    return Status::usage(path + ": no such file: --dir must be the output folder of `lora-share build`");
  return lora_share::read_manifest_json(path);
}

}  // namespace

bool Deployment::knows(const std::string& name) const {
  return name == "base" || std::find(adapters.begin(), adapters.end(), name) != adapters.end();
}

StatusOr<std::vector<int64_t>> Deployment::prompt_ids(const CompletionRequest& request) const {
  if (!request.chat && request.prompt_is_ids) return request.prompt_ids;
  if (!tokenizer) {
    return Status::usage("this deployment has no tokenizer (" + no_tokenizer_reason +
                         "): give \"prompt\" as an array of token ids");
  }
  if (!request.chat) {
    auto ids = tokenizer->encode(request.prompt, /*add_special_tokens=*/true);
    if (!ids.ok()) return Status::usage("prompt: " + ids.status().message());
    if (ids->empty()) return Status::usage("prompt encodes to no tokens: give some text");
    return ids;
  }
  if (!chat) {
    return Status::usage("this deployment's tokenizer has no chat template: use /v1/completions");
  }
  // The template's text already holds the special tokens it wants (BOS
  // included), so it is encoded without adding any.
  std::vector<tok::ChatTurn> turns;
  for (const ChatMessage& m : request.messages) turns.push_back({m.role, m.content});
  auto text = tok::render_chat(*chat, turns);
  if (!text.ok()) return text.status();
  auto ids = tokenizer->encode(text.value(), /*add_special_tokens=*/false);
  if (!ids.ok()) return Status::usage("messages: " + ids.status().message());
  return ids;
}

static StatusOr<Deployment> read_deployment(const std::string& dir) {
  auto manifest = manifest_in(dir);
  if (!manifest.ok()) return manifest.status();
  Deployment d;
  d.dir = dir;
  // The adapters and the foundation's file as the library reads them (manifest.h).
  auto files = read_manifest(dir);
  if (!files.ok()) return files.status();
  for (const ManifestAdapter& a : files->adapters) d.adapters.push_back(a.name);
  const std::string ptd = dir + "/" + files->foundation_file;
  if (!manifest->contains("tokenizer")) {
    d.no_tokenizer_reason = "its build had no tokenizer files";
    return d;
  }
  auto ptd_info = check_ptd(ptd, "foundation");
  if (!ptd_info.ok()) return ptd_info.status();
  auto bound = tok::bind_tokenizer(ptd, ptd_info->record.fingerprint, dir);
  if (!bound.ok()) return bound.status();
  if (!bound->has_value()) {
    d.no_tokenizer_reason = "its build had no tokenizer files";
    return d;
  }
  d.eos_ids = (*bound)->eos_token_ids;
  d.chat = std::move((*bound)->chat);
  d.tokenizer.emplace(std::move((*bound)->tokenizer));
  return d;
}

StatusOr<Deployment> open_deployment(const std::string& dir) {
  try {
    return read_deployment(dir);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type in a damaged manifest
    return Status::usage(dir + "/manifest.json: " + e.what() + ": rebuild the deployment");
  }
}

}  // namespace lora_share::server
