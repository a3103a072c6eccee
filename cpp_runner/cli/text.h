// Text in and out of the runner, through the library's public text API as
// any application has it: the runtime's tokenizer (bound to --ptd, or to the
// --tokenizer folder, when the runtime opened: runner_runtime.cpp), prompts
// encoded with it or rendered with its chat template, and generated ids
// decoded as they arrive, the build's EOS ids never text.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "flags.h"
#include "lora_share.h"
#include "runner_runtime.h"
#include "status.h"

namespace lora_share {

struct RunnerText {
  ls_tokenizer* tokenizer = nullptr;  // the runtime's, valid while it is open
  std::vector<int64_t> eos;           // the build's EOS ids
  bool chat = false;                  // the build has a chat template
};

// The runtime's tokenizer; nullopt when the build has none, unless
// `required`: then that is a usage error saying so.
StatusOr<std::optional<RunnerText>> runner_text(const RunnerRuntime& runtime, bool required);

// The ids of `text` with the tokenizer's special tokens (BOS where the model
// has one); `what` names the source in errors ("--prompt").
StatusOr<std::vector<int64_t>> encode_prompt(const RunnerText& text, const std::string& prompt,
                                             const std::string& what);

// The ids of one user message in the build's chat template, encoded without
// adding special tokens (the template writes them); `what` names the source.
StatusOr<std::vector<int64_t>> encode_chat(const RunnerText& text, const std::string& message, const std::string& what);

struct TextGeneration {
  Reply generation;  // its tokens end with the EOS id when one stopped it
  std::string text;  // the decoded tokens, special tokens and EOS ids skipped
};

// Generates `request` with `adapter` of `runtime`; `write`, if given,
// receives each new piece of text as soon as it is whole UTF-8. EOS ids are
// never text, even when they do not stop generation (--ignore-eos).
using TextWriter = std::function<void(const std::string& piece)>;
StatusOr<TextGeneration> generate_text(const RunnerRuntime& runtime, const AdapterView& adapter, const RunnerText& text,
                                       const GenerateRequest& request, const TextWriter& write);

}  // namespace lora_share
