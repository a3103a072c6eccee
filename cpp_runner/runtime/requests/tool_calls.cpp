#include "tool_calls.h"

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <random>

#include "bounded_json.h"

namespace lora_share::requests {
namespace {

using nlohmann::json;

const char* kToolShape =
    "{\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\": a JSON schema}}";

// OpenAI's function names: letters, digits, '_' and '-', 1 to 64 of them.
bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

std::string new_call_id() {
  static const uint64_t process = std::random_device()() * uint64_t{0x100000001} ^ std::random_device()();
  static std::atomic<uint64_t> counter{0};
  char id[48];
  std::snprintf(id, sizeof(id), "call_%016" PRIx64 "%08" PRIx64, process, ++counter);
  return id;
}

// Text for the model: invalid UTF-8 replaced, never thrown.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Objects written with their keys in the order given ("name" before
// "arguments": the order a constrained answer is generated in, and the one a
// model reads first).
using ordered = nlohmann::ordered_json;
ordered in_order(const json& j) { return ordered::parse(dump(j)); }
std::string dump(const ordered& j) { return j.dump(-1, ' ', false, ordered::error_handler_t::replace); }

}  // namespace

Status read_tools(const json& v, Tools* tools) {
  if (!v.is_array())
    return Status::usage(std::string("tools must be an array of ") + kToolShape + ", got " + preview(v));
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") ||
        !t["function"].is_object())
      return Status::usage(where + " must be " + kToolShape + ", got " + preview(t));
    for (const auto& [key, value] : t.items())
      if (key != "type" && key != "function")
        return Status::usage(where + " has the key '" + key + "': it is " + kToolShape);
    const json& f = t["function"];
    Tool tool;
    for (const auto& [key, value] : f.items()) {
      const std::string at = where + ".function." + key;
      if (key == "name") {
        if (!value.is_string() || !valid_name(value.get<std::string>()))
          return Status::usage(at + " must be 1 to 64 letters, digits, '_' or '-', got " + preview(value));
        tool.name = value.get<std::string>();
      } else if (key == "description") {
        if (!value.is_string() && !value.is_null())
          return Status::usage(at + " must be a string, got " + preview(value));
        if (value.is_string()) tool.description = value.get<std::string>();
      } else if (key == "parameters") {
        if (!value.is_object() && !value.is_null())
          return Status::usage(at + " must be a JSON schema (an object), got " + preview(value));
        if (value.is_object()) tool.parameters = value;
      } else if (key == "strict") {
        if (!value.is_boolean() && !value.is_null())
          return Status::usage(at + " must be true or false, got " + preview(value));
      } else {
        return Status::usage(where + ".function has the key '" + key +
                             "': it is {\"name\", \"description\", \"parameters\", \"strict\"}");
      }
    }
    if (tool.name.empty()) return Status::usage(where + ".function.name is missing");
    for (const Tool& other : tools->tools)
      if (other.name == tool.name) return Status::usage(where + ".function.name '" + tool.name + "' is given twice");
    if (tool.parameters.is_null()) tool.parameters = json::object();
    tools->tools.push_back(std::move(tool));
  }
  return {};
}

Status read_tool_choice(const json& v, Tools* tools) {
  tools->choice_given = true;
  if (v == "none" || v == "auto" || v == "required") {
    tools->choice = v == "none" ? ToolChoice::kNone : v == "auto" ? ToolChoice::kAuto : ToolChoice::kRequired;
    return {};
  }
  const bool named = v.is_object() && v.size() == 2 && v.value("type", json()) == "function" &&
                     v.contains("function") && v["function"].is_object() && v["function"].size() == 1 &&
                     v["function"].contains("name") && v["function"]["name"].is_string();
  if (!named)
    return Status::usage(
        "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\"}}, "
        "got " +
        preview(v));
  tools->choice = ToolChoice::kNamed;
  tools->named = v["function"]["name"].get<std::string>();
  return {};
}

Status check_tools(const Tools& tools) {
  if (tools.tools.empty() && tools.choice_given && tools.choice != ToolChoice::kNone)
    return Status::usage("tool_choice needs tools: give the functions the answer may call");
  if (tools.choice == ToolChoice::kNamed) {
    for (const Tool& t : tools.tools)
      if (t.name == tools.named) return {};
    std::string names;
    for (const Tool& t : tools.tools) names += (names.empty() ? "" : ", ") + t.name;
    return Status::usage("tool_choice.function.name '" + tools.named + "' is none of the tools (" + names + ")");
  }
  return {};
}

Status read_message_calls(const json& v, const std::string& where, std::vector<ToolCall>* calls) {
  if (!v.is_array())
    return Status::usage(where +
                         " must be an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                         "\"arguments\"}}, got " +
                         preview(v));
  for (size_t i = 0; i < v.size(); ++i) {
    const json& c = v[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    const json* f = c.is_object() && c.contains("function") ? &c["function"] : nullptr;
    if (f == nullptr || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string() ||
        !f->contains("arguments") || !(*f)["arguments"].is_string())
      return Status::usage(at +
                           " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\": "
                           "JSON text}}, got " +
                           preview(c));
    const std::string id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : "";
    calls->push_back({id, (*f)["name"].get<std::string>(), (*f)["arguments"].get<std::string>()});
  }
  return {};
}

std::string call_schema(const Tools& tools) {
  ordered options = ordered::array();
  for (const Tool& t : tools.tools) {
    if (tools.choice == ToolChoice::kNamed && t.name != tools.named) continue;
    ordered properties = ordered::object();
    properties["name"] = {{"const", t.name}};
    properties["arguments"] = in_order(t.parameters);
    ordered option = ordered::object();
    option["type"] = "object";
    option["properties"] = properties;
    option["required"] = {"name", "arguments"};
    option["additionalProperties"] = false;
    options.push_back(option);
  }
  return dump(options.size() == 1 ? options[0] : ordered{{"anyOf", options}});
}

std::string tools_prompt(const Tools& tools) {
  ordered list = ordered::array();
  for (const Tool& t : tools.tools) {
    ordered tool = ordered::object();
    tool["name"] = t.name;
    tool["description"] = t.description;
    tool["parameters"] = in_order(t.parameters);
    list.push_back(tool);
  }
  return "You can call these functions:\n" + dump(list) +
         "\nTo call one, answer with only a JSON object {\"name\": the function's name, \"arguments\": its "
         "arguments}.";
}

std::string calls_text(const std::vector<ToolCall>& calls) {
  std::string text;
  for (const ToolCall& c : calls) {
    // The arguments as the JSON they are; text that is not JSON stays a string.
    ordered arguments = ordered::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
    if (arguments.is_discarded()) arguments = c.arguments;
    ordered call = ordered::object();
    call["name"] = c.name;
    call["arguments"] = arguments;
    text += (text.empty() ? "" : "\n") + dump(call);
  }
  return text;
}

std::string result_text(const std::string& tool_call_id, const std::string& name, const std::string& content) {
  return "Result of " + (name.empty() ? std::string("the call") : name) +
         (tool_call_id.empty() ? std::string() : " (" + tool_call_id + ")") + ": " + content;
}

std::optional<ToolCall> read_answer_call(const Tools& tools, const std::string& text) {
  const ordered answer = ordered::parse(text, nullptr, /*allow_exceptions=*/false);
  if (answer.is_discarded() || !answer.is_object() || answer.size() != 2 || !answer.contains("name") ||
      !answer["name"].is_string() || !answer.contains("arguments") || !answer["arguments"].is_object())
    return std::nullopt;
  const std::string name = answer["name"].get<std::string>();
  for (const Tool& t : tools.tools)
    if (t.name == name) return ToolCall{new_call_id(), name, dump(answer["arguments"])};
  return std::nullopt;
}

}  // namespace lora_share::requests
