#include "foundation.h"

namespace lora_share {

using executorch::extension::FlatTensorDataMap;
using executorch::extension::MmapDataLoader;
using executorch::extension::merged_data_map::MergedDataMap;
using executorch::runtime::Error;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::NamedDataMap;
using executorch::runtime::Result;
using executorch::runtime::Span;
using executorch::runtime::TensorLayout;

std::string describe_data_files(const std::string& ptd, const std::string& shared_ptd) {
  return shared_ptd.empty() ? ptd : ptd + " and " + shared_ptd;
}

StatusOr<std::unique_ptr<Foundation>> Foundation::open_shared(const std::string& shared_path) {
  std::unique_ptr<Foundation> f(new Foundation());
  if (shared_path.empty()) return f;
  f->shared_path_ = shared_path;
  auto shared = map_ptd(shared_path, "--shared-ptd", "adapters_shared.ptd written by the build");
  if (!shared.ok()) return shared.status();
  f->shared_ = std::move(shared.value());
  return f;
}

StatusOr<Foundation::MappedPtd> Foundation::map_ptd(const std::string& path, const std::string& flag,
                                                    const std::string& expected) {
  Status readable = check_readable_file(path, flag);
  if (!readable.ok()) return readable;
  MappedPtd mapped;
  // NoMlock: the point is to let the kernel share and evict these pages;
  // locking would pin the whole file even where XNNPACK has already packed
  // its own copy of a weight.
  Result<MmapDataLoader> loader = MmapDataLoader::from(path.c_str(), MmapDataLoader::MlockConfig::NoMlock);
  if (!loader.ok()) return Status::failure(flag + " " + path + ": could not map the file");
  mapped.loader = std::make_unique<MmapDataLoader>(std::move(loader.get()));

  Result<FlatTensorDataMap> map = FlatTensorDataMap::load(mapped.loader.get());
  if (!map.ok())
    return Status::failure(flag + " " + path + ": not an ExecuTorch data file (.ptd); pass the " + expected);
  mapped.map = std::make_unique<FlatTensorDataMap>(std::move(map.get()));
  return mapped;
}

StatusOr<std::unique_ptr<Foundation>> Foundation::open(const std::string& path, const std::string& shared_path) {
  std::unique_ptr<Foundation> f(new Foundation());
  f->path_ = path;
  f->shared_path_ = shared_path;
  auto foundation = map_ptd(path, "--ptd", "foundation.ptd written by the export");
  if (!foundation.ok()) return foundation.status();
  f->foundation_ = std::move(foundation.value());
  if (shared_path.empty()) return f;

  auto shared = map_ptd(shared_path, "--shared-ptd", "adapters_shared.ptd written by the build");
  if (!shared.ok()) return shared.status();
  f->shared_ = std::move(shared.value());
  // One map over both files, so that each adapter program resolves against
  // it exactly as against a lone foundation, and each file is mapped once
  // for the whole process however many adapters read it.
  const NamedDataMap* maps[] = {f->foundation_.map.get(), f->shared_.map.get()};
  Result<MergedDataMap> merged = MergedDataMap::load(Span<const NamedDataMap*>(maps, 2));
  if (!merged.ok())
    return Status::failure("--ptd " + path + " and --shared-ptd " + shared_path +
                           ": ExecuTorch could not merge them (" + executorch::runtime::to_string(merged.error()) +
                           "); pass the foundation.ptd and adapters_shared.ptd of one build");
  f->merged_ = std::make_unique<MergedDataMap>(std::move(merged.get()));
  return f;
}

void KeyRecordingDataMap::note(std::string_view key, Error error) const {
  if (error != Error::NotFound) return;
  std::string k(key);
  if (missing_set_.insert(k).second) missing_.push_back(k);
}

Result<const TensorLayout> KeyRecordingDataMap::get_tensor_layout(std::string_view key) const {
  // Result<const T> cannot be moved (ExecuTorch placement-news into a const
  // member), so the found case returns a fresh lookup, which C++17 elides.
  auto probe = inner_->get_tensor_layout(key);
  if (!probe.ok()) {
    note(key, probe.error());
    return probe.error();
  }
  return inner_->get_tensor_layout(key);
}

Result<FreeableBuffer> KeyRecordingDataMap::get_data(std::string_view key) const {
  auto r = inner_->get_data(key);
  if (!r.ok()) note(key, r.error());
  return r;
}

Error KeyRecordingDataMap::load_data_into(std::string_view key, void* buffer, size_t size) const {
  Error e = inner_->load_data_into(key, buffer, size);
  note(key, e);
  return e;
}

Result<uint32_t> KeyRecordingDataMap::get_num_keys() const { return inner_->get_num_keys(); }

Result<const char*> KeyRecordingDataMap::get_key(uint32_t index) const { return inner_->get_key(index); }

}  // namespace lora_share
