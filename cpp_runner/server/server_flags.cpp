#include "server_flags.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <vector>

#include "lora_share.h"

namespace lora_share::server {
namespace {

struct Flag {
  const char* name;
  const char* value;  // nullptr: a switch
  const char* help;
  std::function<Status(ServerOptions&, const std::string&)> set;
};

Status parse_port(const std::string& text, int* port) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 0 || value > 65535) {
    return Status::usage("--port must be a number from 0 to 65535, got '" + text + "'");
  }
  *port = static_cast<int>(value);
  return {};
}

Status parse_parallel(const std::string& text, int* parallel) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 1 || value > LS_MAX_PARALLEL) {
    return Status::usage("--parallel must be a number from 1 to " + std::to_string(LS_MAX_PARALLEL) +
                         " (requests run at once), got '" + text + "'");
  }
  *parallel = static_cast<int>(value);
  return {};
}

Status parse_connections(const std::string& text, int* connections) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 1 || value > 65536) {
    return Status::usage("--max-connections must be a number from 1 to 65536, got '" + text + "'");
  }
  *connections = static_cast<int>(value);
  return {};
}

Status set_seconds(const std::string& text, const std::string& flag, std::chrono::milliseconds* out) {
  auto value = parse_seconds(text, flag);
  if (!value.ok()) return value.status();
  *out = value.value();
  return {};
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {"--dir", "DIR", "a lora-share build's output folder (manifest.json, foundation.ptd, *.pte); required",
       [](ServerOptions& o, const std::string& v) {
         o.dir = v;
         return Status();
       }},
      {"--host", "ADDR", "address to listen on (default 127.0.0.1: this machine only)",
       [](ServerOptions& o, const std::string& v) {
         o.host = v;
         return Status();
       }},
      {"--port", "N", "port to listen on (default 8080; 0 = any free port, printed at start)",
       [](ServerOptions& o, const std::string& v) { return parse_port(v, &o.port); }},
      {"--memory-budget", "SIZE",
       "keep only the adapters that fit SIZE (e.g. 600MiB) loaded, evicting the least recently used "
       "(default: no budget)",
       [](ServerOptions& o, const std::string& v) {
         auto bytes = parse_size(v, "--memory-budget");
         if (!bytes.ok()) return bytes.status();
         o.memory_budget = bytes.value();
         return Status();
       }},
      {"--parallel", "N",
       "requests run at once, on any adapters, sharing each decode step (KV slots; default 4); more "
       "wait for a free slot",
       [](ServerOptions& o, const std::string& v) { return parse_parallel(v, &o.parallel); }},
      {"--max-body", "SIZE", "largest request body accepted (default 8MiB)",
       [](ServerOptions& o, const std::string& v) {
         auto bytes = parse_size(v, "--max-body");
         if (!bytes.ok()) return bytes.status();
         o.max_body = bytes.value();
         return Status();
       }},
      {"--header-timeout", "SECONDS",
       "a request's head must arrive within this of the connection's start or its last answer; "
       "idle connections close then (default 10)",
       [](ServerOptions& o, const std::string& v) { return set_seconds(v, "--header-timeout", &o.header_timeout); }},
      {"--body-timeout", "SECONDS", "a request's body must arrive within this of its head (default 30)",
       [](ServerOptions& o, const std::string& v) { return set_seconds(v, "--body-timeout", &o.body_timeout); }},
      {"--max-connections", "N", "connections open at once; a new one closes the oldest idle or slow one (default 256)",
       [](ServerOptions& o, const std::string& v) { return parse_connections(v, &o.max_connections); }},
      {"--drain-timeout", "SECONDS",
       "on SIGTERM/SIGINT, the time the open requests have to finish; a second signal exits at once "
       "(default 30)",
       [](ServerOptions& o, const std::string& v) { return set_seconds(v, "--drain-timeout", &o.drain_timeout); }},
      {"--packed-cache", "DIR",
       "folder of the packed-weights file, written on the first start and mapped on later ones "
       "(default: DIR/.packed beside the deployment, else ~/.cache/lora-share/packed)",
       [](ServerOptions& o, const std::string& v) {
         o.packed_cache = v;
         return Status();
       }},
      {"--no-packed-cache", nullptr, "pack the weights in memory at every start (no packed-weights file)",
       [](ServerOptions& o, const std::string&) {
         o.no_packed_cache = true;
         return Status();
       }},
      {"--help", nullptr, "print this help",
       [](ServerOptions& o, const std::string&) {
         o.help = true;
         return Status();
       }},
  };
  return table;
}

}  // namespace

StatusOr<std::chrono::milliseconds> parse_seconds(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value < 0.001 || value > 86400) {
    return Status::usage(flag + " must be a number of seconds above 0 and at most 86400 (e.g. 10 or 0.5), got '" +
                         text + "'");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(value * 1000));
}

StatusOr<uint64_t> parse_size(const std::string& text, const std::string& flag) {
  static const std::vector<std::pair<std::string, double>> units = {{"GiB", 1024.0 * 1024 * 1024},
                                                                    {"MiB", 1024.0 * 1024},
                                                                    {"KiB", 1024.0},
                                                                    {"GB", 1e9},
                                                                    {"MB", 1e6},
                                                                    {"KB", 1e3},
                                                                    {"B", 1},
                                                                    {"", 1}};
  for (const auto& [suffix, scale] : units) {
    if (text.size() < suffix.size() || text.compare(text.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string number = text.substr(0, text.size() - suffix.size());
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (number.empty() || *end != '\0' || !std::isfinite(value) || value < 0 || value * scale > 1.8e19) {
      break;
    }
    return static_cast<uint64_t>(value * scale);
  }
  return Status::usage(flag + " must be a size such as 600MiB, 1.5GiB or 800000000, got '" + text + "'");
}

StatusOr<ServerOptions> parse_server_flags(int argc, char** argv) {
  ServerOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const Flag* flag = nullptr;
    for (const Flag& f : flags()) {
      if (arg == f.name) flag = &f;
    }
    if (flag == nullptr) return Status::usage("unknown flag '" + arg + "' (see --help)");
    std::string value;
    if (flag->value != nullptr) {
      if (i + 1 >= argc) return Status::usage(arg + " needs a value: " + flag->value);
      value = argv[++i];
    }
    Status s = flag->set(options, value);
    if (!s.ok()) return s;
  }
  if (!options.packed_cache.empty() && options.no_packed_cache) {
    return Status::usage(
        "--packed-cache names the packed-weights file's folder, --no-packed-cache "
        "turns the file off: give one of them");
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
      << "  GET  /v1/stats             slots, batch sizes, prefix hits, requests served, adapters, memory\n"
      << "  GET  /health\n\n"
      << "Temperature defaults to 0 (greedy), so answers are reproducible. Text prompts need a build\n"
      << "with a tokenizer; without one, give \"prompt\" as token ids.\n\n"
      << "example:\n"
      << "  " << program << " --dir out/llama_adapters --port 8080 --memory-budget 600MiB\n"
      << "  curl 127.0.0.1:8080/v1/completions -d '{\"model\": \"counter\", \"prompt\": \"1 2 3\", \"stream\": "
         "true}'\n\n"
      << "flags:\n";
  for (const Flag& f : flags()) {
    std::string left = std::string("  ") + f.name + (f.value ? std::string(" ") + f.value : "");
    out << left << std::string(left.size() < 24 ? 24 - left.size() : 1, ' ') << f.help << "\n";
  }
  return out.str();
}

}  // namespace lora_share::server
