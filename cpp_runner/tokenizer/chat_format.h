// The build's chat template, as lora_share/tokenizer/chat_format.py resolved
// it into plain text pieces (manifest.json tokenizer.chat_format), and the
// prompt it makes of chat messages: the one text the server, the runner and
// the library's ls_apply_chat_template all render.
#pragma once

#include <string>
#include <vector>

#include "manifest.h"
#include "status.h"

namespace lora_share::tok {

// The build's chat template in text pieces, as manifest.json's reader
// (formats/manifest.h) hands it over.
using ChatFormat = ChatPieces;

struct ChatTurn {
  std::string role;
  std::string content;
};

// The prompt text of `messages` (it holds the template's special tokens, BOS
// included: encode it without adding any, as transformers'
// apply_chat_template(tokenize=True) does). A role the template does not
// know is a usage error naming it.
StatusOr<std::string> render_chat(const ChatFormat& format, const std::vector<ChatTurn>& messages);

}  // namespace lora_share::tok
