// The pipeline stages of a tokenizer.json, one small interface each, built
// from the JSON by make_*(): normalizer -> pre-tokenizer -> model (bpe.h) ->
// post-processor (tokenizer.cpp), and the decoder for the way back. Each
// mirrors the Rust `tokenizers` class of the same name; a type this runtime
// does not implement is refused at load, naming the file and the key.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "regex.h"
#include "status.h"

namespace lora_share::tok {

// `file: key` for error messages, e.g. "out/x/tokenizer.json: pre_tokenizer.pretokenizers[1]".
struct Where {
  std::string file;
  std::string key;
  Where at(const std::string& sub) const { return {file, key + sub}; }
  std::string str() const { return file + ": " + key; }
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string s) const = 0;
};

// A piece of text between pre-tokenizer splits. `at_start`: it begins at
// offset 0 of the original input (Metaspace's prepend_scheme "first").
struct Piece {
  std::string text;
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece by its sub-pieces (empty ones dropped).
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};

// null JSON -> nullptr (no stage).
StatusOr<std::unique_ptr<Normalizer>> make_normalizer(const nlohmann::json& j, const Where& where);
StatusOr<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const nlohmann::json& j, const Where& where);
StatusOr<std::unique_ptr<Decoder>> make_decoder(const nlohmann::json& j, const Where& where);

// {"String": "x"} (a literal) or {"Regex": "x"}, as Replace and Split write their pattern.
StatusOr<Regex> make_pattern(const nlohmann::json& j, const Where& where);

// "<where>: <what> type '<type>' is not supported" — one wording for every stage.
Status unsupported(const Where& where, const std::string& type);

}  // namespace lora_share::tok
