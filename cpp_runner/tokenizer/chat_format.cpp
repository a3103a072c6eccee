#include "chat_format.h"

#include <algorithm>

namespace lora_share::tok {
namespace {

// Python's str.strip() on ASCII whitespace, as Jinja's `trim` filter does for it.
std::string trim(const std::string& text) {
  const char* space = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

}  // namespace

StatusOr<std::string> render_chat(const ChatFormat& format, const std::vector<ChatTurn>& messages) {
  std::string text = format.prefix;
  if (format.default_system && (messages.empty() || messages.front().role != "system")) {
    auto system =
        std::find_if(format.roles.begin(), format.roles.end(), [](const auto& r) { return r.first == "system"; });
    if (system != format.roles.end()) text += system->second.first + *format.default_system + system->second.second;
  }
  for (const ChatTurn& m : messages) {
    auto role =
        std::find_if(format.roles.begin(), format.roles.end(), [&](const auto& r) { return r.first == m.role; });
    if (role == format.roles.end()) {
      return Status::usage("messages: role '" + m.role + "' is not one this model's chat template knows");
    }
    text += role->second.first + (format.trim_content ? trim(m.content) : m.content) + role->second.second;
  }
  return text + format.generation_prompt;
}

}  // namespace lora_share::tok
