// What each of a runtime's N KV slots holds, and which slot a new request
// takes (docs/batching.md, "KV slots"; the C++ port of
// lora_share/inference/batching.py's Slots, which is the reference).
//
// A slot records whose KV it holds (an adapter's key, or the foundation
// alone's), the tokens fed into it from position 0, and its last use. It
// keeps them after its request ends, so a later request on the same adapter
// whose prompt begins with those tokens continues there (llama-server's
// cache_prompt): a prefix hit. Pure bookkeeping: no KV, no ExecuTorch; the
// scheduler owns the pools and calls this under its own lock. It says which
// rows the scheduler clears (kv_rows.h): a claim's rows past the prefix it
// keeps, and a slot forgotten because its KV held a non-finite value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace lora_share {

class SlotTable {
 public:
  // `slots` KV slots; `ring`: the program has ring (sliding-window) slabs,
  // which keep only their last W positions, so a slot continues only from
  // the end of what it holds.
  SlotTable(size_t slots, bool ring);

  struct Claim {
    size_t slot = 0;
    size_t kept = 0;   // prompt tokens whose KV the slot already holds
    size_t stale = 0;  // tokens the slot held before (>= kept): rows kept..stale-1 hold an earlier request's KV
  };
  // A free slot for `tokens` on `adapter` (any key the caller compares by
  // equality: a pool index, the base's): the free slot on the same adapter
  // holding the longest prefix of `tokens` (at most all but the last, which
  // must be fed for its logits), else the least recently used free slot. The
  // slot is then busy and holds `kept` tokens. `reuse` false: the least
  // recently used free slot, emptied (a request that asked for no prompt
  // cache). nullopt: every slot is busy.
  std::optional<Claim> claim(uint64_t adapter, const std::vector<int64_t>& tokens, bool reuse = true);
  // `n` more tokens were fed into `slot` (their KV written after what it holds).
  void fed(size_t slot, const int64_t* tokens, size_t n);
  // The request in `slot` ended: the slot keeps its tokens for a later one.
  void release(size_t slot);
  // `slot`'s KV was cleared (it held a non-finite value): it holds no tokens,
  // so no later request continues from it.
  void forget(size_t slot);

  size_t size() const { return slots_.size(); }
  size_t in_use() const;
  uint64_t prefix_hits() const { return prefix_hits_; }
  uint64_t prefix_tokens() const { return prefix_tokens_; }
  uint64_t forgotten() const { return forgotten_; }  // forget() calls
  const std::vector<int64_t>& tokens(size_t slot) const { return slots_[slot].tokens; }

 private:
  struct Slot {
    uint64_t adapter = 0;
    bool used = false;  // has held a request (its adapter means something)
    std::vector<int64_t> tokens;
    int64_t last_used = -1;
    bool busy = false;
  };
  std::vector<Slot> slots_;
  bool ring_;
  int64_t clock_ = 0;
  uint64_t prefix_hits_ = 0, prefix_tokens_ = 0, forgotten_ = 0;
};

}  // namespace lora_share
