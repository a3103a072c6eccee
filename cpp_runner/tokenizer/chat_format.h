// The build's chat template, as lora_share/tokenizer/chat_format.py resolved
// it into plain text pieces (manifest.json tokenizer.chat_format), and the
// prompt it makes of chat messages: the one text the server, the runner and
// the library's ls_apply_chat_template all render.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "status.h"

namespace lora_share::tok {

// prompt = prefix + for each message roles[role].first + content +
// roles[role].second, + generation_prompt; each content stripped of
// surrounding whitespace first when trim_content (Llama 3's template trims).
struct ChatFormat {
  std::string prefix;
  bool trim_content = false;
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> roles;
  std::string generation_prompt;
  // The system message the template writes when a conversation starts with
  // none (SmolLM2's, Qwen 2's): put first, untrimmed, in that case.
  std::optional<std::string> default_system;
};

struct ChatTurn {
  std::string role;
  std::string content;
};

// Reads a manifest's tokenizer.chat_format object; `where` names it in errors.
StatusOr<ChatFormat> read_chat_format(const nlohmann::json& j, const std::string& where);

// The prompt text of `messages` (it holds the template's special tokens, BOS
// included: encode it without adding any, as transformers'
// apply_chat_template(tokenize=True) does). A role the template does not
// know is a usage error naming it.
StatusOr<std::string> render_chat(const ChatFormat& format, const std::vector<ChatTurn>& messages);

}  // namespace lora_share::tok
