#include "deployment.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "file_check.h"
#include "manifest.h"
#include "binding.h"

namespace lora_share::server {
namespace {

using nlohmann::json;

StatusOr<json> read_manifest_json(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::usage(path + ": no such file: --dir must be the output folder of `lora-share build`");
  json manifest = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return Status::usage(path + ": not readable JSON (the file may be truncated): rebuild the deployment");
  }
  return manifest;
}

// The chat format the build resolved from the tokenizer's chat template.
StatusOr<ChatFormat> read_chat_format(const json& j, const std::string& dir) {
  const std::string where = dir + "/manifest.json: tokenizer.chat_format";
  ChatFormat format;
  if (!j.contains("prefix") || !j["prefix"].is_string() || !j.contains("generation_prompt") ||
      !j["generation_prompt"].is_string() || !j.contains("roles") || !j["roles"].is_object()) {
    return Status::usage(where + " needs string prefix and generation_prompt and a roles object: rebuild");
  }
  format.prefix = j["prefix"].get<std::string>();
  format.generation_prompt = j["generation_prompt"].get<std::string>();
  format.trim_content = j.value("trim_content", false);
  for (const auto& [role, pieces] : j["roles"].items()) {
    if (!pieces.is_array() || pieces.size() != 2 || !pieces[0].is_string() || !pieces[1].is_string()) {
      return Status::usage(where + ".roles." + role + " must be [before, after] strings: rebuild");
    }
    format.roles.push_back({role, {pieces[0].get<std::string>(), pieces[1].get<std::string>()}});
  }
  return format;
}

// Python's str.strip() on ASCII whitespace, as Jinja's `trim` filter does for it.
std::string trim(const std::string& text) {
  const char* space = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
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
  // included), so it is encoded without adding any, as transformers'
  // apply_chat_template(tokenize=True) does.
  std::string text = chat->prefix;
  for (const ChatMessage& m : request.messages) {
    auto role = std::find_if(chat->roles.begin(), chat->roles.end(),
                             [&](const auto& r) { return r.first == m.role; });
    if (role == chat->roles.end()) {
      return Status::usage("messages: role '" + m.role + "' is not one this model's chat template knows");
    }
    text += role->second.first + (chat->trim_content ? trim(m.content) : m.content) + role->second.second;
  }
  text += chat->generation_prompt;
  auto ids = tokenizer->encode(text, /*add_special_tokens=*/false);
  if (!ids.ok()) return Status::usage("messages: " + ids.status().message());
  return ids;
}

static StatusOr<Deployment> read_deployment(const std::string& dir) {
  auto manifest = read_manifest_json(dir);
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
  if (auto chat = (*manifest)["tokenizer"].find("chat_format"); chat != (*manifest)["tokenizer"].end() &&
                                                                  chat->is_object()) {
    auto format = read_chat_format(*chat, dir);
    if (!format.ok()) return format.status();
    d.chat = std::move(format.value());
  }
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
