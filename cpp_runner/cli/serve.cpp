#include "serve.h"

#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "report.h"
#include "text.h"

namespace lora_share {
namespace {

using json = nlohmann::json;

// One request, whichever format it came in.
struct Request {
  const AdapterView* adapter = nullptr;
  std::vector<int64_t> prompt;
  bool is_text = false;  // the prompt came as text
  int64_t max_new_tokens = 0;
  double temperature = 0;
  uint64_t seed = 0;
};

StatusOr<const AdapterView*> find_adapter(const RunnerRuntime& runtime, const std::string& name) {
  const AdapterView* adapter = runtime.find(name);
  if (adapter == nullptr)
    return Status::usage(name == LS_BASE_NAME
                             ? "adapter 'base' runs the foundation through the program the --pte files "
                               "carry, which --stock does not load: drop --stock"
                             : "unknown adapter '" + name + "' (loaded: " + runtime.names() +
                                   "; 'base' is the foundation alone)");
  return adapter;
}

StatusOr<Request> parse_tab_line(const RunnerRuntime& runtime, const Options& options, const std::string& line) {
  size_t tab = line.find('\t');
  if (tab == std::string::npos)
    return Status::usage("expected 'adapter<TAB>token ids' (e.g. 'a\\t1,17,42') or a JSON object");
  Request r{nullptr, {}, false, options.max_new_tokens, options.temperature, options.seed};
  auto adapter = find_adapter(runtime, line.substr(0, tab));
  if (!adapter.ok()) return adapter.status();
  r.adapter = adapter.value();
  auto prompt = parse_token_list(line.substr(tab + 1), "token ids");
  if (!prompt.ok()) return prompt.status();
  r.prompt = std::move(prompt.value());
  return r;
}

// The optional numeric fields, each checked like its flag.
Status read_settings(const json& j, Request& r) {
  if (j.contains("max_new_tokens")) {
    const json& v = j.at("max_new_tokens");
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      return Status::usage("\"max_new_tokens\": expected an integer >= 1");
    r.max_new_tokens = v.get<int64_t>();
  }
  if (j.contains("temperature")) {
    const json& v = j.at("temperature");
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      return Status::usage("\"temperature\": expected a finite number >= 0");
    r.temperature = v.get<double>();
  }
  if (j.contains("seed")) {
    const json& v = j.at("seed");
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return Status::usage("\"seed\": expected an integer >= 0");
    r.seed = v.get<uint64_t>();
  }
  return Status();
}

StatusOr<std::vector<int64_t>> read_tokens(const json& v) {
  if (!v.is_array() || v.empty()) return Status::usage("\"tokens\": expected a non-empty list of token ids");
  std::vector<int64_t> ids;
  for (const json& id : v) {
    if (!id.is_number_integer()) return Status::usage("\"tokens\": expected integer token ids");
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

StatusOr<Request> parse_json_line(const RunnerRuntime& runtime, const Options& options,
                                  const tok::BoundTokenizer* tokenizer, const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::usage("not a JSON object: " + line);
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (key != "adapter" && key != "prompt" && key != "tokens" && key != "messages" && key != "max_new_tokens" &&
        key != "temperature" && key != "seed")
      return Status::usage("unknown key \"" + key +
                           "\" (known: adapter, prompt, tokens, messages, max_new_tokens, "
                           "temperature, seed)");
  }
  if (!j.contains("adapter") || !j.at("adapter").is_string())
    return Status::usage("\"adapter\": give the adapter's name (loaded: " + runtime.names() + ")");
  Request r{nullptr, {}, false, options.max_new_tokens, options.temperature, options.seed};
  auto adapter = find_adapter(runtime, j.at("adapter").get<std::string>());
  if (!adapter.ok()) return adapter.status();
  r.adapter = adapter.value();
  Status s = read_settings(j, r);
  if (!s.ok()) return s;
  if (j.contains("prompt") + j.contains("tokens") + j.contains("messages") != 1)
    return Status::usage(
        "give exactly one of \"prompt\" (text), \"tokens\" (a list of ids) or \"messages\" "
        "(a list of {\"role\", \"content\"}, in the build's chat template)");
  if (j.contains("messages")) {
    if (tokenizer == nullptr) return Status::usage(tok::no_tokenizer_message(tokenizer_folder(options)));
    const json& m = j.at("messages");
    std::vector<tok::ChatTurn> turns;
    for (const json& turn : m.is_array() ? m : json::array()) {
      if (!turn.is_object() || !turn.contains("role") || !turn["role"].is_string() || !turn.contains("content") ||
          !turn["content"].is_string())
        return Status::usage("\"messages\": each needs a string \"role\" and \"content\"");
      turns.push_back({turn["role"].get<std::string>(), turn["content"].get<std::string>()});
    }
    if (turns.empty()) return Status::usage("\"messages\": expected a non-empty list of {\"role\", \"content\"}");
    auto ids = encode_chat(*tokenizer, turns, "\"messages\"");
    if (!ids.ok()) return ids.status();
    r.prompt = std::move(ids.value());
    r.is_text = true;
    return r;
  }
  if (j.contains("tokens")) {
    auto ids = read_tokens(j.at("tokens"));
    if (!ids.ok()) return ids.status();
    r.prompt = std::move(ids.value());
    return r;
  }
  if (!j.at("prompt").is_string()) return Status::usage("\"prompt\": expected a string");
  if (tokenizer == nullptr) return Status::usage(tok::no_tokenizer_message(tokenizer_folder(options)));
  auto ids = encode_prompt(*tokenizer, j.at("prompt").get<std::string>(), "\"prompt\"");
  if (!ids.ok()) return ids.status();
  r.prompt = std::move(ids.value());
  r.is_text = true;
  return r;
}

// Answers one request line; returns the JSON line to print.
std::string answer(const RunnerRuntime& runtime, const Options& options, const tok::BoundTokenizer* tokenizer,
                   const std::string& line) {
  size_t first = line.find_first_not_of(" \t");
  bool is_json = first != std::string::npos && line[first] == '{';
  auto request = is_json ? parse_json_line(runtime, options, tokenizer, line) : parse_tab_line(runtime, options, line);
  if (!request.ok()) return error_json(request.status().message());
  Request& r = request.value();
  // The seed is reset per request so an answer does not depend on what was
  // asked before it: the same request gets the same answer as a fresh run.
  // The library checks the request before it generates.
  GenerateRequest g_request{r.prompt,
                            r.max_new_tokens,
                            r.temperature,
                            r.seed,
                            stop_ids_for(options, tokenizer),
                            /*keep_logits=*/false,
                            r.is_text ? "prompt" : "token ids"};
  if (r.is_text) {
    auto t = generate_text(runtime, *r.adapter, *tokenizer, g_request, nullptr);
    if (!t.ok()) return error_json(t.status().message());
    return serve_answer_json(*r.adapter, r.prompt, t->generation, t->text);
  }
  auto g = runtime.generate(*r.adapter, g_request, nullptr);
  if (!g.ok()) return error_json(g.status().message());
  // Ids in, ids out (stopping at EOS, as with --tokens); the text too when the
  // build has a tokenizer and the request was JSON (the TAB answers stay as they were).
  std::optional<std::string> text;
  if (is_json && tokenizer != nullptr) text = tokenizer->tokenizer.decode(g->tokens, /*skip_special_tokens=*/true);
  return serve_answer_json(*r.adapter, r.prompt, g.value(), text);
}

}  // namespace

Status serve(const RunnerRuntime& runtime, const Options& options, const tok::BoundTokenizer* tokenizer,
             std::istream& in, std::ostream& out) {
  // On stderr, so answers stay one JSON line each on stdout: tells a client
  // (and the benchmark, which reads memory right after) that loading is over.
  std::fprintf(stderr, "ready: %zu adapter(s) loaded in %.1f ms (%s arena): %s%s\n", runtime.adapters.size(),
               runtime.load_ms, runtime.loading.arena, runtime.names().c_str(), tokenizer ? "; tokenizer bound" : "");
  std::fflush(stderr);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // Flushed per line: the client waits for each answer before asking again.
    out << answer(runtime, options, tokenizer, line) << std::endl;
    if (!out) return Status::failure("could not write the answer (stdout closed)");
  }
  return Status();
}

}  // namespace lora_share
