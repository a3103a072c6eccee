#include "request_schema.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "bounded_json.h"
#include "lora_share.h"

namespace lora_share::requests {
namespace {

using nlohmann::json;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Which endpoints take a field.
enum Endpoints : unsigned { kCompletions = 1, kChats = 2, kBoth = 3 };

unsigned endpoint_bit(Kind kind) { return kind == Kind::kChat ? kChats : kCompletions; }

// A number as a person writes it (0, 1, 0.01), for messages.
std::string number_text(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

// ---- value readers: each checks a type and a range, naming `key` ----------

Status read_int(const json& v, const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_number_integer()) return Status::usage(key + " must be an integer, got " + preview(v));
  // Unsigned values above int64's range would wrap: take them as too large.
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t value = too_big ? hi : v.get<int64_t>();
  if (too_big || value < lo || value > hi)
    return Status::usage(key + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                         preview(v));
  *out = value;
  return {};
}

Status read_number(const json& v, const std::string& key, double lo, double hi, double* out) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi)
    return Status::usage(key + " must be a number between " + number_text(lo) + " and " + number_text(hi) + ", got " +
                         preview(v));
  *out = v.get<double>();
  return {};
}

Status read_bool(const json& v, const std::string& key, bool* out) {
  if (!v.is_boolean()) return Status::usage(key + " must be true or false, got " + preview(v));
  *out = v.get<bool>();
  return {};
}

// ---- the fields with more than one value -----------------------------------

Status read_model(const json& v, Request& r) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty())
    return Status::usage("model must be the name of an adapter ('base': the foundation alone), got " + preview(v));
  r.model = v.get<std::string>();
  return {};
}

Status read_prompt(const json& v, Request& r) {
  // A one-element batch of prompts is one prompt; larger batches are not served.
  const json* p = &v;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    return {};
  }
  if (!p->is_array() || p->empty())
    return Status::usage("prompt must be a string or a non-empty array of token ids, got " + preview(v));
  for (const json& id : *p) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      return Status::usage(
          "prompt must be a string or an array of token ids (integers >= 0); several prompts in one "
          "request are not served, got " +
          preview(v));
    r.prompt_ids.push_back(id.get<int64_t>());
  }
  r.prompt_is_ids = true;
  return {};
}

// A message's content: a string, or a list of text parts ({"type": "text",
// "text": ...}) joined with newlines, as vLLM joins them.
Status read_content(const json& v, const std::string& where, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return {};
  }
  if (!v.is_array() || v.empty())
    return Status::usage(where + " must be a string or a non-empty list of {\"type\": \"text\", \"text\": ...}, got " +
                         preview(v));
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& part = v[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    const json* type = part.is_object() && part.contains("type") ? &part["type"] : nullptr;
    if (type == nullptr || !type->is_string())
      return Status::usage(at + " must be {\"type\": \"text\", \"text\": ...}, got " + preview(part));
    if (*type != "text") return Status::usage(at + ": parts of type " + preview(*type) + " are not served (text only)");
    for (const auto& [key, value] : part.items())
      if (key != "type" && key != "text")
        return Status::usage(at + " has the key '" + key + "': a text part is {\"type\": \"text\", \"text\": ...}");
    if (!part.contains("text") || !part["text"].is_string())
      return Status::usage(at + ".text must be a string, got " + preview(part.value("text", json())));
    text += (i == 0 ? "" : "\n") + part["text"].get<std::string>();
  }
  *out = std::move(text);
  return {};
}

// Keys a message may hold beside role and content: `name` changes nothing
// here; an assistant's tool_calls and a tool message's tool_call_id are the
// history of tool calls (tool_calls.h); function_call (OpenAI's older form)
// is not served.
Status check_message_keys(const json& m, const std::string& where) {
  for (const auto& [key, value] : m.items()) {
    if (key == "role" || key == "content" || key == "name" || value.is_null()) continue;
    if (key == "tool_calls" && m["role"] == "assistant") continue;
    if (key == "tool_call_id" && m["role"] == "tool") continue;
    const bool tools = key == "tool_calls" || key == "tool_call_id" || key == "function_call";
    if (tools && value.is_array() && value.empty()) continue;
    return Status::usage(where + " has the key '" + key + "'" +
                         (key == "function_call" ? ": function_call is not served (give tool_calls)"
                          : tools ? ": tool_calls belong to assistant messages, tool_call_id to tool ones"
                                  : ": a message is {\"role\", \"content\"}"));
  }
  return {};
}

Status read_messages(const json& v, Request& r) {
  if (!v.is_array() || v.empty())
    return Status::usage("messages must be a non-empty array of {\"role\", \"content\"}, got " + preview(v));
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return Status::usage(where + " needs a string \"role\", got " + preview(m));
    Status s = check_message_keys(m, where);
    if (!s.ok()) return s;
    Message message;
    // OpenAI's newer name for the system role, which chat templates do not know.
    message.role = m["role"] == "developer" ? "system" : m["role"].get<std::string>();
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      s = read_message_calls(m["tool_calls"], where + ".tool_calls", &message.tool_calls);
      if (!s.ok()) return s;
    }
    if (m.contains("tool_call_id") && !m["tool_call_id"].is_null()) {
      if (!m["tool_call_id"].is_string())
        return Status::usage(where + ".tool_call_id must be a string, got " + preview(m["tool_call_id"]));
      message.tool_call_id = m["tool_call_id"].get<std::string>();
    }
    // An assistant message that calls tools may have no content.
    const bool calls = !message.tool_calls.empty();
    if (!m.contains("content") && !calls) return Status::usage(where + ".content is missing");
    if (m.contains("content") && !(calls && m["content"].is_null())) {
      s = read_content(m["content"], where + ".content", &message.content);
      if (!s.ok()) return s;
    }
    r.messages.push_back(std::move(message));
  }
  return {};
}

// "lora": a non-empty array of {"name": adapter, "scale": number within
// [-LS_MAX_LORA_SCALE, LS_MAX_LORA_SCALE]}, which mixes adapters on the
// foundation alone (model "base", checked once every field is read). The mix
// (ls_adapter_mix) refuses such a scale too, naming the term: checked here so
// that the 400 names the field.
Status read_lora(const json& v, Request& r) {
  if (!v.is_array() || v.empty())
    return Status::usage("lora must be a non-empty array of {\"name\": adapter, \"scale\": number}, got " + preview(v));
  for (size_t i = 0; i < v.size(); ++i) {
    const json& term = v[i];
    const std::string where = "lora[" + std::to_string(i) + "]";
    if (!term.is_object())
      return Status::usage(where + " must be {\"name\": adapter, \"scale\": number}, got " + preview(term));
    for (const auto& [key, value] : term.items())
      if (key != "name" && key != "scale")
        return Status::usage(
            where + " has the key '" + key +
            "': give {\"name\": adapter, \"scale\": number} (adapters by name, as GET /v1/models lists them)");
    auto name = term.find("name");
    if (name == term.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
      return Status::usage(where + ".name must be an adapter's name (GET /v1/models lists them)");
    auto scale = term.find("scale");
    if (scale == term.end() || !scale->is_number() || !std::isfinite(scale->get<double>()))
      return Status::usage(where + ".scale must be a finite number, got " +
                           (scale == term.end() ? std::string("nothing") : preview(*scale)));
    if (std::fabs(scale->get<double>()) > LS_MAX_LORA_SCALE) {
      const std::string bound = std::to_string(static_cast<int>(LS_MAX_LORA_SCALE));  // a whole number
      return Status::usage(where + ".scale must be within [-" + bound + ", " + bound +
                           "] (1 is the adapter as trained), got " + preview(*scale));
    }
    r.lora.push_back({name->get<std::string>(), scale->get<double>()});
  }
  return {};
}

// `stop`: a string or an array of up to 4, none empty.
Status read_stop(const json& v, Request& r) {
  const json list = v.is_string() ? json::array({v}) : v;
  bool ok = list.is_array() && list.size() <= 4;
  for (size_t i = 0; ok && i < list.size(); ++i)
    ok = list[i].is_string() && !list[i].get_ref<const std::string&>().empty();
  if (!ok) return Status::usage("stop must be a non-empty string or an array of up to 4, got " + preview(v));
  for (const json& s : list) r.stop.push_back(s.get<std::string>());
  return {};
}

Status read_stream_options(const json& v, Request& r) {
  if (!v.is_object()) return Status::usage("stream_options must be an object, got " + preview(v));
  for (const auto& [key, value] : v.items()) {
    if (key != "include_usage")
      return Status::usage("stream_options has the key '" + key + "': the one served is include_usage");
    if (!value.is_null()) {
      Status s = read_bool(value, "stream_options.include_usage", &r.include_usage);
      if (!s.ok()) return s;
    }
  }
  return {};
}

Status read_max_tokens(const json& v, const std::string& key, Request& r) {
  int64_t n = 0;
  Status s = read_int(v, key, 1, kInt32Max, &n);
  if (s.ok()) r.max_tokens = n;
  return s;
}

// ---- what shapes the answer: constraints, logprobs, logit_bias, n ---------

// One constraint per request: two fields that each ask for one are refused.
Status set_constraint(Request& r, const std::string& field, int kind, std::string text) {
  if (r.constraint.kind != LS_CONSTRAINT_NONE)
    return Status::usage(field + " and " + r.constraint.field + " each constrain the answer: give one of them");
  r.constraint = {kind, std::move(text), field};
  return {};
}

// A JSON schema: an object (or true/false). What it says is checked when the
// request is prepared (the runtime compiles it), naming `field`.
Status read_schema(const json& v, const std::string& field, Request& r) {
  if (!v.is_object() && !v.is_boolean())
    return Status::usage(field + " must be a JSON schema (an object), got " + preview(v));
  return set_constraint(r, field, LS_CONSTRAINT_JSON_SCHEMA, v.dump());
}

// Keys of `v` outside `known`: the first, or "".
std::string unknown_key(const json& v, std::initializer_list<const char*> known) {
  for (const auto& [key, value] : v.items())
    if (std::none_of(known.begin(), known.end(), [&](const char* k) { return key == k; })) return key;
  return "";
}

// OpenAI's response_format: {"type": "text"}, {"type": "json_object"} (with
// llama-server's "schema" beside it: that schema), or {"type": "json_schema",
// "json_schema": {"name", "description", "schema", "strict"}}. strict or not,
// the answer is held to the schema.
Status read_response_format(const json& v, Request& r) {
  static const std::string kShapes =
      "{\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": "
      "{\"name\", \"schema\", \"strict\"}}";
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    return Status::usage("response_format must be " + kShapes + ", got " + preview(v));
  const std::string type = v["type"].get<std::string>();
  if (type != "text" && type != "json_object" && type != "json_schema")
    return Status::usage("response_format.type must be text, json_object or json_schema, got " + preview(v["type"]));
  const std::string extra = type == "text"          ? unknown_key(v, {"type"})
                            : type == "json_object" ? unknown_key(v, {"type", "schema"})
                                                    : unknown_key(v, {"type", "json_schema"});
  if (!extra.empty())
    return Status::usage("response_format has the key '" + extra + "' beside type " + type + ": it is " + kShapes);
  if (type == "text") return {};
  if (type == "json_object") {
    if (v.contains("schema") && !v["schema"].is_null()) return read_schema(v["schema"], "response_format.schema", r);
    return set_constraint(r, "response_format", LS_CONSTRAINT_JSON_OBJECT, "");
  }
  const json* spec = v.contains("json_schema") ? &v["json_schema"] : nullptr;
  if (spec == nullptr || !spec->is_object())
    return Status::usage("response_format.json_schema must be {\"name\", \"schema\", \"strict\"}, got " +
                         (spec == nullptr ? std::string("nothing") : preview(*spec)));
  const std::string key = unknown_key(*spec, {"name", "description", "schema", "strict"});
  if (!key.empty())
    return Status::usage("response_format.json_schema has the key '" + key +
                         "': it is {\"name\", \"description\", \"schema\", \"strict\"}");
  for (const char* text : {"name", "description"})
    if (spec->contains(text) && !(*spec)[text].is_null() && !(*spec)[text].is_string())
      return Status::usage(std::string("response_format.json_schema.") + text + " must be a string, got " +
                           preview((*spec)[text]));
  if (spec->contains("strict") && !(*spec)["strict"].is_null() && !(*spec)["strict"].is_boolean())
    return Status::usage("response_format.json_schema.strict must be true or false, got " + preview((*spec)["strict"]));
  if (!spec->contains("schema") || (*spec)["schema"].is_null())
    return Status::usage("response_format.json_schema.schema is missing: give the JSON schema the answer follows");
  return read_schema((*spec)["schema"], "response_format.json_schema.schema", r);
}

// llama-server's grammar: GBNF text, its root rule "root".
Status read_grammar(const json& v, Request& r) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty())
    return Status::usage("grammar must be a GBNF grammar (text, root rule 'root'), got " + preview(v));
  return set_constraint(r, "grammar", LS_CONSTRAINT_GRAMMAR, v.get<std::string>());
}

// logit_bias: {"token id": bias in [-100, 100]}; ids within the vocabulary
// are checked when the request is prepared.
Status read_logit_bias(const json& v, Request& r) {
  if (!v.is_object())
    return Status::usage("logit_bias must be an object of token ids (as strings) to numbers from -100 to 100, got " +
                         preview(v));
  for (const auto& [key, value] : v.items()) {
    const bool digits = !key.empty() && key.size() <= 18 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits)
      return Status::usage("logit_bias has the key '" + key.substr(0, 40) + "': keys are token ids (\"50256\")");
    double bias = 0;
    Status s = read_number(value, "logit_bias[\"" + key + "\"]", -100, 100, &bias);
    if (!s.ok()) return s;
    r.logit_bias_ids.push_back(std::stoll(key));
    r.logit_bias_values.push_back(bias);
  }
  return {};
}

// logprobs: chat's true/false; completions' integer 0..5 (the legacy field:
// that many likeliest tokens too).
Status read_logprobs(const json& v, Request& r) {
  if (r.kind == Kind::kChat || v.is_boolean()) return read_bool(v, "logprobs", &r.logprobs);
  int64_t top = 0;
  Status s = read_int(v, "logprobs", 0, 5, &top);
  if (!s.ok()) return s;
  r.logprobs = true;
  r.top_logprobs = static_cast<int>(top);
  return {};
}

// Tools answer chat requests only.
Status chat_only(const char* field, const Request& r) {
  if (r.kind == Kind::kChat) return {};
  return Status::usage(std::string(field) + " is for /v1/chat/completions (tools: the answer a call of a function)");
}

// ---- the table -------------------------------------------------------------

// One field of the body. `read` checks its value (never null: a null value
// is the field left out) and stores it in the Request; a field without
// `read` is not served: refused, with `why`, unless `noop` says its value
// changes nothing.
struct Field {
  const char* name;
  unsigned endpoints;
  Status (*read)(const json& value, Request& request);
  bool (*noop)(const json& value) = nullptr;
  const char* why = nullptr;
};

bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_one(const json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; }
bool is_empty(const json& v) { return (v.is_array() || v.is_object() || v.is_string()) && v.empty(); }
// {"type": "content", "content": a string or a list of text parts}, as OpenAI's prediction.
Status read_prediction(const json& v, Request& r) {
  if (!v.is_object() || !v.contains("type") || v["type"] != "content" || !v.contains("content"))
    return Status::usage("prediction must be {\"type\": \"content\", \"content\": the expected answer}, got " +
                         preview(v));
  for (const auto& [key, value] : v.items())
    if (key != "type" && key != "content")
      return Status::usage("prediction has an unknown field '" + key + "': give only type and content");
  std::string text;
  Status s = read_content(v["content"], "prediction.content", &text);
  if (!s.ok()) return s;
  r.prediction = std::move(text);
  return {};
}

bool is_never(const json&) { return false; }
bool is_none(const json& v) { return v == "none"; }
bool is_text_modality(const json& v) { return v.is_array() && v.size() == 1 && v[0] == "text"; }
Status accept(const json&, Request&) { return {}; }

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      {"model", kBoth, read_model},
      {"prompt", kCompletions, read_prompt},
      {"messages", kChats, read_messages},
      {"lora", kBoth, read_lora},
      {"max_tokens", kBoth, [](const json& v, Request& r) { return read_max_tokens(v, "max_tokens", r); }},
      // The newer chat name for max_tokens.
      {"max_completion_tokens", kChats,
       [](const json& v, Request& r) { return read_max_tokens(v, "max_completion_tokens", r); }},
      {"temperature", kBoth,
       [](const json& v, Request& r) { return read_number(v, "temperature", 0, 2, &r.temperature); }},
      {"seed", kBoth,
       [](const json& v, Request& r) {
         int64_t seed = 0;
         Status s = read_int(v, "seed", 0, std::numeric_limits<int64_t>::max(), &seed);
         r.seed = static_cast<uint64_t>(seed);
         return s;
       }},
      {"top_k", kBoth, [](const json& v, Request& r) { return read_int(v, "top_k", 0, kInt32Max, &r.top_k); }},
      {"top_p", kBoth, [](const json& v, Request& r) { return read_number(v, "top_p", 0, 1, &r.top_p); }},
      {"min_p", kBoth, [](const json& v, Request& r) { return read_number(v, "min_p", 0, 1, &r.min_p); }},
      {"presence_penalty", kBoth,
       [](const json& v, Request& r) { return read_number(v, "presence_penalty", -2, 2, &r.presence_penalty); }},
      {"frequency_penalty", kBoth,
       [](const json& v, Request& r) { return read_number(v, "frequency_penalty", -2, 2, &r.frequency_penalty); }},
      {"repeat_penalty", kBoth,
       [](const json& v, Request& r) { return read_number(v, "repeat_penalty", 0.01, 100, &r.repeat_penalty); }},
      // vLLM's and transformers' name for llama-server's repeat_penalty.
      {"repetition_penalty", kBoth,
       [](const json& v, Request& r) { return read_number(v, "repetition_penalty", 0.01, 100, &r.repeat_penalty); }},
      {"stop", kBoth, read_stop},
      {"stream", kBoth, [](const json& v, Request& r) { return read_bool(v, "stream", &r.stream); }},
      {"stream_options", kBoth, read_stream_options},
      {"ignore_eos", kBoth, [](const json& v, Request& r) { return read_bool(v, "ignore_eos", &r.ignore_eos); }},
      {"cache_prompt", kBoth, [](const json& v, Request& r) { return read_bool(v, "cache_prompt", &r.cache_prompt); }},
      // Structured output (docs/structured-output.md): one constraint a request.
      {"response_format", kBoth, read_response_format},
      // llama-server's extensions: a GBNF grammar, a JSON schema.
      {"grammar", kBoth, read_grammar},
      {"json_schema", kBoth, [](const json& v, Request& r) { return read_schema(v, "json_schema", r); }},
      {"logprobs", kBoth, read_logprobs},
      {"top_logprobs", kChats,
       [](const json& v, Request& r) {
         int64_t top = 0;
         Status s = read_int(v, "top_logprobs", 0, 20, &top);
         r.top_logprobs = static_cast<int>(top);
         return s;
       }},
      {"logit_bias", kBoth, read_logit_bias},
      {"n", kBoth,
       [](const json& v, Request& r) {
         int64_t n = 1;
         Status s = read_int(v, "n", 1, LS_MAX_PARALLEL, &n);
         r.n = static_cast<int>(n);
         return s;
       }},
      {"prediction", kBoth, read_prediction},
      {"speculative", kBoth, [](const json& v, Request& r) { return read_bool(v, "speculative", &r.speculative); }},
      // Accepted, and change nothing here.
      {"user", kBoth, accept},
      {"metadata", kBoth, accept},
      {"store", kBoth, accept},
      {"service_tier", kBoth, accept},
      // Tools are chat's (docs/structured-output.md, "Tools"); an answer holds one call. Taken by
      // both endpoints so that a completion's null is the field left out, as for every field.
      {"parallel_tool_calls", kBoth,
       [](const json& v, Request& r) {
         bool parallel = false;
         Status s = chat_only("parallel_tool_calls", r);
         return s.ok() ? read_bool(v, "parallel_tool_calls", &parallel) : s;
       }},
      {"tools", kBoth,
       [](const json& v, Request& r) {
         Status s = chat_only("tools", r);
         return s.ok() ? read_tools(v, &r.tools) : s;
       }},
      {"tool_choice", kBoth,
       [](const json& v, Request& r) {
         Status s = chat_only("tool_choice", r);
         return s.ok() ? read_tool_choice(v, &r.tools) : s;
       }},
      // Not served: they would change the answer. Taken by both endpoints, as
      // clients send them to either (refused by name rather than as unknown).
      {"best_of", kBoth, nullptr, is_one, "best_of must be 1: one answer per request is served"},
      {"echo", kBoth, nullptr, is_false, "echo is not served"},
      {"suffix", kBoth, nullptr, is_empty, "suffix (insertion) is not served"},
      {"functions", kBoth, nullptr, is_empty, "functions (OpenAI's older function calling) are not served: give tools"},
      {"function_call", kBoth, nullptr, is_none, "function_call is not served: give tool_choice"},
      {"modalities", kBoth, nullptr, is_text_modality, "modalities other than [\"text\"] are not served"},
      {"audio", kBoth, nullptr, is_never, "audio output is not served"},
  };
  return table;
}

const Field* find_field(const std::string& key) {
  for (const Field& f : fields())
    if (key == f.name) return &f;
  return nullptr;
}

}  // namespace

const char* endpoint(Kind kind) { return kind == Kind::kChat ? "/v1/chat/completions" : "/v1/completions"; }

StatusOr<Request> read_request(const json& body, Kind kind) {
  if (!body.is_object()) return Status::usage("the request body must be a JSON object, got " + preview(body));
  Request request;
  request.kind = kind;
  for (const auto& [key, value] : body.items()) {
    const Field* field = find_field(key);
    if (field == nullptr || !(field->endpoints & endpoint_bit(kind)))
      return Status::usage("unknown field '" + key + "' for " + endpoint(kind) +
                           ": this server does not read it, so it would change nothing; leave it out");
    if (value.is_null()) continue;
    if (field->read == nullptr) {
      if (field->noop(value)) continue;
      return Status::usage(std::string(field->why) + " (got " + key + ": " + preview(value) + "): leave it out");
    }
    Status s = field->read(value, request);
    if (!s.ok()) return s;
  }
  if (request.model.empty()) return Status::usage("model is missing: name one of the adapters GET /v1/models lists");
  if (kind == Kind::kChat && request.messages.empty())
    return Status::usage("messages is missing: give a non-empty array of {\"role\", \"content\"}");
  auto prompt = body.find("prompt");
  if (kind == Kind::kCompletion && (prompt == body.end() || prompt->is_null()))
    return Status::usage("prompt is missing: give a string or an array of token ids");
  if (request.top_logprobs > 0 && !request.logprobs) return Status::usage("top_logprobs needs logprobs: true");
  Status tools = check_tools(request.tools);
  if (!tools.ok()) return tools;
  // A call the answer must be: held to {"name", "arguments"} of the tools.
  if (request.tools.forced()) {
    tools = set_constraint(request, "tool_choice", LS_CONSTRAINT_JSON_SCHEMA, call_schema(request.tools));
    if (!tools.ok()) return tools;
  }
  if (!request.lora.empty() && request.model != "base")
    return Status::usage(
        "with lora, model must be 'base' (the mix of lora's adapters runs on the foundation alone), got '" +
        request.model + "'");
  return request;
}

}  // namespace lora_share::requests
