#include "vocabulary.h"

#include <exception>
#include <string>

#include "xgrammar_log.h"

namespace lora_share::constraint {

StatusOr<xgrammar::TokenizerInfo> make_tokenizer_info(const tok::Vocabulary& vocab, int64_t model_vocab,
                                                      const std::vector<int64_t>& eos_ids) {
  if (static_cast<int64_t>(vocab.tokens.size()) > model_vocab)
    return Status::failure("the tokenizer has ids up to " + std::to_string(vocab.tokens.size() - 1) +
                           " but the model's vocabulary is " + std::to_string(model_vocab) +
                           " ids: the build's tokenizer is not this model's");
  if (eos_ids.empty())
    return Status::usage(
        "the build has no end-of-sequence id (manifest.json's tokenizer section), so a constrained "
        "answer could not end: rebuild with the checkpoint's generation_config.json");
  std::vector<int32_t> stop;
  for (int64_t id : eos_ids) {
    if (id < 0 || id >= model_vocab)
      return Status::failure("the build's end-of-sequence id " + std::to_string(id) +
                             " is outside the model's vocabulary of " + std::to_string(model_vocab));
    stop.push_back(static_cast<int32_t>(id));
  }
  // xgrammar never allows a token whose text is empty (it counts as special) but for the stop ids.
  std::vector<std::string> tokens = vocab.tokens;
  for (size_t id = 0; id < tokens.size(); ++id)
    if (vocab.special[id]) tokens[id].clear();
  xgrammar::VocabType type = vocab.kind == tok::Vocabulary::Kind::kByteLevel      ? xgrammar::VocabType::BYTE_LEVEL
                             : vocab.kind == tok::Vocabulary::Kind::kByteFallback ? xgrammar::VocabType::BYTE_FALLBACK
                                                                                  : xgrammar::VocabType::RAW;
  try {
    XgrammarWarnings quiet;  // nothing to refuse here: a vocabulary is what it is
    return xgrammar::TokenizerInfo(tokens, type, static_cast<int>(model_vocab), stop, vocab.prefix_space);
  } catch (const std::exception& e) {
    return Status::failure(std::string("the grammar engine refused the tokenizer's vocabulary: ") + e.what());
  }
}

}  // namespace lora_share::constraint
