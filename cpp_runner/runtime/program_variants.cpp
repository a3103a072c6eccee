#include "program_variants.h"

#include <executorch/runtime/executor/program.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "adapter_on_foundation.h"
#include "et_platform.h"

namespace lora_share {
namespace {

using executorch::runtime::DataLoader;
using executorch::runtime::Error;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::Method;
using executorch::runtime::Program;
using executorch::runtime::Result;

// Payload copies start on a cache line, as a mapped segment does (XNNPACK's
// flatbuffer is read in place).
constexpr size_t kCopyAlignment = 64;

void free_copy(void* /*context*/, void* data, size_t /*size*/) { std::free(data); }

}  // namespace

const char* method_name(MethodKind kind) {
  switch (kind) {
    case MethodKind::kForward:
      return "forward";
    case MethodKind::kDecode:
      return "decode";
    case MethodKind::kBatch:
      return "decode_batch";
  }
  return "forward";
}

SkippingLoader::SkippingLoader(const DataLoader* base, std::vector<SlotPatch> patches)
    : base_(base), patches_(std::move(patches)) {}

Result<FreeableBuffer> SkippingLoader::load(size_t offset, size_t size, const SegmentInfo& segment_info) const {
  Result<FreeableBuffer> loaded = base_->load(offset, size, segment_info);
  if (!loaded.ok() || segment_info.segment_type != SegmentInfo::Type::Backend) return loaded;
  bool touched = std::any_of(patches_.begin(), patches_.end(),
                             [&](const SlotPatch& p) { return p.segment == segment_info.segment_index; });
  if (!touched) return loaded;
  FreeableBuffer original = std::move(loaded.get());
  size_t rounded = (size + kCopyAlignment - 1) / kCopyAlignment * kCopyAlignment;
  auto* copy = static_cast<uint8_t*>(std::aligned_alloc(kCopyAlignment, std::max(rounded, kCopyAlignment)));
  if (copy == nullptr) return Error::MemoryAllocationFailed;
  std::memcpy(copy, original.data(), size);
  original.Free();
  for (const SlotPatch& p : patches_) {
    if (p.segment != segment_info.segment_index) continue;
    uint32_t word = 0;
    // A word past the segment, or not the value the table expects: the table
    // is not this program's. The load fails and the whole program runs.
    if (static_cast<uint64_t>(p.offset) + 4 > size) {
      std::free(copy);
      return Error::InvalidProgram;
    }
    std::memcpy(&word, copy + p.offset, 4);
    if (word != p.old_value) {
      std::free(copy);
      return Error::InvalidProgram;
    }
    std::memcpy(copy + p.offset, &p.new_value, 4);
  }
  return FreeableBuffer(copy, size, free_copy);
}

Result<size_t> SkippingLoader::size() const { return base_->size(); }

struct ProgramVariants::Variant {
  SlotMask key;
  uint64_t last_used = 0;
  bool broken = false;  // a load failed: the whole program runs instead
  // Destroyed in reverse: the methods, their memory, the program, its loader.
  std::unique_ptr<SkippingLoader> loader;
  std::unique_ptr<Program> program;
  std::unique_ptr<MethodMemory> memory[kMethodKinds];
  std::unique_ptr<Method> methods[kMethodKinds];
};

ProgramVariants::ProgramVariants() = default;
ProgramVariants::~ProgramVariants() = default;

void ProgramVariants::set_table(const std::vector<SlotPatch>& patches, size_t slots) {
  if (patches.empty() || !by_slot_.empty()) return;
  by_slot_.assign(slots, {});
  for (const SlotPatch& p : patches)
    if (p.slot < slots) by_slot_[p.slot].push_back(p);
}

void ProgramVariants::set_budget(std::function<bool(uint64_t)> fits, uint64_t method_bytes) {
  fits_ = std::move(fits);
  method_bytes_ = method_bytes;
}

SlotMask ProgramVariants::skippable(const SlotMask& absent) const {
  SlotMask key(by_slot_.size(), false);
  for (size_t s = 0; s < by_slot_.size() && s < absent.size(); ++s) key[s] = absent[s] && !by_slot_[s].empty();
  return key;
}

StatusOr<ProgramVariants::Variant*> ProgramVariants::variant(const SlotMask& key, const LoadContext& context) {
  for (auto& v : variants_)
    if (v->key == key) return v.get();
  if (variants_.size() >= kMaxVariants) {
    // The least recently used goes (calls run one at a time: none is running).
    auto oldest = std::min_element(variants_.begin(), variants_.end(),
                                   [](const auto& a, const auto& b) { return a->last_used < b->last_used; });
    variants_.erase(oldest);
  }
  auto v = std::make_unique<Variant>();
  v->key = key;
  std::vector<SlotPatch> patches;
  for (size_t s = 0; s < key.size(); ++s)
    if (key[s]) patches.insert(patches.end(), by_slot_[s].begin(), by_slot_[s].end());
  v->loader = std::make_unique<SkippingLoader>(context.file, std::move(patches));
  // The program's flatbuffer is not patched (only payloads are): the same
  // checks as the whole program passed.
  Result<Program> program = Program::load(v->loader.get(), Program::Verification::Minimal);
  if (!program.ok()) return Status::failure("the variant's program did not load");
  v->program = std::make_unique<Program>(std::move(program.get()));
  variants_.push_back(std::move(v));
  stats_.resident = variants_.size();
  return variants_.back().get();
}

Method* ProgramVariants::method(MethodKind kind, const SlotMask& key, const LoadContext& context) {
  if (std::find(key.begin(), key.end(), true) == key.end() || context.file == nullptr) return nullptr;
  auto found = variant(key, context);
  if (!found.ok()) {
    stats_.failed++;
    stats_.last_error = found.status().message();
    return nullptr;
  }
  Variant& v = *found.value();
  v.last_used = ++clock_;
  if (v.broken) return nullptr;
  int i = static_cast<int>(kind);
  if (v.methods[i]) return v.methods[i].get();
  if (fits_ && !fits_(method_bytes_)) {
    stats_.refused++;
    return nullptr;
  }
  v.memory[i] = std::make_unique<MethodMemory>(context.arena->spans(context.planned_buffers, /*first=*/1));
  clear_last_runtime_error();
  Result<Method> loaded = v.program->load_method(method_name(kind), &v.memory[i]->manager,
                                                 /*event_tracer=*/nullptr, context.data_map, context.backend_options);
  if (!loaded.ok()) {
    v.broken = true;
    v.memory[i].reset();
    stats_.failed++;
    stats_.last_error = std::string(method_name(kind)) + " of a variant did not load (" +
                        executorch::runtime::to_string(loaded.error()) + ": " + last_runtime_error() + ")";
    return nullptr;
  }
  v.methods[i] = std::make_unique<Method>(std::move(loaded.get()));
  stats_.made++;
  return v.methods[i].get();
}

void ProgramVariants::clear() {
  variants_.clear();
  stats_.resident = 0;
}

uint64_t ProgramVariants::bytes() const {
  uint64_t methods = 0;
  for (const auto& v : variants_)
    for (const auto& m : v->methods) methods += m ? 1 : 0;
  return methods * method_bytes_;
}

VariantStats ProgramVariants::stats() const { return stats_; }

SlotMask absent_slots(const LoraData* lora, size_t slots) {
  SlotMask absent(slots, true);
  if (lora != nullptr)
    for (size_t s = 0; s < slots && s < lora->slots().size(); ++s) absent[s] = lora->slots()[s].rank == 0;
  return absent;
}

}  // namespace lora_share
