// The shared foundation: one .ptd file, opened and memory-mapped once per
// process, whose NamedDataMap every adapter program resolves its external
// weights against.
#pragma once

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

// Checks that `path` is a readable regular file before ExecuTorch sees it,
// because ExecuTorch reports "missing" and "unreadable" with the same code.
// `flag` names the flag the path came from.
Status check_readable_file(const std::string& path, const std::string& flag);

class Foundation {
 public:
  // Maps `path` and parses its FlatTensor header. Fails with a run error if
  // the file is missing, unreadable or not a .ptd.
  static StatusOr<std::unique_ptr<Foundation>> open(const std::string& path);
  // No foundation (no --ptd): programs must carry every weight themselves.
  static std::unique_ptr<Foundation> none() {
    return std::unique_ptr<Foundation>(new Foundation());
  }

  // "" and null for none().
  const std::string& path() const { return path_; }
  const executorch::runtime::NamedDataMap* data_map() const {
    return data_map_.get();
  }

 private:
  Foundation() = default;
  std::string path_;
  // Declaration order matters: the data map points into the loader.
  std::unique_ptr<executorch::extension::MmapDataLoader> loader_;
  std::unique_ptr<executorch::extension::FlatTensorDataMap> data_map_;
};

// A pass-through view of a NamedDataMap that remembers which keys were asked
// for and not found. One per adapter program, so that when its load fails the
// runner can name the weights the foundation lacks instead of quoting an
// error code. It costs nothing: lookups are forwarded, never copied.
class KeyRecordingDataMap final : public executorch::runtime::NamedDataMap {
 public:
  explicit KeyRecordingDataMap(const executorch::runtime::NamedDataMap* inner)
      : inner_(inner) {}

  // Keys that were looked up and were not in the foundation, in the order of
  // first lookup.
  const std::vector<std::string>& missing_keys() const { return missing_; }

  executorch::runtime::Result<const executorch::runtime::TensorLayout>
  get_tensor_layout(std::string_view key) const override;
  executorch::runtime::Result<executorch::runtime::FreeableBuffer> get_data(
      std::string_view key) const override;
  executorch::runtime::Error load_data_into(std::string_view key, void* buffer,
                                            size_t size) const override;
  executorch::runtime::Result<uint32_t> get_num_keys() const override;
  executorch::runtime::Result<const char*> get_key(
      uint32_t index) const override;

 private:
  void note(std::string_view key, executorch::runtime::Error error) const;

  const executorch::runtime::NamedDataMap* inner_;
  mutable std::vector<std::string> missing_;
  mutable std::set<std::string> missing_set_;
};

}  // namespace lora_share
