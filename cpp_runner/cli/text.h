// Text in and out of the runner: the build's tokenizer bound to --ptd
// (tokenizer/binding.h), prompts encoded with it, and generation that stops
// at the end-of-sequence ids and decodes as tokens arrive.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "binding.h"
#include "flags.h"
#include "runner_runtime.h"
#include "status.h"

namespace lora_share {

// The folder --tokenizer names, else the --ptd's.
std::string tokenizer_folder(const Options& options);

// The tokenizer of the --ptd's build; nullopt when that folder has none (or
// there is no --ptd). A tokenizer from another build is an error naming both files.
StatusOr<std::optional<tok::BoundTokenizer>> load_text_tokenizer(const Options& options);

// The ids of `text` with the tokenizer's special tokens (BOS where the model
// has one); `what` names the source in errors ("--prompt", "prompt").
StatusOr<std::vector<int64_t>> encode_prompt(const tok::BoundTokenizer& tokenizer, const std::string& text,
                                             const std::string& what);

// The ids of `messages` in the build's chat template (the manifest's chat
// format), encoded without adding special tokens (the template writes them);
// `what` names the source in errors ("--chat", "\"messages\"").
StatusOr<std::vector<int64_t>> encode_chat(const tok::BoundTokenizer& tokenizer,
                                           const std::vector<tok::ChatTurn>& messages, const std::string& what);

// The ids generation stops after: none with --ignore-eos, else the bound
// tokenizer's EOS ids (text and --serve), else (nullopt) the build's, which
// the library reads from the manifest.json beside --ptd.
std::optional<std::vector<int64_t>> stop_ids_for(const Options& options, const tok::BoundTokenizer* tokenizer);

struct TextGeneration {
  Reply generation;  // its tokens end with the EOS id when one stopped it
  std::string text;  // the decoded tokens, special tokens (EOS) skipped
};

// Generates `request` with `adapter` of `runtime`; `write`, if given,
// receives each new piece of text as soon as it is whole UTF-8. EOS ids are
// never text, even when they do not stop generation (--ignore-eos).
using TextWriter = std::function<void(const std::string& piece)>;
StatusOr<TextGeneration> generate_text(const RunnerRuntime& runtime, const AdapterView& adapter,
                                       const tok::BoundTokenizer& tokenizer, const GenerateRequest& request,
                                       const TextWriter& write);

}  // namespace lora_share
