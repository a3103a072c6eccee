// The parts of a build's manifest.json the library reads: which adapters the
// deployment folder holds (name and .pte file, in build order) and whether it
// has adapters_shared.ptd. manifest.json is written by lora_share/builder.py
// and read with nlohmann-json; a malformed file is refused naming the file.
#pragma once

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

}  // namespace lora_share
