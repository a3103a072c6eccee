// build/lora-share-server's command line: one table (server_flags.cpp, read
// by flags/flag_table.h as the runner's is) holds every flag's name, default
// and help, so --help and the parser agree.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "status.h"

namespace lora_share::server {

struct ServerOptions {
  std::string dir;                 // --dir: a lora-share build's output folder
  std::string host = "127.0.0.1";  // --host: loopback unless asked otherwise
  int port = 8080;                 // --port (0: any free port, printed)
  uint64_t memory_budget = 0;      // --memory-budget (0: every adapter may stay loaded)
  uint64_t max_body = 8ull << 20;  // --max-body: larger request bodies get 413
  int parallel = 4;                // --parallel: requests run at once (ls_options.parallel)
  std::string packed_cache;        // --packed-cache: the packed-weights file's folder ("" = default)
  bool no_packed_cache = false;    // --no-packed-cache
  bool no_speculation = false;     // --no-speculation (ls_options.speculation 0)
  bool every_draft = false;        // --every-draft (LS_SPECULATION_EVERY_DRAFT)
  // Slow clients and stopping (transport.h, signals.h).
  std::chrono::milliseconds header_timeout{10000};  // --header-timeout: a request's head, in total
  std::chrono::milliseconds body_timeout{30000};    // --body-timeout: its body, in total, after the head
  std::chrono::milliseconds drain_timeout{30000};   // --drain-timeout: the first signal's grace period
  int max_connections = 256;                        // --max-connections
  bool help = false;
};

StatusOr<ServerOptions> parse_server_flags(int argc, char** argv);
std::string server_usage(const char* program);

}  // namespace lora_share::server
