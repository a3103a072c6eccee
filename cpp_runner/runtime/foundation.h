// The shared foundation: one .ptd file (plus, for builds that hoist tensors
// several adapters share, adapters_shared.ptd), opened and memory-mapped once
// per process, whose NamedDataMap every adapter program resolves its external
// weights against.
#pragma once

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>
#include <executorch/extension/named_data_map/merged_data_map.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "file_check.h"
#include "status.h"

namespace lora_share {

// "F" or "F and S": the data files a program is resolved against, for
// messages. `shared_ptd` may be "".
std::string describe_data_files(const std::string& ptd, const std::string& shared_ptd);

class Foundation {
 public:
  // Maps `path` (--ptd) and, unless `shared_path` is "", the adapters' shared
  // tensors (--shared-ptd), and parses their FlatTensor headers. Fails with a
  // run error if a file is missing, unreadable or not a .ptd, or if the two
  // files cannot be merged.
  static StatusOr<std::unique_ptr<Foundation>> open(const std::string& path, const std::string& shared_path);
  // No foundation (no --ptd): programs must carry every weight themselves.
  static std::unique_ptr<Foundation> none() { return std::unique_ptr<Foundation>(new Foundation()); }
  // adapters_shared.ptd alone ("" = none()): where the --stock path, whose
  // Modules open foundation.ptd themselves, reads hoisted LoRA tensors.
  static StatusOr<std::unique_ptr<Foundation>> open_shared(const std::string& shared_path);

  // "" for none() / no shared file.
  const std::string& path() const { return path_; }
  const std::string& shared_path() const { return shared_path_; }
  // Every key of both files (null for none()).
  const executorch::runtime::NamedDataMap* data_map() const {
    if (merged_) return merged_.get();
    return foundation_.map ? foundation_.map.get() : shared_.map.get();
  }

 private:
  // One mapped .ptd. Declaration order matters: the map points into the
  // loader.
  struct MappedPtd {
    std::unique_ptr<executorch::extension::MmapDataLoader> loader;
    std::unique_ptr<executorch::extension::FlatTensorDataMap> map;
  };
  static StatusOr<MappedPtd> map_ptd(const std::string& path, const std::string& flag, const std::string& expected);

  Foundation() = default;
  std::string path_, shared_path_;
  MappedPtd foundation_, shared_;
  // Last, so it goes first: it points into both maps above.
  std::unique_ptr<executorch::extension::merged_data_map::MergedDataMap> merged_;
};

// A pass-through view of a NamedDataMap that remembers which keys were asked
// for and not found. One per adapter program, so that when its load fails the
// runner can name the weights the foundation lacks instead of quoting an
// error code. It costs nothing: lookups are forwarded, never copied.
class KeyRecordingDataMap final : public executorch::runtime::NamedDataMap {
 public:
  explicit KeyRecordingDataMap(const executorch::runtime::NamedDataMap* inner) : inner_(inner) {}

  // Keys that were looked up and were not in the foundation, in the order of
  // first lookup.
  const std::vector<std::string>& missing_keys() const { return missing_; }

  executorch::runtime::Result<const executorch::runtime::TensorLayout> get_tensor_layout(
      std::string_view key) const override;
  executorch::runtime::Result<executorch::runtime::FreeableBuffer> get_data(std::string_view key) const override;
  executorch::runtime::Error load_data_into(std::string_view key, void* buffer, size_t size) const override;
  executorch::runtime::Result<uint32_t> get_num_keys() const override;
  executorch::runtime::Result<const char*> get_key(uint32_t index) const override;

 private:
  void note(std::string_view key, executorch::runtime::Error error) const;

  const executorch::runtime::NamedDataMap* inner_;
  mutable std::vector<std::string> missing_;
  mutable std::set<std::string> missing_set_;
};

}  // namespace lora_share
