// The BPE model of a tokenizer.json: vocab, ranked merges, byte_fallback,
// ignore_merges, unk_token / fuse_unk, continuing_subword_prefix and
// end_of_word_suffix, with the Rust library's merge order (lowest rank first,
// leftmost first among equals) via a priority queue, and a word cache.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "components.h"

namespace lora_share::tok {

class Bpe {
 public:
  static StatusOr<Bpe> load(const nlohmann::json& model, const Where& where);

  // Appends the ids of one pre-tokenized word. Not thread-safe (the cache).
  void tokenize(const std::string& word, std::vector<int64_t>& out) const;

  std::optional<int64_t> token_to_id(const std::string& token) const;
  const std::string* id_to_token(int64_t id) const;
  // Every id of the vocab and its token, as the file writes it.
  const std::unordered_map<int64_t, std::string>& tokens_by_id() const { return vocab_r_; }

 private:
  struct Merge {
    uint32_t rank;
    int64_t new_id;
  };
  static uint64_t pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

  std::vector<int64_t> initial_symbols(const std::string& word) const;
  std::vector<int64_t> merge_all(std::vector<int64_t> symbols) const;
  Status add_merge(const std::string& a, const std::string& b, uint32_t rank, const Where& where);

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<int64_t, std::string> vocab_r_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace lora_share::tok
