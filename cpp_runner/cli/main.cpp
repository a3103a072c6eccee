// lora-share runner: loads any number of adapter programs (.pte) against ONE
// shared foundation (.ptd) in one process and generates tokens (and text,
// with the build's tokenizer).
//
//   parse flags -> load (foundation once, the build's tokenizer, then every
//   adapter) -> run -> report
//
// Every failure ends in one "error: ..." line on stderr: exit 2 for usage
// errors (flags, request), 1 for load/run errors.
#include <cstdio>
#include <iostream>

#include "file_check.h"
#include "flags.h"
#include "lora_share_diag.h"
#include "npy_writer.h"
#include "program_mode.h"
#include "report.h"
#include "runner_runtime.h"
#include "serve.h"
#include "text.h"

using namespace lora_share;

namespace {

int fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", printable(status.message()).c_str());
  return static_cast<int>(status.code());
}

void write_stdout(const std::string& piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);  // a reader sees the text as it is generated
}

// The prompt ids: --tokens as given, or --prompt / --chat encoded with the
// build's tokenizer.
StatusOr<std::vector<int64_t>> prompt_ids(const Options& options, const std::optional<RunnerText>& text) {
  if (!options.prompt_given) return options.tokens;
  if (!options.chat) return encode_prompt(*text, options.prompt, "--prompt");
  return encode_chat(*text, options.prompt, "--chat");
}

// A single request from the command line.
Status run_once(const RunnerRuntime& runtime, const Options& options, const std::optional<RunnerText>& tokenizer) {
  std::string name = options.adapter.empty() ? runtime.adapters.front().name : options.adapter;
  const AdapterView* adapter = runtime.find(name);
  if (adapter == nullptr && name == LS_BASE_NAME)
    return Status::usage(
        "--adapter base runs the foundation through the program the --pte files "
        "carry, which --stock does not load: drop --stock");
  if (adapter == nullptr)
    return Status::usage("--adapter '" + name + "': no such adapter (loaded: " + runtime.names() + ")");
  auto prompt = prompt_ids(options, tokenizer);
  if (!prompt.ok()) return prompt.status();
  // The library checks the request (ids, context) before it generates.
  GenerateRequest request{prompt.value(), flag_options(options),
                          /*keep_logits=*/!options.dump_logits.empty(), options.prompt_given ? "--prompt" : "--tokens"};

  std::optional<std::string> text;
  StatusOr<Reply> g = Status::failure("not generated");
  if (options.prompt_given) {
    auto t =
        generate_text(runtime, *adapter, *tokenizer, request, options.json ? TextWriter() : TextWriter(write_stdout));
    if (!t.ok()) return t.status();
    text = std::move(t->text);
    g = std::move(t->generation);
  } else {
    g = runtime.generate(*adapter, request, nullptr);
  }
  if (!g.ok()) return g.status();
  ls_diag_memory end;
  ls_diag_memory_stats(&end);

  if (request.keep_logits) {
    Status s = write_npy_float32(options.dump_logits, g->logits, g->rows, g->vocab);
    if (!s.ok()) return s;
  }
  if (options.json) {
    std::printf("%s\n", run_json(runtime, *adapter, prompt.value(), g.value(), end, text).c_str());
  } else {
    std::string ids;
    for (int64_t t : g->tokens) ids += (ids.empty() ? "" : " ") + std::to_string(t);
    // With --prompt the text went out as it came: end its line; the ids are
    // in the summary's company on stderr.
    // Flushed before stderr is written, so a terminal shows the line ended.
    if (text)
      std::printf("\n");
    else
      std::printf("%s\n", ids.c_str());
    std::fflush(stdout);
    if (text) std::fprintf(stderr, "tokens: %s\n", ids.c_str());
    // A chat-trained model given raw text often answers with its end-of-turn
    // at once: say why the line is empty and what to ask with instead.
    if (text && text->empty() && !options.chat && tokenizer->chat) {
      std::fprintf(stderr,
                   "note: the answer ended at once: this build's model has a chat template, and --prompt "
                   "gives it raw text; ask with --chat '%s' instead\n",
                   options.prompt.c_str());
    }
    print_summary(stderr, runtime, *adapter, prompt.value(), g.value(), end);
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
  ls_diag_init_process(options->verbose);
  if (!options->inputs.empty()) {
    Status s = run_program_mode(options.value());
    if (!s.ok()) return fail(s);
    return std::fflush(stdout) == 0 ? 0 : fail(Status::failure("could not write to stdout"));
  }

  // The runtime binds the build's tokenizer when it opens, before any
  // adapter loads, for --prompt (required) and --serve (optional: text
  // requests need it, ids do not; a --tokenizer folder must have one).
  auto runtime = RunnerRuntime::load(options.value());
  if (!runtime.ok()) return fail(runtime.status());
  std::optional<RunnerText> tokenizer;
  if (options->prompt_given || options->serve) {
    auto text = runner_text(*runtime.value(), options->prompt_given || !options->tokenizer_dir.empty());
    if (!text.ok()) return fail(text.status());
    tokenizer = std::move(text.value());
  }
  Status s = options->serve ? serve(*runtime.value(), options.value(), tokenizer, std::cin, std::cout)
                            : run_once(*runtime.value(), options.value(), tokenizer);
  if (!s.ok()) return fail(s);
  return std::fflush(stdout) == 0 ? 0 : fail(Status::failure("could not write to stdout"));
}
