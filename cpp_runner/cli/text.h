// Text in and out of the runner: the build's tokenizer bound to --ptd
// (tokenizer/binding.h), prompts encoded with it, and generation that stops
// at the end-of-sequence ids and decodes as tokens arrive.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "adapter.h"
#include "flags.h"
#include "generate.h"
#include "session.h"
#include "status.h"
#include "binding.h"

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

// The ids generation stops after: none with --ignore-eos, else the bound
// tokenizer's EOS ids (text and --serve), else the build's (session.eos_ids).
std::vector<int64_t> stop_ids_for(const Options& options, const Session& session,
                                  const tok::BoundTokenizer* tokenizer);

struct TextGeneration {
  Generation generation;  // its tokens end with the EOS id when one stopped it
  std::string text;       // the decoded tokens, special tokens (EOS) skipped
};

// Generates until an id of `stop_ids` or max_new_tokens; `write`, if given,
// receives each new piece of text as soon as it is whole UTF-8. EOS ids are
// never text, even when they do not stop generation (--ignore-eos).
using TextWriter = std::function<void(const std::string& piece)>;
StatusOr<TextGeneration> generate_text(Adapter& adapter, const tok::BoundTokenizer& tokenizer,
                                       const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                       double temperature, uint64_t seed, bool keep_logits,
                                       const std::vector<int64_t>& stop_ids, const TextWriter& write);

}  // namespace lora_share
