// Command-line flags: one table (flags.cpp) holds every flag's name, default
// and help text, so --help and the parser can never disagree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

struct Options {
  std::vector<std::string> ptes;  // --pte, repeatable
  std::string ptd;                // --ptd
  std::string shared_ptd;         // --shared-ptd
  std::vector<int64_t> tokens;    // --tokens
  bool tokens_given = false;
  std::string prompt;  // --prompt (text, encoded with the build's tokenizer)
  bool prompt_given = false;
  bool chat = false;                // --chat: the prompt is one user message in the build's chat template
  std::string tokenizer_dir;        // --tokenizer (default: the --ptd's folder)
  int64_t max_new_tokens = 16;      // --max-new-tokens
  double temperature = 0.0;         // --temperature (0 = greedy)
  uint64_t seed = 0;                // --seed
  std::string adapter;              // --adapter (empty = first --pte; "base" = no adapter)
  bool ignore_eos = false;          // --ignore-eos
  bool serve = false;               // --serve
  std::vector<std::string> inputs;  // --input, repeatable (a program's forward on .npy tensors)
  std::string output;               // --output
  std::string dump_logits;          // --dump-logits
  bool json = false;                // --json
  std::string packed_cache;         // --packed-cache (a folder; "" = the default ones)
  bool no_packed_cache = false;     // --no-packed-cache
  bool no_speculation = false;      // --no-speculation (ls_options.speculation 0)
  bool every_draft = false;         // --every-draft (LS_SPECULATION_EVERY_DRAFT)
  bool no_weight_cache = false;     // --no-weight-cache
  bool no_huge_pages = false;       // --no-huge-pages
  bool stock = false;               // --stock
  bool private_arenas = false;      // --private-arenas
  int threads = 0;                  // --threads (0 = one per core)
  bool no_verify = false;           // --no-verify
  bool verbose = false;             // --verbose
  bool help = false;                // --help
};

// Parses argv. A bad flag or value is a usage error naming the flag.
StatusOr<Options> parse_flags(int argc, char** argv);

// The --help text: every flag with its default.
std::string usage_text(const char* program_name);

// Parses "1,17,42" into token ids (whitespace and empty items are ignored, as
// in lora_share.inference.generate.parse_tokens). `what` names the source in errors.
StatusOr<std::vector<int64_t>> parse_token_list(const std::string& text, const std::string& what);

}  // namespace lora_share
