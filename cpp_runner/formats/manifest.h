// The parts of a build's manifest.json the library reads: which adapters the
// deployment folder holds (name and .pte file, in build order), whether it
// has adapters_shared.ptd, and the EOS ids generation stops at. manifest.json is written by lora_share/deploy/builder.py
// and read with nlohmann-json; a malformed file is refused naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
