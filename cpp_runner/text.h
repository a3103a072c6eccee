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
#include "status.h"
#include "tokenizer/binding.h"

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

struct TextGeneration {
  Generation generation;  // its tokens end with the EOS id when one stopped it
  std::string text;       // the decoded tokens, special tokens (EOS) skipped
};

// Generates until an EOS id or max_new_tokens; `write`, if given, receives
// each new piece of text as soon as it is whole UTF-8.
using TextWriter = std::function<void(const std::string& piece)>;
StatusOr<TextGeneration> generate_text(Adapter& adapter, const tok::BoundTokenizer& tokenizer,
                                       const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                       double temperature, uint64_t seed, bool keep_logits,
                                       const TextWriter& write);

}  // namespace lora_share
