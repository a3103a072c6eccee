#include "serve.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report.h"

namespace lora_share {
namespace {

using json = nlohmann::json;

using RequestPtr = std::unique_ptr<ls_request, void (*)(ls_request*)>;

// The line's JSON, nested no deeper than the library reads (a deeper line is
// refused while it is read, never built or walked).
StatusOr<json> parse_line(const std::string& line) {
  bool too_deep = false;
  json j = json::parse(
      line,
      [&too_deep](int depth, json::parse_event_t, json&) {
        if (depth >= LS_REQUEST_MAX_DEPTH) too_deep = true;
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  if (too_deep)
    return Status::usage("the line nests arrays and objects more than " + std::to_string(LS_REQUEST_MAX_DEPTH) +
                         " levels deep");
  if (j.is_discarded() || !j.is_object())
    return Status::usage("not a JSON object: " + line.substr(0, 80) + (line.size() > 80 ? "\xE2\x80\xA6" : ""));
  return j;
}

// The runner's line as the OpenAI body it means: its keys are fields of the
// one schema under other names, its defaults the flags'.
StatusOr<json> runner_body(const RunnerRuntime& runtime, const Options& options, const json& j, bool* chat) {
  static const char* kKeys[] = {"adapter", "prompt", "tokens", "messages", "max_new_tokens", "temperature", "seed"};
  for (const auto& item : j.items())
    if (std::find(std::begin(kKeys), std::end(kKeys), item.key()) == std::end(kKeys))
      return Status::usage("unknown key \"" + item.key() +
                           "\" (known: adapter, prompt, tokens, messages, max_new_tokens, temperature, seed; "
                           "or send an OpenAI body with \"model\")");
  if (!j.contains("adapter") || !j.at("adapter").is_string())
    return Status::usage("\"adapter\": give the adapter's name (loaded: " + runtime.names() + ")");
  if (j.contains("prompt") + j.contains("tokens") + j.contains("messages") != 1)
    return Status::usage(
        "give exactly one of \"prompt\" (text), \"tokens\" (a list of ids) or \"messages\" "
        "(a list of {\"role\", \"content\"}, in the build's chat template)");
  if (j.contains("prompt") && !j.at("prompt").is_string()) return Status::usage("\"prompt\": expected a string");
  if (j.contains("tokens") && (!j.at("tokens").is_array() || j.at("tokens").empty()))
    return Status::usage("\"tokens\": expected a non-empty list of token ids");
  json body = {{"model", j.at("adapter")},
               {"max_tokens", j.value("max_new_tokens", json(options.max_new_tokens))},
               {"seed", j.value("seed", json(options.seed))},
               {"ignore_eos", options.ignore_eos}};
  if (j.contains("temperature")) body["temperature"] = j.at("temperature");
  *chat = j.contains("messages");
  if (*chat)
    body["messages"] = j.at("messages");
  else
    body["prompt"] = j.contains("prompt") ? j.at("prompt") : j.at("tokens");
  return body;
}

// The schema's words for a runner line: its fields under the line's names.
std::string runner_words(std::string message) {
  static const std::pair<const char*, const char*> kNames[] = {{"max_tokens", "\"max_new_tokens\""},
                                                               {"model", "\"adapter\""}};
  for (const auto& [field, key] : kNames)
    if (message.rfind(field, 0) == 0) return key + message.substr(std::string(field).size());
  return message;
}

// Parses and prepares `body` (`chat`: a chat completion).
StatusOr<RequestPtr> prepared(const RunnerRuntime& runtime, const std::string& body, bool chat) {
  ls_error error;
  RequestPtr request(ls_request_parse(chat ? LS_REQUEST_CHAT : LS_REQUEST_COMPLETION, body.data(), body.size(), &error),
                     ls_request_free);
  if (!request || ls_request_prepare(runtime.handle(), request.get(), &error) != LS_OK)
    return Status::usage(error.message);
  return request;
}

// A runner line (TAB or JSON), run by the runner itself so that its answer
// carries the timings; `text` when the line is JSON and the build has a tokenizer.
std::string runner_answer(const RunnerRuntime& runtime, const Options& flags, const std::optional<RunnerText>& text,
                          const json& body, bool chat, bool is_json) {
  auto request = prepared(runtime, body.dump(), chat);
  if (!request.ok()) return error_json(runner_words(request.status().message()));
  const int64_t* ids = nullptr;
  size_t n = 0;
  const char* name = nullptr;
  ls_generate_options options;
  ls_error error;
  if (ls_request_generation(request->get(), &ids, &n, &name, &options, &error) != LS_OK)
    return error_json(error.message);
  // --temperature is the runner's own knob (any value >= 0: benchmarks
  // sample hot); a line's own temperature is the schema's field (0 to 2).
  if (!body.contains("temperature")) options.temperature = flags.temperature;
  const AdapterView* adapter = runtime.find(name);
  if (adapter == nullptr)
    return error_json(
        "adapter 'base' runs the foundation through the program the --pte files carry, which --stock does not "
        "load: drop --stock");
  // The seed is the request's, so an answer does not depend on what was
  // asked before it: the same request gets the same answer as a fresh run.
  GenerateRequest g{std::vector<int64_t>(ids, ids + n), options, /*keep_logits=*/false, "prompt"};
  if (is_json && text) {
    auto t = generate_text(runtime, *adapter, *text, g, nullptr);
    if (!t.ok()) return error_json(t.status().message());
    return serve_answer_json(*adapter, g.prompt, t->generation, t->text);
  }
  auto reply = runtime.generate(*adapter, g, nullptr);
  if (!reply.ok()) return error_json(reply.status().message());
  return serve_answer_json(*adapter, g.prompt, reply.value());
}

int collect_line(const char* event, size_t length, void* lines) {
  static_cast<std::vector<std::string>*>(lines)->emplace_back(event, length);
  return 0;
}

// An OpenAI body, answered as the server answers it: one line per event.
std::vector<std::string> openai_answer(const RunnerRuntime& runtime, const std::string& line, bool chat) {
  auto request = prepared(runtime, line, chat);
  if (!request.ok()) return {error_json(request.status().message())};
  std::vector<std::string> lines;
  ls_error error;
  if (ls_request_run(runtime.handle(), request->get(), collect_line, &lines, nullptr, &error) != LS_OK)
    return {error_json(error.message)};
  return lines;
}

// Answers one request line; returns the JSON lines to print.
std::vector<std::string> answer(const RunnerRuntime& runtime, const Options& options,
                                const std::optional<RunnerText>& text, const std::string& line) {
  const size_t first = line.find_first_not_of(" \t");
  if (first == std::string::npos || line[first] != '{') {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos)
      return {error_json("expected 'adapter<TAB>token ids' (e.g. 'a\\t1,17,42') or a JSON object")};
    auto ids = parse_token_list(line.substr(tab + 1), "token ids");
    if (!ids.ok()) return {error_json(ids.status().message())};
    const json body = {{"model", line.substr(0, tab)},
                       {"prompt", ids.value()},
                       {"max_tokens", options.max_new_tokens},
                       {"seed", options.seed},
                       {"ignore_eos", options.ignore_eos}};
    return {runner_answer(runtime, options, text, body, /*chat=*/false, /*is_json=*/false)};
  }
  auto j = parse_line(line);
  if (!j.ok()) return {error_json(j.status().message())};
  if (j->contains("model") && !j->contains("adapter")) return openai_answer(runtime, line, j->contains("messages"));
  bool chat = false;
  auto body = runner_body(runtime, options, j.value(), &chat);
  if (!body.ok()) return {error_json(body.status().message())};
  if (!text && (j->contains("prompt") || j->contains("messages"))) {
    ls_error error;  // the runtime says why the build has no tokenizer
    ls_runtime_tokenizer(runtime.handle(), &error);
    return {error_json(error.message)};
  }
  return {runner_answer(runtime, options, text, body.value(), chat, /*is_json=*/true)};
}

}  // namespace

Status serve(const RunnerRuntime& runtime, const Options& options, const std::optional<RunnerText>& text,
             std::istream& in, std::ostream& out) {
  // On stderr, so answers stay one JSON line each on stdout: tells a client
  // (and the benchmark, which reads memory right after) that loading is over.
  std::fprintf(stderr, "ready: %zu adapter(s) loaded in %.1f ms (%s arena): %s%s\n", runtime.adapters.size(),
               runtime.load_ms, runtime.loading.arena, runtime.names().c_str(), text ? "; tokenizer bound" : "");
  std::fflush(stderr);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // Flushed per line: the client waits for each answer before asking again.
    for (const std::string& answer_line : answer(runtime, options, text, line)) out << answer_line << std::endl;
    if (!out) return Status::failure("could not write the answer (stdout closed)");
  }
  return Status();
}

}  // namespace lora_share
