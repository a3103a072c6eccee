// What both adapter implementations share: the KV cache's layout, forward's
// inputs over it, and the program's outputs read back.
#include "forward_io.h"

#include <algorithm>
#include <cstring>

namespace lora_share {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::extension::make_tensor_ptr;
using executorch::extension::TensorPtr;
using executorch::runtime::EValue;
using executorch::runtime::MethodMeta;
using executorch::runtime::TensorInfo;

Status cache_positions_program(const std::string& pte) {
  return Status::failure(pte +
                         ": built by an older lora-share (its forward takes cache "
                         "positions, not the runtime's KV cache): rebuild it with this "
                         "version");
}

Status position_from_cache_program(const std::string& pte) {
  return Status::failure(pte +
                         ": built by an older lora-share (its forward reads the position off "
                         "the KV cache's length, not an input): rebuild it with this version");
}

Status not_a_slab(const std::string& pte, size_t input) {
  return Status::failure(pte + ": forward's input " + std::to_string(input) +
                         " is not a KV slab like input 2 (float32 or float16 [rows, head_dim]), "
                         "as the export contract requires");
}

bool is_slab(const TensorInfo& info) {
  return (info.scalar_type() == ScalarType::Float || info.scalar_type() == ScalarType::Half) &&
         info.sizes().size() == 2 && info.sizes()[1] > 0;
}

// forward's inputs for `tokens` at positions pos..: the ids, pos, each slab's
// first kv_view_rows rows of `cache`, then the adapter's LoRA inputs. The export leaves
// graph inputs out of memory planning, so set_input points the method at this
// memory instead of copying it: the cache and the LoRA weights are read in
// place, and this object (and `lora`) must outlive execute().
class ForwardInputs {
 public:
  ForwardInputs(const std::vector<int64_t>& tokens, int64_t pos, const KvCache& cache,
                const std::vector<TensorPtr>& lora);
  // The values point into this object: a copy would share its ids.
  ForwardInputs(const ForwardInputs&) = delete;
  ForwardInputs& operator=(const ForwardInputs&) = delete;

  // In forward's input order.
  const std::vector<EValue>& values() const { return values_; }

 private:
  std::vector<int64_t> ids_;
  int64_t pos_;
  std::vector<TensorPtr> tensors_;
  std::vector<EValue> values_;
};

ForwardInputs::ForwardInputs(const std::vector<int64_t>& tokens, int64_t pos, const KvCache& cache,
                             const std::vector<TensorPtr>& lora)
    : ids_(tokens), pos_(pos) {
  const KvLayout& kv = cache.layout;
  tensors_.push_back(make_tensor_ptr({1, static_cast<SizesType>(ids_.size())}, ids_.data(), ScalarType::Long));
  tensors_.push_back(make_tensor_ptr({1}, &pos_, ScalarType::Long));
  for (int64_t j = 0; j < kv.slabs; ++j)
    tensors_.push_back(
        make_tensor_ptr({static_cast<SizesType>(kv.is_ring[j] ? kv.ring + 1 : kv_view_rows(pos, kv.rows(j))),
                         static_cast<SizesType>(kv.head_dim)},
                        cache.slab(j), kv.dtype));
  for (const TensorPtr& t : tensors_) values_.emplace_back(*t);
  for (const TensorPtr& t : lora) values_.emplace_back(*t);
}

// Whether positions pos.. of `count` tokens have rows in the cache: every
// slab input and write-back stays inside its own slab.
Status check_window(const KvLayout& kv, int64_t pos, size_t count, const std::string& what) {
  if (count == 0) return Status::failure(what + ": no tokens to feed");
  if (pos < 0 || pos + static_cast<int64_t>(count) > kv.max_seq_len)
    return Status::failure(what + ": positions " + std::to_string(pos) + ".." +
                           std::to_string(pos + static_cast<int64_t>(count) - 1) + " are outside its KV cache of " +
                           std::to_string(kv.max_seq_len) + " (max_seq_len)");
  return Status();
}

// forward's float32 [1, vocab] logits, copied into `out`.
Status logits_from_output(const EValue& value, int64_t vocab_size, const std::string& what, std::vector<float>* out) {
  if (!value.isTensor()) return Status::failure(what + " did not return a tensor");
  const auto& t = value.toTensor();
  if (t.scalar_type() != ScalarType::Float) return Status::failure(what + " returned a non-float32 tensor");
  if (t.numel() != vocab_size)
    return Status::failure(what + " returned " + std::to_string(t.numel()) + " values; expected vocab_size " +
                           std::to_string(vocab_size));
  out->resize(static_cast<size_t>(vocab_size));
  std::memcpy(out->data(), t.const_data_ptr<float>(), out->size() * sizeof(float));
  return Status();
}

// Output g + 1 holds the rows for positions pos..pos+count-1 of slabs
// g * heads.. (g * heads + heads - 1), slab by slab; each slab's block goes to
// its rows pos+1.., where the next call's slab input reads them; a ring's
// rows to 1 + p % W, of which only the last W positions survive anyway.
Status store_new_rows(const std::vector<EValue>& outputs, const KvCache& cache, int64_t pos, size_t count,
                      const std::string& what) {
  const KvLayout& kv = cache.layout;
  int64_t heads = kv.slabs_per_group();
  size_t row = static_cast<size_t>(kv.head_dim) * kv.value_bytes();  // bytes
  size_t block_bytes = count * row;                                  // one slab's new rows
  for (int64_t g = 0; g < kv.groups; ++g) {
    const EValue& value = outputs[static_cast<size_t>(g) + 1];
    if (!value.isTensor() || value.toTensor().scalar_type() != kv.dtype ||
        static_cast<size_t>(value.toTensor().numel()) != count * kv.head_dim * heads)
      return Status::failure(what + ": output " + std::to_string(g + 1) + " is not " + std::to_string(heads) + " x " +
                             std::to_string(count) + " x " + std::to_string(kv.head_dim) + " " +
                             (kv.dtype == ScalarType::Half ? "float16" : "float32") +
                             " values (the new rows of KV slabs " + std::to_string(g * heads) + ".." +
                             std::to_string(g * heads + heads - 1) + ")");
    const uint8_t* block = static_cast<const uint8_t*>(value.toTensor().const_data_ptr());
    for (int64_t h = 0; h < heads; ++h) {
      int64_t slab = g * heads + h;
      uint8_t* base = cache.slab(slab);
      if (!kv.is_ring[slab]) {
        // The context's last position has no row: no later call reads it.
        size_t kept = std::min<size_t>(count, static_cast<size_t>(kv.max_seq_len - pos - 1));
        std::memcpy(base + (pos + 1) * row, block + h * block_bytes, kept * row);
        continue;
      }
      int64_t n = static_cast<int64_t>(count);
      for (int64_t i = n > kv.ring ? n - kv.ring : 0; i < n; ++i)
        std::memcpy(base + (1 + (pos + i) % kv.ring) * row, block + h * block_bytes + i * row, row);
    }
  }
  return Status();
}

}  // namespace

int64_t kv_view_rows(int64_t pos, int64_t rows) {
  return std::min((pos + kKvRowBlock) / kKvRowBlock * kKvRowBlock, rows);
}

int64_t KvLayout::rows(int64_t slab) const { return is_ring[slab] ? ring + 1 : max_seq_len; }

int64_t KvLayout::slabs_per_group() const { return groups > 0 ? slabs / groups : 0; }

size_t KvLayout::values() const { return offsets.empty() ? 0 : offsets.back(); }

size_t KvLayout::value_bytes() const { return dtype == ScalarType::Half ? 2 : 4; }

size_t KvLayout::bytes() const { return values() * value_bytes(); }

uint8_t* KvCache::slab(int64_t j) const {
  size_t first = pool_slots * layout.offsets[j] + slot * static_cast<size_t>(layout.rows(j) * layout.head_dim);
  return data + first * layout.value_bytes();
}

KvCache KvCache::at_slot(size_t n) const {
  KvCache cache = *this;
  cache.slot = n;
  return cache;
}

StatusOr<KvLayout> read_kv_layout(const MethodMeta& forward, int64_t max_seq_len, int64_t ring, size_t lora_inputs,
                                  const std::string& pte) {
  size_t inputs = forward.num_inputs() >= lora_inputs ? forward.num_inputs() - lora_inputs : 0;
  auto slab_at = [&forward](size_t i) {
    if (i >= forward.num_inputs()) return false;
    auto info = forward.input_tensor_meta(i);
    return info.ok() && is_slab(info.get());
  };
  // Earlier contracts, refused with the fix: the position read off the slabs'
  // length (input 1 a slab), or cache positions (int64, no slab after them).
  if (slab_at(1)) return position_from_cache_program(pte);
  if (forward.num_inputs() > 1 && !slab_at(2)) {
    auto second = forward.input_tensor_meta(1);
    if (second.ok() && second->scalar_type() == ScalarType::Long) return cache_positions_program(pte);
  }
  if (inputs < 3)
    return Status::failure(pte + ": forward takes " + std::to_string(inputs) +
                           " input(s); the export contract gives it the tokens, the position "
                           "and one KV slab per layer, K/V and KV head");
  auto position = forward.input_tensor_meta(1);
  if (!position.ok() || position->scalar_type() != ScalarType::Long || position->sizes().size() != 1 ||
      position->sizes()[0] != 1)
    return Status::failure(pte +
                           ": forward's input 1 is not the position (int64 [1]), "
                           "as the export contract requires");
  auto first = forward.input_tensor_meta(2);
  if (!first.ok() || !is_slab(first.get())) return not_a_slab(pte, 2);
  if (max_seq_len < 1)
    return Status::failure(pte + ": get_max_seq_len() returned " + std::to_string(max_seq_len) +
                           "; it must be at least 1");
  if (ring < 0 || (ring > 0 && ring + 1 >= max_seq_len))
    return Status::failure(pte + ": its ring size (get_ring_size(), or get_sliding_window()) is " +
                           std::to_string(ring) + "; a ring is shorter than max_seq_len - 1 (" +
                           std::to_string(max_seq_len - 1) + ")");
  KvLayout layout;
  layout.slabs = static_cast<int64_t>(inputs - 2);
  layout.head_dim = first->sizes()[1];
  layout.max_seq_len = max_seq_len;
  layout.dtype = first->scalar_type();
  layout.ring = ring;
  layout.offsets.push_back(0);
  for (size_t i = 2; i < inputs; ++i) {
    auto info = forward.input_tensor_meta(i);
    if (!info.ok() || !is_slab(info.get()) || info->sizes()[1] != layout.head_dim ||
        info->scalar_type() != layout.dtype)
      return not_a_slab(pte, i);
    // A ring's input is M + 1 rows; every other slab's at most max_seq_len.
    layout.is_ring.push_back(ring > 0 && info->sizes()[0] == ring + 1);
    size_t rows = static_cast<size_t>(layout.rows(static_cast<int64_t>(i) - 2));
    layout.offsets.push_back(layout.offsets.back() + rows * static_cast<size_t>(layout.head_dim));
  }
  size_t groups = forward.num_outputs() > 1 ? forward.num_outputs() - 1 : 0;
  if (groups == 0 || layout.slabs % static_cast<int64_t>(groups) != 0)
    return Status::failure(pte + ": forward returns " + std::to_string(forward.num_outputs()) + " value(s) for " +
                           std::to_string(layout.slabs) +
                           " KV slabs; the export contract returns the logits and one "
                           "tensor of new rows per layer and key or value");
  layout.groups = static_cast<int64_t>(groups);
  return layout;
}

Status run_forward(const ForwardExecutor& execute, const KvCache& cache, const std::vector<TensorPtr>& lora,
                   const std::vector<int64_t>& tokens, int64_t pos, int64_t vocab_size, const std::string& what,
                   std::vector<float>* logits) {
  Status fits = check_window(cache.layout, pos, tokens.size(), what);
  if (!fits.ok()) return fits;
  ForwardInputs inputs(tokens, pos, cache, lora);
  auto outputs = execute(inputs.values());
  if (!outputs.ok()) return outputs.status();
  size_t expected = static_cast<size_t>(cache.layout.groups) + 1;
  if (outputs->size() != expected)
    return Status::failure(what + " returned " + std::to_string(outputs->size()) + " values; expected " +
                           std::to_string(expected) + " (the logits and the new rows of each layer's keys and values)");
  Status s = logits_from_output((*outputs)[0], vocab_size, what, logits);
  if (!s.ok()) return s;
  return store_new_rows(*outputs, cache, pos, tokens.size(), what);
}

Status pre_chunk_program(const std::string& pte) {
  return Status::failure(pte +
                         ": built by an older lora-share (its forward takes input_pos, not "
                         "cache_positions): rebuild it with this version");
}

StatusOr<int64_t> int_from_output(const EValue& value, const std::string& what) {
  if (value.isInt()) return value.toInt();
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    if (t.numel() == 1 && t.scalar_type() == ScalarType::Long) return t.const_data_ptr<int64_t>()[0];
    if (t.numel() == 1 && t.scalar_type() == ScalarType::Int)
      return static_cast<int64_t>(t.const_data_ptr<int32_t>()[0]);
  }
  return Status::failure(what + " did not return one integer");
}

}  // namespace lora_share
