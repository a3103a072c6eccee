// A build's manifest.json, as the library, the runner and the server read it.
// lora_share/manifest.py writes it; schema/FORMAT.md ("manifest.json")
// specifies every key. Every read checks `format` and `version` first
// (read_manifest_json) and refuses any other, naming the file, what it holds
// and what this reader reads; a malformed file is refused naming the file.
// Beyond that the library needs which adapters the deployment folder holds
// (name and .pte file, in build order), whether it has adapters_shared.ptd,
// and the EOS ids generation stops at.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "status.h"

namespace lora_share {

struct ManifestAdapter {
  std::string name;
  std::string file;  // relative to the manifest's folder
};

struct Manifest {
  std::string foundation_file;  // "foundation.ptd"
  std::string shared_file;      // "" = no adapters_shared.ptd
  std::vector<ManifestAdapter> adapters;
};

// The one manifest format and version this reader reads (lora_share/manifest.py:
// FORMAT, VERSION). The version changes only when a key changes meaning or
// goes away, so another version, older or newer, is refused.
inline constexpr const char kManifestFormat[] = "lora-share-manifest";
inline constexpr int64_t kManifestVersion = 2;

// The manifest.json at `path`, parsed and checked to be a JSON object of
// kManifestFormat and kManifestVersion. Failures are usage errors naming the
// file (the files given do not go with this reader); a missing file is the
// caller's to look for first.
StatusOr<nlohmann::json> read_manifest_json(const std::string& path);

// Reads `dir`/manifest.json. Every failure names the file and what to do.
StatusOr<Manifest> read_manifest(const std::string& dir);

// The end-of-sequence ids of the build `ptd` came from: the tokenizer section
// of the manifest.json beside it (generation_config.json's eos_token_id and
// tokenizer_config.json's eos_token, as the build resolved them). Every
// client reads them from there, as the tokenizer is: no manifest, or a build
// without a tokenizer, gives none (nothing stops early). `fingerprint` is
// the one recorded inside `ptd` ("" = none: no ids); a manifest whose
// tokenizer section is for another foundation is refused naming both files.
StatusOr<std::vector<int64_t>> read_eos_ids(const std::string& ptd, const std::string& fingerprint);

}  // namespace lora_share
