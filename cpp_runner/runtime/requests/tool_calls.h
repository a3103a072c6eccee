// OpenAI's tools (function calling) on any model (docs/structured-output.md,
// "Tools"): the request's tools and tool_choice, the history's calls and
// results, and the answer read back as a call. The build's chat template is
// text pieces per role (tokenizer/chat_format.h) and knows no tools, so they
// are rendered in one documented generic format; what makes a call valid is
// the constraint: tool_choice "required" or a named function holds the answer
// to {"name": ..., "arguments": ...} whose arguments validate against that
// tool's parameters.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "status.h"

namespace lora_share::requests {

struct Tool {
  std::string name;
  std::string description;
  nlohmann::json parameters;  // a JSON schema (an object); {} when not given
};

// One call of an assistant message (history) or of an answer.
struct ToolCall {
  std::string id;         // "call_..."
  std::string name;       // the function's
  std::string arguments;  // JSON text, as OpenAI carries it
};

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct Tools {
  std::vector<Tool> tools;
  ToolChoice choice = ToolChoice::kAuto;  // OpenAI's default once tools are given
  std::string named;                      // kNamed: the function
  bool choice_given = false;

  // Whether the answer may be a call: tools given and tool_choice not "none".
  bool offered() const { return !tools.empty() && choice != ToolChoice::kNone; }
  // Whether the answer must be a call (the constraint holds it to one).
  bool forced() const { return offered() && choice != ToolChoice::kAuto; }
};

// "tools": [{"type": "function", "function": {"name", "description",
// "parameters", "strict"}}]. Each parameters is checked to be an object here
// and compiled when the request is prepared (naming
// "tools[i].function.parameters").
Status read_tools(const nlohmann::json& v, Tools* tools);
// "tool_choice": "none", "auto", "required" or {"type": "function",
// "function": {"name"}}.
Status read_tool_choice(const nlohmann::json& v, Tools* tools);
// Checks what needs both fields: a named function is one of the tools, a
// choice other than none has tools.
Status check_tools(const Tools& tools);

// An assistant message's "tool_calls": [{"id", "type": "function",
// "function": {"name", "arguments": JSON text}}].
Status read_message_calls(const nlohmann::json& v, const std::string& where, std::vector<ToolCall>* calls);

// The JSON schema an answer that must be a call follows: {"name": const,
// "arguments": the tool's parameters}, one of them for "required".
std::string call_schema(const Tools& tools);

// The generic format: the text a system message gains when tools are offered.
std::string tools_prompt(const Tools& tools);
// An assistant message's calls as its text: one JSON object per line.
std::string calls_text(const std::vector<ToolCall>& calls);
// A tool message's result as the user's text.
std::string result_text(const std::string& tool_call_id, const std::string& name, const std::string& content);

// The answer as a call, when it is {"name": one of the tools, "arguments":
// an object} and nothing else; the id new.
std::optional<ToolCall> read_answer_call(const Tools& tools, const std::string& text);

}  // namespace lora_share::requests
