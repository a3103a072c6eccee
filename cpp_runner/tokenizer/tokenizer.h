// A Hugging Face tokenizer.json, loaded and run with the `tokenizers`
// library's semantics: encode(text, add_special_tokens) gives the ids
// `Tokenizer.encode(text).ids` gives, decode(ids, skip_special_tokens) the
// text `Tokenizer.decode` gives. What the file uses and this runtime does not
// implement is refused by load(), naming the file and the JSON key.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "added_tokens.h"
#include "bpe.h"
#include "components.h"
#include "status.h"

namespace lora_share::tok {

// The vocabulary as a grammar engine reads it (runtime/constraint/vocabulary.h):
// each id's token as the file writes it, how the decoder turns such tokens into
// bytes, and whether the pre-tokenizer puts a space before the text.
struct Vocabulary {
  enum class Kind { kRaw, kByteFallback, kByteLevel };
  // By id, up to the largest id the file gives: the model's token, or an
  // added token's content; "" for an id it gives none.
  std::vector<std::string> tokens;
  std::vector<bool> special;  // by id: a special added token (never text)
  Kind kind = Kind::kRaw;     // ByteLevel or ByteFallback in the decoder (the first found), else raw
  bool prefix_space = false;  // Metaspace with prepend_scheme always/first, or a Prepend("▁") normalizer
};

class Tokenizer {
 public:
  static StatusOr<Tokenizer> load(const std::string& path);

  Vocabulary vocabulary() const;

  // Fails only on text that is not valid UTF-8.
  StatusOr<std::vector<int64_t>> encode(const std::string& text, bool add_special_tokens) const;
  // Ids the tokenizer does not know are skipped, as the Rust library does.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const;

 private:
  struct TemplateItem {
    bool is_sequence;          // $A, else special-token ids
    std::vector<int64_t> ids;  // the special token's ids
  };
  Status load_added_tokens(const nlohmann::json& list, const Where& where);
  Status load_post_processor(const nlohmann::json& j, const Where& where);
  void encode_text(const Segment& segment, std::vector<int64_t>& ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<Bpe> model_;
  std::unordered_map<int64_t, std::string> added_by_id_;
  std::unordered_set<std::string> special_contents_;
  std::unique_ptr<AddedTokenMatcher> raw_matcher_, normalized_matcher_;
  std::vector<TemplateItem> template_;  // empty: no TemplateProcessing
  Vocabulary::Kind vocab_kind_ = Vocabulary::Kind::kRaw;
  bool prefix_space_ = false;
};

// Turns ids into text as they arrive: push() returns the text the new id
// completes (nothing while the output ends in an incomplete UTF-8 sequence),
// finish() what is left. The pieces joined equal decode(all ids) whenever the
// decodes of the prefixes extend one another, as they do for real text (a
// run of invalid byte-fallback bytes can rewrite earlier output; printed text
// is never taken back, so printing resumes where the decode diverged). Each
// push decodes every id so far: fine for replies of thousands of tokens.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}
  std::string push(int64_t id);
  std::string finish();

 private:
  std::string emit(bool final);
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int64_t> ids_;
  std::string emitted_;
};

}  // namespace lora_share::tok
