// The tokenizer's vocabulary as xgrammar reads it: one TokenizerInfo per
// runtime (the deployment's tokenizer, bound once), from which every grammar
// is compiled. xgrammar turns each token into the bytes it stands for with the
// tokenizer's kind (byte-level BPE as SmolLM2 and Llama 3 write them,
// sentencepiece's byte fallback, or raw) and matches grammars on bytes.
#pragma once

#include <cstdint>
#include <vector>

#include <xgrammar/tokenizer_info.h>

#include "status.h"
#include "tokenizer.h"

namespace lora_share::constraint {

// `vocab` from the build's tokenizer (tok::Tokenizer::vocabulary), over the
// model's `model_vocab` ids (a model may have more ids than the tokenizer: those
// and the special added tokens are never text, so a grammar never allows them),
// ending at `eos_ids` (the build's end-of-sequence ids). A tokenizer with ids
// past the model's is refused, as is a build without EOS ids (a constrained
// answer ends with one).
StatusOr<xgrammar::TokenizerInfo> make_tokenizer_info(const tok::Vocabulary& vocab, int64_t model_vocab,
                                                      const std::vector<int64_t>& eos_ids);

}  // namespace lora_share::constraint
