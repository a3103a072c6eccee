// lora-share runner: loads any number of adapter programs (.pte) against ONE
// shared foundation (.ptd) in one process and generates tokens.
//
//   parse flags -> load (foundation once, then every adapter) -> run -> report
//
// Every failure ends in one "error: ..." line on stderr: exit 2 for usage
// errors (flags, request), 1 for load/run errors.
#include <cstdio>
#include <iostream>

#include "et_platform.h"
#include "file_check.h"
#include "flags.h"
#include "generate.h"
#include "memory_stats.h"
#include "npy_writer.h"
#include "report.h"
#include "serve.h"
#include "session.h"

using namespace lora_share;

namespace {

int fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", printable(status.message()).c_str());
  return static_cast<int>(status.code());
}

// A single request from the command line.
Status run_once(const Session& session, const Options& options) {
  std::string name = options.adapter.empty() ? session.adapters.front()->name()
                                             : options.adapter;
  Adapter* adapter = session.find(name);
  if (adapter == nullptr)
    return Status::usage("--adapter '" + name + "': no such adapter (loaded: " +
                         session.names() + ")");
  Status s = check_request(options.tokens, options.max_new_tokens,
                           adapter->vocab_size(), adapter->max_seq_len());
  if (!s.ok()) return s;

  bool keep_logits = !options.dump_logits.empty();
  auto g = generate(*adapter, options.tokens, options.max_new_tokens,
                    options.temperature, options.seed, keep_logits);
  if (!g.ok()) return g.status();
  MemoryStats end = read_memory_stats();

  if (keep_logits) {
    s = write_npy_float32(options.dump_logits, g->logits, g->rows, g->vocab);
    if (!s.ok()) return s;
  }
  if (options.json) {
    std::printf("%s\n", run_json(session, *adapter, options.tokens, g.value(), end).c_str());
  } else {
    std::string ids;
    for (int64_t t : g->tokens) ids += (ids.empty() ? "" : " ") + std::to_string(t);
    std::printf("%s\n", ids.c_str());
    print_summary(stderr, session, *adapter, options.tokens, g.value(), end);
  }
  return Status();
}

}  // namespace

int main(int argc, char** argv) {
  auto options = parse_flags(argc, argv);
  if (!options.ok()) return fail(options.status());
  if (options->help) {
    std::fputs(usage_text(argv[0]).c_str(), stdout);
    return 0;
  }
  init_platform(options->verbose);

  auto session = load_session(options.value());
  if (!session.ok()) return fail(session.status());

  Status s = options->serve
                 ? serve(*session.value(), options.value(), std::cin, std::cout)
                 : run_once(*session.value(), options.value());
  if (!s.ok()) return fail(s);
  return std::fflush(stdout) == 0 ? 0 : fail(Status::failure("could not write to stdout"));
}
