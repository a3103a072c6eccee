// build/tokenize --tokenizer PATH/tokenizer.json: encodes and decodes JSON
// lines from stdin, one JSON line out per line in, for tests and scripts:
//   {"encode": "text", "add_special_tokens": true}      -> {"ids": [...]}
//   {"decode": [ids], "skip_special_tokens": true}      -> {"text": "..."}
//   {"stream": [ids], "skip_special_tokens": true}      -> {"pieces": [...]}
//     (what StreamDecoder hands out id by id, the finish() piece last)
// A bad line gets {"error": "..."} and serving goes on.
#include <cstring>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer.h"

namespace {

using json = nlohmann::json;
using lora_share::tok::Tokenizer;

json error(const std::string& message) { return json{{"error", message}}; }

json answer(const Tokenizer& tokenizer, const std::string& line) {
  json request = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) return error("not a JSON object: " + line);
  try {
    int kinds = request.contains("encode") + request.contains("decode") + request.contains("stream");
    if (kinds != 1) {
      return error("give exactly one of \"encode\" (a string), \"decode\" or \"stream\" (a list of ids)");
    }
    if (request.contains("stream")) {
      auto ids = request.at("stream").get<std::vector<int64_t>>();
      lora_share::tok::StreamDecoder stream(tokenizer, request.value("skip_special_tokens", false));
      json pieces = json::array();
      for (int64_t id : ids) pieces.push_back(stream.push(id));
      pieces.push_back(stream.finish());
      return json{{"pieces", pieces}};
    }
    if (request.contains("encode")) {
      auto ids = tokenizer.encode(request.at("encode").get<std::string>(), request.value("add_special_tokens", true));
      if (!ids.ok()) return error(ids.status().message());
      return json{{"ids", ids.value()}};
    }
    auto ids = request.at("decode").get<std::vector<int64_t>>();
    return json{{"text", tokenizer.decode(ids, request.value("skip_special_tokens", false))}};
  } catch (const json::exception& e) {
    return error(std::string("bad request: ") + e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], "--tokenizer") != 0) {
    std::cerr << "usage: tokenize --tokenizer PATH/tokenizer.json  (JSON lines on stdin)\n";
    return 2;
  }
  auto tokenizer = Tokenizer::load(argv[2]);
  if (!tokenizer.ok()) {
    std::cerr << "error: " << tokenizer.status().message() << "\n";
    return 1;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    // ASCII-only JSON: line splitters that honour U+2028 and friends see one line per reply. Bytes
    // that are not UTF-8 become U+FFFD instead of an exception that would end the process.
    std::cout << answer(tokenizer.value(), line).dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace)
              << "\n"
              << std::flush;
  }
  return 0;
}
