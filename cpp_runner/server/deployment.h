// What the server knows of the deployment folder it serves, beyond the
// runtime: the adapters' names (from manifest.json, in build order) and, when
// the build shipped one, the tokenizer bound to its foundation, the EOS ids
// that end an answer and the chat format that turns messages into a prompt.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chat_format.h"
#include "openai.h"
#include "status.h"
#include "tokenizer.h"

namespace lora_share::server {

struct Deployment {
  std::string dir;
  std::vector<std::string> adapters;
  std::optional<tok::Tokenizer> tokenizer;  // none: the build has no tokenizer
  std::string no_tokenizer_reason;          // why not, for error messages
  std::vector<int64_t> eos_ids;
  std::optional<tok::ChatFormat> chat;  // the build's chat template, resolved (chat_format.h)

  // An adapter of the manifest, or "base" (the foundation alone).
  bool knows(const std::string& name) const;
  // The prompt's ids: encoded text, the ids as given, or rendered messages.
  // Usage errors say what the deployment lacks (a tokenizer, a chat format).
  StatusOr<std::vector<int64_t>> prompt_ids(const CompletionRequest& request) const;
};

// Reads `dir`/manifest.json and the tokenizer it lists (checked against the
// foundation, as `build/runner --prompt` checks it).
StatusOr<Deployment> open_deployment(const std::string& dir);

}  // namespace lora_share::server
