// One loaded adapter: a program whose forward takes tokens and the KV cache
// rows written so far, and returns the logits at the last position and the
// new rows (forward_io.h); the runtime owns the cache, not the program.
// Two implementations: SharedAdapter (adapter_on_foundation.h, the point of the
// project: every adapter resolves its weights against one shared foundation
// and runs in one planned-memory arena, which holds the KV cache too) and
// StockAdapter (adapter_per_module.cpp: one executorch::extension::Module per
// adapter, with its own KV cache, for comparison).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <executorch/runtime/backend/backend_options_map.h>

#include "file_check.h"
#include "foundation.h"
#include "lora_share.h"
#include "status.h"

namespace lora_share {

// The name that asks for the foundation alone (no adapter): the program an
// adapter carries with every LoRA input a zero rank-1 pair. No adapter may
// be called that (lora-share validate refuses it too).
inline constexpr char kBaseName[] = LS_BASE_NAME;

class Adapter {
 public:
  virtual ~Adapter() = default;

  const std::string& name() const { return name_; }
  const std::string& pte_path() const { return pte_path_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  // Most tokens one forward call takes; generate() feeds longer prompts in
  // chunks of this size.
  int64_t prefill_chunk() const { return prefill_chunk_; }
  double load_ms() const { return load_ms_; }
  // Whether its KV cache has ring slabs (sliding windows): decoding may then
  // overwrite the prompt's rows.
  bool ring_cache() const { return ring_cache_; }

  // Feeds `tokens` (at most prefill_chunk of them) at positions pos.., keeps
  // their K/V rows in the cache for later positions, and returns the logits
  // after the last one in `logits` (vocab_size floats). A request starts at
  // position 0 and reads the rows it wrote, and masked rows past them.
  virtual Status step(const std::vector<int64_t>& tokens, int64_t pos, std::vector<float>* logits) = 0;
  // Zeroes the rows of positions 0..positions-1 when a request ends, so that
  // the next reads masked rows a fresh cache holds (kv_rows.h says why).
  virtual void clear_rows(int64_t positions) = 0;

 protected:
  std::string name_, pte_path_;
  int64_t vocab_size_ = 0, max_seq_len_ = 0, prefill_chunk_ = 0;
  double load_ms_ = 0;
  bool ring_cache_ = false;
};

// Loads `pte` the way ExecuTorch's examples do: a Module that opens `ptd`
// ("" = a self-contained program) itself, its own program and planned
// memory. Its LoRA inputs are the tensors its record (`info`) names, read
// from the file's own named data or from `files`' adapters_shared.ptd.
StatusOr<std::unique_ptr<Adapter>> load_adapter_per_module(const std::string& pte, const std::string& ptd,
                                                           const PteInfo& info, const Foundation& files);

}  // namespace lora_share
