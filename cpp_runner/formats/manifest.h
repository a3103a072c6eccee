// A build's manifest.json, as the library, the runner and the server read it:
// the one C++ reader of the file (lora_share/manifest.py writes it;
// schema/FORMAT.md, "manifest.json", specifies every key). parse_manifest
// checks `format` and `version` first and refuses any other, naming the file,
// what it holds and what this reader reads; then it reads every key C++ needs,
// each checked for its type: the foundation's file and fingerprint,
// adapters_shared.ptd, the adapters (name and .pte file, in build order) and
// the tokenizer section (its files' sha256, the foundation it belongs to, the
// EOS and BOS ids, the chat template resolved into text pieces).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "status.h"

namespace lora_share {

struct ManifestAdapter {
  std::string name;
  std::string file;  // relative to the manifest's folder
};

// The build's chat template as lora_share/tokenizer/chat_format.py resolved
// it into plain text pieces (tokenizer.chat_format): prompt = prefix + for
// each message roles[role].first + content + roles[role].second, +
// generation_prompt; each content stripped of surrounding whitespace first
// when trim_content (Llama 3's template trims).
struct ChatPieces {
  std::string prefix;
  bool trim_content = false;
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> roles;
  std::string generation_prompt;
  // The system message the template writes when a conversation starts with
  // none (SmolLM2's, Qwen 2's): put first, untrimmed, in that case.
  std::optional<std::string> default_system;
};

// manifest.json's "tokenizer" section (present when the build shipped one).
struct ManifestTokenizer {
  std::string foundation_fingerprint;                      // the foundation it was built for
  std::vector<std::pair<std::string, std::string>> files;  // file name -> its listed sha256
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::optional<ChatPieces> chat_format;  // none: no template in text pieces
};

struct Manifest {
  std::string path;                    // the file read
  std::string foundation_file;         // "foundation.ptd"; "" when absent
  std::string foundation_fingerprint;  // "" when absent
  std::string shared_file;             // "" = no adapters_shared.ptd
  std::vector<ManifestAdapter> adapters;
  std::optional<ManifestTokenizer> tokenizer;
};

// The one manifest format and version this reader reads (lora_share/manifest.py:
// FORMAT, VERSION). The version changes only when a key changes meaning or
// goes away, so another version, older or newer, is refused.
inline constexpr const char kManifestFormat[] = "lora-share-manifest";
inline constexpr int64_t kManifestVersion = 2;

// The manifest.json at `path`: every key above, each of the right type when
// present. Failures are usage errors naming the file (the files given do not
// go with this reader); a missing file is the caller's to look for first.
StatusOr<Manifest> parse_manifest(const std::string& path);

// `dir`/manifest.json as a deployment folder: parse_manifest, and a
// foundation file and at least one adapter. Every failure names the file and
// what to do.
StatusOr<Manifest> read_manifest(const std::string& dir);

// The binding rule (FORMAT.md): the manifest's foundation.fingerprint and its
// tokenizer section's foundation_fingerprint must both be `fingerprint`, the
// one recorded inside `ptd`. A usage error naming both files otherwise.
// `manifest` must have a tokenizer section.
Status check_tokenizer_foundation(const Manifest& manifest, const std::string& ptd, const std::string& fingerprint);

// The end-of-sequence ids generation stops at (FORMAT.md, "EOS ids"): the
// tokenizer section's, as the build resolved them (generation_config.json's
// eos_token_id, tokenizer_config.json's eos_token). None without a tokenizer
// section or when `fingerprint`, the one recorded inside `ptd`, is "" (no
// record); a section for another foundation is refused naming both files.
StatusOr<std::vector<int64_t>> eos_ids_of(const Manifest& manifest, const std::string& ptd,
                                          const std::string& fingerprint);

// "abcdef012345…": a digest shortened for messages.
std::string short_digest(const std::string& digest);

}  // namespace lora_share
