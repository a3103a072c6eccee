#include "serve.h"

#include <cstdio>
#include <string>

#include "generate.h"
#include "report.h"

namespace lora_share {
namespace {

// Answers one request line; returns the JSON line to print.
std::string answer(const Session& session, const Options& options,
                   const std::string& line) {
  size_t tab = line.find('\t');
  if (tab == std::string::npos)
    return error_json("expected 'adapter<TAB>token ids', e.g. 'a\\t1,17,42'");
  std::string name = line.substr(0, tab);
  Adapter* adapter = session.find(name);
  if (adapter == nullptr)
    return error_json("unknown adapter '" + name + "' (loaded: " +
                      session.names() + ")");
  auto prompt = parse_token_list(line.substr(tab + 1), "token ids");
  if (!prompt.ok()) return error_json(prompt.status().message());
  Status s = check_request(prompt.value(), options.max_new_tokens,
                           adapter->vocab_size(), adapter->max_seq_len(),
                           "token ids");
  if (!s.ok()) return error_json(s.message());
  // The seed is reset per request so an answer does not depend on what was
  // asked before it: the same request gets the same answer as a fresh run.
  auto g = generate(*adapter, prompt.value(), options.max_new_tokens,
                    options.temperature, options.seed, /*keep_logits=*/false);
  if (!g.ok()) return error_json(g.status().message());
  return serve_answer_json(*adapter, prompt.value(), g.value());
}

}  // namespace

Status serve(const Session& session, const Options& options, std::istream& in,
             std::ostream& out) {
  // On stderr, so answers stay one JSON line each on stdout: tells a client
  // (and the benchmark, which reads memory right after) that loading is over.
  std::fprintf(stderr, "ready: %zu adapter(s) loaded in %.1f ms (%s arena): %s\n",
               session.adapters.size(), session.load_ms, session.arena.c_str(),
               session.names().c_str());
  std::fflush(stderr);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // Flushed per line: the client waits for each answer before asking again.
    out << answer(session, options, line) << std::endl;
    if (!out) return Status::failure("could not write the answer (stdout closed)");
  }
  return Status();
}

}  // namespace lora_share
