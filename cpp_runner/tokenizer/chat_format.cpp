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

StatusOr<ChatFormat> read_chat_format(const nlohmann::json& j, const std::string& where) {
  ChatFormat format;
  if (!j.is_object() || !j.contains("prefix") || !j["prefix"].is_string() || !j.contains("generation_prompt") ||
      !j["generation_prompt"].is_string() || !j.contains("roles") || !j["roles"].is_object()) {
    return Status::usage(where + " needs string prefix and generation_prompt and a roles object: rebuild");
  }
  format.prefix = j["prefix"].get<std::string>();
  format.generation_prompt = j["generation_prompt"].get<std::string>();
  if (j.contains("trim_content") && !j["trim_content"].is_boolean()) {
    return Status::usage(where + ".trim_content must be true or false: rebuild");
  }
  format.trim_content = j.value("trim_content", false);
  if (j.contains("default_system")) {
    if (!j["default_system"].is_string()) return Status::usage(where + ".default_system must be a string: rebuild");
    format.default_system = j["default_system"].get<std::string>();
  }
  for (const auto& [role, pieces] : j["roles"].items()) {
    if (!pieces.is_array() || pieces.size() != 2 || !pieces[0].is_string() || !pieces[1].is_string()) {
      return Status::usage(where + ".roles." + role + " must be [before, after] strings: rebuild");
    }
    format.roles.push_back({role, {pieces[0].get<std::string>(), pieces[1].get<std::string>()}});
  }
  return format;
}

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
