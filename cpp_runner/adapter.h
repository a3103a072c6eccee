// One loaded adapter: a program whose `forward(tokens, input_pos)` returns the
// logits at the last position, with its own KV cache. Two implementations:
// SharedAdapter (the point of the project: every adapter resolves its weights
// against one shared foundation map) and StockAdapter (one
// executorch::extension::Module per adapter, for comparison).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <executorch/runtime/backend/backend_options_map.h>

#include "foundation.h"
#include "status.h"

namespace lora_share {

class Adapter {
 public:
  virtual ~Adapter() = default;

  const std::string& name() const { return name_; }
  const std::string& pte_path() const { return pte_path_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  double load_ms() const { return load_ms_; }

  // Feeds `tokens` at positions pos.. and returns the logits after the last
  // one in `logits` (vocab_size floats).
  virtual Status step(const std::vector<int64_t>& tokens, int64_t pos,
                      std::vector<float>* logits) = 0;

 protected:
  std::string name_, pte_path_;
  int64_t vocab_size_ = 0, max_seq_len_ = 0;
  double load_ms_ = 0;
};

// Loads `pte` against the shared foundation. `backend_options` (may be null)
// is passed to the forward method's load, e.g. XNNPACK's packed_cache_path.
StatusOr<std::unique_ptr<Adapter>> load_shared_adapter(
    const std::string& pte, const Foundation& foundation,
    const executorch::runtime::LoadBackendOptionsMap* backend_options);

// Loads `pte` the way ExecuTorch's examples do: a Module that opens `ptd`
// (and `shared_ptd`, unless "") itself.
StatusOr<std::unique_ptr<Adapter>> load_stock_adapter(
    const std::string& pte, const std::string& ptd,
    const std::string& shared_ptd);

}  // namespace lora_share
