#include "server_flags.h"

#include <sstream>
#include <vector>

#include "flag_table.h"
#include "lora_share.h"

namespace lora_share::server {
namespace {

Status parse_port(const std::string& text, int* port) {
  int64_t value = 0;
  if (!flags::parse_int64(text, &value) || value < 0 || value > 65535)
    return Status::usage("--port must be a number from 0 to 65535, got '" + text + "'");
  *port = static_cast<int>(value);
  return {};
}

Status parse_parallel(const std::string& text, int* parallel) {
  int64_t value = 0;
  if (!flags::parse_int64(text, &value) || value < 1 || value > LS_MAX_PARALLEL)
    return Status::usage("--parallel must be a number from 1 to " + std::to_string(LS_MAX_PARALLEL) +
                         " (requests run at once), got '" + text + "'");
  *parallel = static_cast<int>(value);
  return {};
}

Status parse_connections(const std::string& text, int* connections) {
  int64_t value = 0;
  if (!flags::parse_int64(text, &value) || value < 1 || value > 65536)
    return Status::usage("--max-connections must be a number from 1 to 65536, got '" + text + "'");
  *connections = static_cast<int>(value);
  return {};
}

// "10", "0.5": seconds, above 0 and at most a day.
Status set_seconds(const std::string& text, const char* flag, std::chrono::milliseconds* out) {
  double value = 0;
  if (!flags::parse_double(text, &value) || value < 0.001 || value > 86400)
    return Status::usage(std::string(flag) +
                         " must be a number of seconds above 0 and at most 86400 (e.g. 10 or 0.5), got '" + text + "'");
  *out = std::chrono::milliseconds(static_cast<int64_t>(value * 1000));
  return {};
}

Status set_size(const std::string& text, const char* flag, uint64_t* out) {
  auto bytes = flags::parse_size(text, flag);
  if (!bytes.ok()) return bytes.status();
  *out = bytes.value();
  return {};
}

// The table, in --help's order, writing into `o`.
std::vector<flags::Flag> table(ServerOptions& o) {
  return {
      {"dir", "DIR", "", "a lora-share build's output folder (manifest.json, foundation.ptd, *.pte); required",
       [&o](const std::string& v) {
         o.dir = v;
         return Status();
       }},
      {"host", "ADDR", "127.0.0.1", "address to listen on (127.0.0.1: this machine only)",
       [&o](const std::string& v) {
         o.host = v;
         return Status();
       }},
      {"port", "N", "8080", "port to listen on (0 = any free port, printed at start)",
       [&o](const std::string& v) { return parse_port(v, &o.port); }},
      {"memory-budget", "SIZE", "no budget",
       "keep only the adapters that fit SIZE (e.g. 600MiB) loaded, evicting the least recently used",
       [&o](const std::string& v) { return set_size(v, "--memory-budget", &o.memory_budget); }},
      {"parallel", "N", "4",
       "requests run at once, on any adapters, sharing each decode step (KV slots); more wait for a free slot",
       [&o](const std::string& v) { return parse_parallel(v, &o.parallel); }},
      {"max-body", "SIZE", "8MiB", "largest request body accepted (larger: 413)",
       [&o](const std::string& v) { return set_size(v, "--max-body", &o.max_body); }},
      {"header-timeout", "SECONDS", "10",
       "a request's head must arrive within this of the connection's start or its last answer; idle connections "
       "close then",
       [&o](const std::string& v) { return set_seconds(v, "--header-timeout", &o.header_timeout); }},
      {"body-timeout", "SECONDS", "30", "a request's body must arrive within this of its head",
       [&o](const std::string& v) { return set_seconds(v, "--body-timeout", &o.body_timeout); }},
      {"max-connections", "N", "256", "connections open at once; a new one closes the oldest idle or slow one",
       [&o](const std::string& v) { return parse_connections(v, &o.max_connections); }},
      {"drain-timeout", "SECONDS", "30",
       "on SIGTERM/SIGINT, the time the open requests have to finish; a second signal exits at once",
       [&o](const std::string& v) { return set_seconds(v, "--drain-timeout", &o.drain_timeout); }},
      {"packed-cache", "DIR", "DIR/.packed beside the deployment, else ~/.cache/lora-share/packed",
       "folder of the packed-weights file, written on the first start and mapped on later ones",
       [&o](const std::string& v) {
         o.packed_cache = v;
         return Status();
       }},
      {"no-packed-cache", nullptr, "", "pack the weights in memory at every start (no packed-weights file)",
       [&o](const std::string&) {
         o.no_packed_cache = true;
         return Status();
       }},
      {"no-speculation", nullptr, "",
       "no request verifies drafts (speculative decoding is on by default, --parallel 1 included: the same "
       "answers, faster on text the answer copies)",
       [&o](const std::string&) {
         o.no_speculation = true;
         return Status();
       }},
      {"every-draft", nullptr, "",
       "each step verifies every draft found, not as many as pay for the step's width on this machine "
       "(docs/batching.md): the same answers, with draft counts no timing moves (tests, comparisons)",
       [&o](const std::string&) {
         o.every_draft = true;
         return Status();
       }},
      {"help", nullptr, "", "print this help",
       [&o](const std::string&) {
         o.help = true;
         return Status();
       }},
  };
}

}  // namespace

StatusOr<ServerOptions> parse_server_flags(int argc, char** argv) {
  ServerOptions options;
  Status s = flags::parse(table(options), argc, argv);
  if (!s.ok()) return s;
  if (!options.packed_cache.empty() && options.no_packed_cache) {
    return Status::usage(
        "--packed-cache names the packed-weights file's folder, --no-packed-cache "
        "turns the file off: give one of them");
  }
  if (options.every_draft && options.no_speculation) {
    return Status::usage("--every-draft verifies every draft, --no-speculation verifies none: give one of them");
  }
  if (!options.help && options.dir.empty()) {
    return Status::usage("--dir is required: the output folder of `lora-share build`");
  }
  return options;
}

std::string server_usage(const char* program) {
  std::ostringstream out;
  out << "usage: " << program
      << " --dir OUT_DIR [--host 127.0.0.1] [--port 8080] [--parallel 4] [--memory-budget SIZE]\n\n"
      << "A local OpenAI-compatible server over one lora-share deployment: the request's \"model\"\n"
      << "names the adapter. Up to --parallel requests run at once, each on its own adapter (or the\n"
      << "same one) and KV slot, batched into one decode step; a slot keeps a request's tokens, so a\n"
      << "later request on the same adapter that starts with them (a chat's next turn) continues\n"
      << "from there. A client that hangs up frees its slot at the next step.\n\n"
      << "  POST /v1/completions       {\"model\": \"a\", \"prompt\": \"...\" | [ids], \"max_tokens\": 16, \"stream\": "
         "false}\n"
      << "  POST /v1/chat/completions  {\"model\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}\n"
      << "  GET  /v1/models            the deployment's adapters, and base (the foundation alone)\n"
      << "  GET  /v1/models/ID         one of them (404 for an id it does not serve)\n"
      << "  GET  /v1/stats             slots, batch sizes, prefix hits, requests served, adapters, memory\n"
      << "  GET  /health\n\n"
      << "Temperature defaults to 0 (greedy), so answers are reproducible. Text prompts need a build\n"
      << "with a tokenizer; without one, give \"prompt\" as token ids.\n\n"
      << "example:\n"
      << "  " << program << " --dir out/llama_adapters --port 8080 --memory-budget 600MiB\n"
      << "  curl 127.0.0.1:8080/v1/completions -d '{\"model\": \"counter\", \"prompt\": \"1 2 3\", \"stream\": "
         "true}'\n\n"
      << "flags:\n";
  ServerOptions defaults;
  out << flags::help(table(defaults), 28);
  return out.str();
}

}  // namespace lora_share::server
