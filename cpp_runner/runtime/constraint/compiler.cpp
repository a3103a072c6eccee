#include "compiler.h"

#include <chrono>
#include <cstdio>
#include <exception>

#include <nlohmann/json.hpp>

#include "schema_check.h"
#include "utf8.h"
#include "xgrammar_log.h"

namespace lora_share::constraint {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t nanoseconds_since(Clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}

// The cache key: the kind, then the text (or each choice with its length, so
// that ["a,b"] and ["a", "b"] differ).
std::string cache_key(const Spec& spec) {
  std::string key(1, static_cast<char>('0' + static_cast<int>(spec.kind)));
  if (spec.kind != Kind::kChoices) return key + spec.text;
  for (const std::string& c : spec.choices) key += std::to_string(c.size()) + ":" + c;
  return key;
}

// An EBNF string literal of `text` (valid UTF-8): quotes, backslashes and
// control characters escaped as \xHH, every other character as itself.
std::string ebnf_literal(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\' || c < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

StatusOr<std::string> choices_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return Status::usage("the list of choices is empty: give at least one");
  std::string rule = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty())
      return Status::usage("choices[" + std::to_string(i) + "] is empty: every choice needs some text");
    if (!tok::utf8_valid(choices[i])) return Status::usage("choices[" + std::to_string(i) + "] is not valid UTF-8");
    rule += (i ? " | " : "") + ebnf_literal(choices[i]);
  }
  return rule + "\n";
}

Status check_schema_text(const std::string& text) {
  nlohmann::json schema;
  try {
    schema = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::usage(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!schema.is_object() && !schema.is_boolean())
    return Status::usage("a schema is a JSON object (or true/false), not " + std::string(schema.type_name()));
  return check_schema_keywords(schema);
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kJsonSchema:
      return "JSON schema";
    case Kind::kJsonObject:
      return "JSON object";
    case Kind::kGrammar:
      return "grammar";
    case Kind::kRegex:
      return "regex";
    case Kind::kChoices:
      return "choices";
  }
  return "constraint";
}

// xgrammar's own cache is off: this one is keyed by the request's text and shared with the stats.
Compiler::Compiler(const xgrammar::TokenizerInfo& info, int threads)
    : compiler_(info, threads, /*cache_enabled=*/false),
      vocab_size_(info.GetVocabSize()),
      bytes_(std::make_shared<const TokenBytes>(info.GetDecodedVocab(), info.GetVocabSize())) {}

StatusOr<xgrammar::CompiledGrammar> Compiler::build(const Spec& spec) {
  if (spec.kind == Kind::kJsonSchema) {
    Status s = check_schema_text(spec.text);
    if (!s.ok()) return s;
  }
  if ((spec.kind == Kind::kGrammar || spec.kind == Kind::kRegex) && spec.text.empty())
    return Status::usage("the text is empty");
  StatusOr<std::string> choices = spec.kind == Kind::kChoices ? choices_grammar(spec.choices) : std::string();
  if (!choices.ok()) return choices.status();
  XgrammarWarnings warnings;
  try {
    // Compact JSON (no free whitespace: a small model left free loops on blanks), and strict
    // schemas: properties and items the schema does not name are not generated (the answer
    // still validates against the schema as written).
    auto grammar = [&] {
      switch (spec.kind) {
        case Kind::kJsonSchema:
          return compiler_.CompileJSONSchema(spec.text, /*any_whitespace=*/false, std::nullopt, std::nullopt,
                                             /*strict_mode=*/true);
        case Kind::kJsonObject:
          return compiler_.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false, std::nullopt,
                                             std::nullopt, /*strict_mode=*/false);
        case Kind::kGrammar:
          return compiler_.CompileGrammar(spec.text, "root");
        case Kind::kRegex:
          return compiler_.CompileRegex(spec.text);
        case Kind::kChoices:
          return compiler_.CompileGrammar(choices.value(), "root");
      }
      throw std::logic_error("unknown constraint kind");
    }();
    // What xgrammar only warns about, it does not enforce: refused, or answers would break it.
    if (!warnings.list().empty())
      return Status::usage(warnings.list().front() + ": the grammar engine (xgrammar) would not enforce this");
    return grammar;
  } catch (const std::exception& e) {
    return Status::usage(e.what());
  }
}

StatusOr<std::shared_ptr<const Compiled>> Compiler::compile(const Spec& spec) {
  const auto start = Clock::now();
  const std::string key = cache_key(spec);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_key_.find(key);
    if (it != by_key_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.cache_hits;
      stats_.hit_ns += nanoseconds_since(start);
      return it->second->compiled;
    }
  }
  // Compiled without the lock: two requests with one new schema may both compile it (the second
  // insert finds the first's); other requests' lookups do not wait.
  auto grammar = build(spec);
  if (!grammar.ok())
    return Status::usage(std::string(kind_name(spec.kind)) + " constraint: " + grammar.status().message());
  const bool json = spec.kind == Kind::kJsonSchema || spec.kind == Kind::kJsonObject;
  auto compiled = std::make_shared<const Compiled>(Compiled{std::move(grammar.value()), bytes_, json});
  ++stats_.compiles;
  stats_.compile_ns += nanoseconds_since(start);
  std::lock_guard<std::mutex> lock(mu_);
  if (by_key_.count(key)) return by_key_[key]->compiled;
  const size_t bytes = compiled->grammar.MemorySizeBytes();
  lru_.push_front(Entry{key, compiled, bytes});
  by_key_[key] = lru_.begin();
  cached_bytes_ += bytes;
  while (cached_bytes_ > kCacheBytes && lru_.size() > 1) {
    cached_bytes_ -= lru_.back().bytes;
    by_key_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return compiled;
}

}  // namespace lora_share::constraint
