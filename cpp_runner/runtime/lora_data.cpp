#include "lora_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace lora_share {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::extension::make_tensor_ptr;
using executorch::extension::TensorPtr;
using executorch::runtime::MethodMeta;

Status bad_inputs(const std::string& pte, size_t slots, const std::string& why) {
  return Status::failure(pte + ": its record names " + std::to_string(slots) +
                         " LoRA slots, but forward's inputs do not end in as many "
                         "float32 A/B pairs (" +
                         why + "): the file is corrupt");
}

}  // namespace

StatusOr<std::vector<LoraShape>> read_lora_shapes(const MethodMeta& forward, size_t slots, const std::string& pte) {
  size_t inputs = forward.num_inputs();
  if (inputs < 2 + 2 * slots) return bad_inputs(pte, slots, "too few inputs");
  std::vector<LoraShape> shapes;
  size_t first = inputs - 2 * slots;
  for (size_t i = 0; i < slots; ++i) {
    auto a = forward.input_tensor_meta(first + 2 * i);
    auto b = forward.input_tensor_meta(first + 2 * i + 1);
    if (!a.ok() || !b.ok() || a->scalar_type() != ScalarType::Float || b->scalar_type() != ScalarType::Float ||
        a->sizes().size() != 2 || b->sizes().size() != 2 || a->sizes()[0] != b->sizes()[1] || a->sizes()[0] < 1)
      return bad_inputs(pte, slots, "input " + std::to_string(first + 2 * i));
    shapes.push_back({a->sizes()[1], b->sizes()[0], a->sizes()[0]});
  }
  return shapes;
}

LoraData::~LoraData() {
  if (map_ != nullptr) munmap(const_cast<uint8_t*>(map_), map_size_);
}

StatusOr<std::unique_ptr<LoraData>> LoraData::open(const std::string& pte, const PteInfo& info, const Foundation& files,
                                                   const std::vector<LoraShape>& shapes) {
  // Hoisted tensors are in adapters_shared.ptd, merged with foundation.ptd
  // into one map on the shared path (lookups fall through to it).
  const executorch::runtime::NamedDataMap* shared = files.shared_path().empty() ? nullptr : files.data_map();
  const Record& record = info.record;
  if (record.envelope.size() != shapes.size())
    return bad_inputs(pte, record.envelope.size(), std::to_string(shapes.size()) + " pairs in its program");
  auto data = std::unique_ptr<LoraData>(new LoraData());
  int fd = ::open(pte.c_str(), O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    if (fd >= 0) ::close(fd);
    return Status::failure(pte + ": cannot read the file");
  }
  // Only the file's own entries (its tensors, then its record: the end of the
  // file) are mapped, read-only, from the page the first one starts on, so no
  // fault can bring in the program's pages. A file its writer has just written
  // sits in the page cache in large folios, and a whole-file mapping took the
  // program along (2.41 MiB per served 8da4w adapter at SmolLM-135M's shape:
  // the whole file, against 1.79 MiB, its tensors).
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  uint64_t first = file_size;
  for (const auto& entry : info.own_ranges) first = std::min(first, entry.second.first);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  data->map_offset_ = first / page * page;
  data->map_size_ = file_size - data->map_offset_;
  void* p = data->map_size_
                ? mmap(nullptr, data->map_size_, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(data->map_offset_))
                : nullptr;
  ::close(fd);
  if (p == MAP_FAILED) return Status::failure(pte + ": could not map the file");
  data->map_ = static_cast<const uint8_t*>(p);
  data->slots_.assign(shapes.size(), Slot());

  // The tensor `key`, with at least `bytes` bytes, or why not.
  auto tensor = [&](const std::string& key, uint64_t bytes, const std::string& what, const float** out) -> Status {
    auto own = info.own_ranges.find(key);
    if (own != info.own_ranges.end()) {
      auto [start, size] = own->second;
      if (size < bytes || start < data->map_offset_ || start + size > data->map_offset_ + data->map_size_)
        return Status::failure(pte + " holds " + std::to_string(size) + " bytes for its " + what + ", which needs " +
                               std::to_string(bytes) + ": the file is corrupt");
      // The writer aligns every tensor to 64 bytes.
      if (start % alignof(float) != 0)
        return Status::failure(pte + ": its " + what + " is not aligned: the file is corrupt");
      *out = reinterpret_cast<const float*>(data->map_ + (start - data->map_offset_));
      data->own_bytes_ += bytes;
      return Status();
    }
    if (shared != nullptr) {
      auto buffer = shared->get_data(key.c_str());
      if (buffer.ok()) {
        if (buffer->size() < bytes)
          return Status::failure(files.shared_path() + " holds " + std::to_string(buffer->size()) + " bytes for " +
                                 pte + "'s " + what + ", which needs " + std::to_string(bytes) +
                                 ": the file is corrupt");
        *out = static_cast<const float*>(buffer->data());
        data->shared_.push_back(std::move(buffer.get()));
        return Status();
      }
    }
    return Status::failure(pte + ": no data for its " + what + " (key " + key.substr(0, 16) + "...)" +
                           (shared == nullptr ? "; it reads tensors shared with other adapters: "
                                                "give the build's adapters_shared.ptd"
                                              : ""));
  };
  for (const LoraKeys& keys : record.lora) {
    const LoraShape& shape = shapes[keys.slot];  // decode_record checked the slot
    const EnvelopeSlot& slot = record.envelope[keys.slot];
    std::string where = slot.target + " in layer " + std::to_string(slot.layer);
    if (static_cast<int64_t>(keys.rank) > shape.max_rank)
      return Status::failure(pte + ": rank " + std::to_string(keys.rank) + " on " + where +
                             ", but its program takes ranks 1.." + std::to_string(shape.max_rank) +
                             ": the file is corrupt");
    Slot& s = data->slots_[keys.slot];
    s.rank = keys.rank;
    uint64_t rank = keys.rank;
    Status st = tensor(keys.a, rank * shape.in * sizeof(float), "LoRA A of " + where, &s.a);
    if (st.ok()) st = tensor(keys.b, rank * shape.out * sizeof(float), "LoRA B of " + where, &s.b);
    if (!st.ok()) return st;
  }
  return data;
}

StatusOr<std::unique_ptr<LoraData>> LoraData::compose(const std::vector<Term>& terms,
                                                      const std::vector<LoraShape>& shapes,
                                                      const std::vector<std::string>& names) {
  auto mix = std::unique_ptr<LoraData>(new LoraData());
  mix->slots_.assign(shapes.size(), Slot());
  std::vector<size_t> offsets(shapes.size());  // where each slot's A, then B, start in composed_
  size_t floats = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t rank = 0;
    for (const Term& t : terms) rank += t.data->slots()[i].rank;
    if (rank > shapes[i].max_rank)
      return Status::usage("the mix's summed rank on " + names[i] + " is " + std::to_string(rank) +
                           ", above the envelope's max rank " + std::to_string(shapes[i].max_rank));
    mix->slots_[i].rank = rank;
    offsets[i] = floats;
    floats += static_cast<size_t>(rank * (shapes[i].in + shapes[i].out));
  }
  mix->composed_.resize(floats);
  mix->own_bytes_ = floats * sizeof(float);
  for (size_t i = 0; i < shapes.size(); ++i) {
    Slot& slot = mix->slots_[i];
    if (slot.rank == 0) continue;
    const int64_t in = shapes[i].in, out = shapes[i].out;
    float* a = mix->composed_.data() + offsets[i];
    float* b = a + slot.rank * in;
    slot.a = a;
    slot.b = b;
    int64_t first = 0;  // the term's first row of A, first column of B
    for (const Term& t : terms) {
      const Slot& part = t.data->slots()[i];
      if (part.rank == 0) continue;
      std::copy(part.a, part.a + part.rank * in, a + first * in);
      // B [out, rank] row-major: the term's columns first..first+rank of each row.
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < part.rank; ++k)
          b[o * slot.rank + first + k] = static_cast<float>(part.b[o * part.rank + k] * t.scale);
      first += part.rank;
    }
  }
  return mix;
}

size_t zero_floats_needed(const std::vector<LoraShape>& shapes) {
  int64_t most = 0;
  for (const LoraShape& s : shapes) most = std::max({most, s.in, s.out});
  return static_cast<size_t>(most);
}

std::vector<TensorPtr> lora_input_tensors(const LoraData* data, const std::vector<LoraShape>& shapes,
                                          const float* zeros) {
  std::vector<TensorPtr> out;
  out.reserve(2 * shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const LoraShape& shape = shapes[i];
    LoraData::Slot slot = data != nullptr ? data->slots()[i] : LoraData::Slot();
    bool has = slot.rank > 0;
    auto rank = static_cast<SizesType>(has ? slot.rank : 1);
    // The program only reads its inputs; TensorPtr wants a mutable pointer.
    out.push_back(make_tensor_ptr({rank, static_cast<SizesType>(shape.in)}, const_cast<float*>(has ? slot.a : zeros),
                                  ScalarType::Float));
    out.push_back(make_tensor_ptr({static_cast<SizesType>(shape.out), rank}, const_cast<float*>(has ? slot.b : zeros),
                                  ScalarType::Float));
  }
  return out;
}

}  // namespace lora_share
