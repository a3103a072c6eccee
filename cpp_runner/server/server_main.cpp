// build/lora-share-server: parse flags -> open the deployment -> listen ->
// serve until SIGINT/SIGTERM has drained it (signals.h).
#include <algorithm>
#include <csignal>
#include <fstream>
#include <iostream>
#include <memory>

#include "http_app.h"
#include "manifest.h"
#include "server_flags.h"
#include "signals.h"
#include "transport.h"

namespace ls = lora_share;
namespace srv = lora_share::server;

namespace {

int fail(const ls::Status& status) {
  std::cerr << "error: " << status.message() << "\n";
  return static_cast<int>(status.code());
}

// The runtime for the deployment folder, under the budget, its tokenizer
// bound now: a tokenizer that is not the foundation's is refused at start,
// not at the first text request.
ls::StatusOr<ls_runtime*> open_runtime(const srv::ServerOptions& options) {
  const std::string manifest = options.dir + "/manifest.json";
  if (!std::ifstream(manifest))
    return ls::Status::usage(manifest + ": no such file: --dir must be the output folder of `lora-share build`");
  // A manifest of another format or version is the folder given wrongly
  // (exit 2, as every reader of the file: schema/FORMAT.md); the library
  // reports it as a load error among the others.
  auto readable = ls::parse_manifest(manifest);
  if (!readable.ok()) return readable.status();
  ls_options opts;
  ls_options_init(&opts);
  opts.budget_bytes = options.memory_budget;
  opts.parallel = options.parallel;
  opts.packed_cache = options.no_packed_cache ? 0 : 1;
  opts.speculation = options.no_speculation ? LS_SPECULATION_OFF
                     : options.every_draft  ? LS_SPECULATION_EVERY_DRAFT
                                            : LS_SPECULATION_ON;
  opts.packed_cache_dir = options.packed_cache.empty() ? nullptr : options.packed_cache.c_str();
  ls_error err;
  ls_runtime* runtime = ls_open_dir(options.dir.c_str(), &opts, &err);
  if (runtime == nullptr) {
    return err.code == LS_ERR_ARGUMENT || err.code == LS_ERR_BUDGET ? ls::Status::usage(err.message)
                                                                    : ls::Status::failure(err.message);
  }
  // A build without a tokenizer serves token ids (LS_ERR_NOT_FOUND); files
  // that do not go with the foundation are the folder's fault.
  if (ls_runtime_tokenizer(runtime, &err) == nullptr && err.code != LS_ERR_NOT_FOUND) {
    const ls::Status refused = ls::Status::usage(err.message);
    ls_close(runtime);
    return refused;
  }
  return runtime;
}

}  // namespace

int main(int argc, char** argv) {
  auto options = srv::parse_server_flags(argc, argv);
  if (!options.ok()) return fail(options.status());
  if (options->help) {
    std::cout << srv::server_usage(argv[0]);
    return 0;
  }
  // Before any thread starts, so every thread inherits the signal mask.
  srv::StopSignals stop_signals;
  stop_signals.watch(options->drain_timeout);
  std::signal(SIGPIPE, SIG_IGN);  // a client that left is a failed write, not a dead server

  auto runtime = open_runtime(*options);
  if (!runtime.ok()) return fail(runtime.status());
  srv::App app(runtime.value(), options->dir);
  // Adapters added to the folder are served within a second, no restart.
  app.watch_folder(std::chrono::milliseconds(500));

  // One thread reads every connection and hands the workers whole requests
  // only: a slow or idle client holds no thread (transport.h). Threads for
  // the --parallel requests running, as many waiting for a slot, and spare
  // ones so /health and /v1/stats answer while every slot is busy.
  srv::TransportOptions limits;
  limits.max_body = options->max_body;
  limits.header_timeout = options->header_timeout;
  limits.body_timeout = options->body_timeout;
  limits.max_connections = static_cast<size_t>(options->max_connections);
  limits.workers = std::max<size_t>(8, 2 * options->parallel + 4);
  srv::Transport transport(limits);
  app.install(transport.routes());
  auto port = transport.listen(options->host, options->port);
  if (!port.ok()) return fail(port.status());
  stop_signals.on_first([&transport] { transport.drain(); });
  std::cerr << "listening on http://" << options->host << ":" << port.value() << " (" << options->dir << ")"
            << std::endl;
  transport.serve();
  return 0;
}
