// Constraints compiled for one runtime's vocabulary (docs/structured-output.md):
// the five kinds a request may ask for, each turned into an xgrammar grammar
// once and kept in a cache keyed by kind and text, so that every later request
// with the same schema starts at once.
//
// Thread-safe: callers compile on their own threads (without the runtime's
// lock: a large schema takes a while), the cache has its own lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <xgrammar/compiler.h>

#include "status.h"
#include "token_bytes.h"

namespace lora_share::constraint {

enum class Kind {
  kJsonSchema,  // text: a JSON Schema
  kJsonObject,  // any JSON object
  kGrammar,     // text: EBNF / GBNF, root rule "root"
  kRegex,       // text: a regular expression the whole answer matches
  kChoices,     // one of `choices`, exactly
};

struct Spec {
  Kind kind = Kind::kJsonSchema;
  std::string text;
  std::vector<std::string> choices;
};

// What a runtime's constraints cost, for ls_runtime_stats (atomics: bumped by
// callers' threads, the scheduler's and the mask worker's).
struct Stats {
  std::atomic<uint64_t> compiles{0}, compile_ns{0};    // cache misses and their time
  std::atomic<uint64_t> cache_hits{0}, hit_ns{0};      // compiled already, and the lookups' time
  std::atomic<uint64_t> masked_tokens{0}, mask_ns{0};  // masks filled, and their time
  std::atomic<uint64_t> mask_wait_ns{0};               // picks waiting for a mask after the step
};

// A grammar ready for matchers (row_constraint.h), shared by every request that uses it.
struct Compiled {
  xgrammar::CompiledGrammar grammar;
  std::shared_ptr<const TokenBytes> bytes;  // the vocabulary's, for the filters of token_bytes.h
  bool json = false;                        // a JSON kind: tokens with control bytes are filtered out
};

class Compiler {
 public:
  // Every grammar is compiled for `info` (vocabulary.h); `threads` build a
  // grammar's token masks at once.
  Compiler(const xgrammar::TokenizerInfo& info, int threads);

  // The grammar of `spec`, from the cache when the same kind and text were
  // compiled before. A usage error names the kind and what is wrong: not
  // valid JSON, an invalid schema, grammar or regex, a schema keyword the
  // engine would not enforce, an empty list of choices.
  StatusOr<std::shared_ptr<const Compiled>> compile(const Spec& spec);

  int64_t vocab_size() const { return vocab_size_; }
  Stats& stats() { return stats_; }

  // Compiled grammars kept: least recently used ones go past this many bytes.
  static constexpr size_t kCacheBytes = size_t{64} << 20;

 private:
  StatusOr<xgrammar::CompiledGrammar> build(const Spec& spec);

  xgrammar::GrammarCompiler compiler_;
  int64_t vocab_size_;
  std::shared_ptr<const TokenBytes> bytes_;
  Stats stats_;

  std::mutex mu_;  // the cache's
  struct Entry {
    std::string key;
    std::shared_ptr<const Compiled> compiled;
    size_t bytes;
  };
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_key_;
  size_t cached_bytes_ = 0;
};

// "JSON schema", "JSON object", "grammar", "regex", "choices": how messages name a kind.
const char* kind_name(Kind kind);

}  // namespace lora_share::constraint
