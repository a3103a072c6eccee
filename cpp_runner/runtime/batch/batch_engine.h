// The batched decode step (docs/batching.md, issue 47): N KV slots and up to
// B_max rows over one loaded SharedProgram that has decode_batch. Each row
// carries its own adapter (or none), its own position and its own slot; one
// decode_batch call streams the foundation's weights once for every row.
//
// KV slots. The program's KV buffer (arena buffer 0) holds `kv_slots` slots
// when the pool opened it so (PoolOptions::parallel): one pool per slab,
// [N, rows_j, head_dim], slot n of slab j contiguous at [n]. The engine runs
// over those pools, so the memory budget counts N slots through the arena;
// nothing is allocated per step. Slot 0 is also the one-row path's cache
// (SharedProgram::step): a caller that mixes the two owns that conflict.
// A slot's rows are valid only while the same program runs in the arena
// (programs of different envelopes share it; adapters of one program do not
// disturb each other's slots).
//
// LoRA rows. The engine owns B_max rows of LoRA buffers, per envelope slot
// A [B_max, r, in] and B [B_max, out, r] (decode_batch's contract: the
// adapter's own layouts, copied) at a step's rank r: the largest rank of its rows in that slot,
// not the envelope's. A row is laid out at its first step after set_row, and
// again only when the step's rank changes: a smaller rank or a slot the
// adapter leaves alone is zero-padded (adds exactly nothing).
// decode() takes rows 0..B-1 of those buffers in place: the rows a step runs
// must be exactly rows 0..B-1 (in any order in `rows`), so a scheduler keeps
// its live rows packed at the front (moving a row = set_row again).
//
// Drafts (speculative decoding; exporter revision 14 and later): a row of a
// step may carry its last token and k drafts after it (DraftRow), at
// consecutive positions of its slot, beside other rows of other requests and
// adapters; one step returns the logits after each of its tokens, each what
// one-token decode computes at that position bit for bit, as long as the
// tokens before it in the row are the sequence's. The program writes every
// token's K/V into the slot before any attends. Committing the accepted
// prefix and rolling back the rest is a matter of positions: the K/V of the
// accepted tokens are where one-token decode would have put them, and the
// rows after them (rejected drafts) are hidden by position from every later
// step, which overwrites them as it goes; a Gemma 3 ring keeps as many spare
// positions as a row has drafts, so that no draft overwrites a position its
// window still reads. The caller's next step for the slot starts right after
// what it accepted (accept_greedy in drafts.h).
//
// Threads: none of its own. One call at a time per program (forward, decode
// and decode_batch share the program's planned memory), as the pool's lock
// already ensures for the one-row path. The engine must not outlive the
// program (the pool unloads programs when its arena grows: make the engine
// again then).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "adapter_on_foundation.h"
#include "lora_data.h"
#include "status.h"

namespace lora_share {

// One row of a decode step: batch row `row` (its LoRA buffers, set_row),
// feeding `token` at position `pos` of KV slot `slot`.
struct BatchRow {
  size_t row;
  size_t slot;
  int64_t token;
  int64_t pos;
};

// A row that verifies drafts: batch row `row`'s LoRA, feeding `tokens` (its
// last token, then its drafts; 1..max_row_tokens()) at positions pos, pos + 1,
// .. of KV slot `slot`.
struct DraftRow {
  size_t row;
  size_t slot;
  std::vector<int64_t> tokens;
  int64_t pos;
};

class BatchEngine {
 public:
  // N = `slots` KV slots (at most program.kv_slots()) and B_max = min(N,
  // decode_batch's most rows) rows over `program`, which must be loaded, have
  // decode_batch and outlive the engine. A usage error names what to change
  // (rebuild an older program; fewer slots).
  static StatusOr<std::unique_ptr<BatchEngine>> create(SharedProgram& program, size_t slots);
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  size_t slots() const;       // N
  size_t rows() const;        // B_max
  size_t slot_bytes() const;  // one slot's KV bytes (all slabs)
  size_t bytes() const;       // all pools (N x slot_bytes) + LoRA row buffers

  // Fill row `row`'s LoRA inputs once, when a request joins it (nullptr:
  // base, zeros). decode reads the engine's copy; prefill reads `lora`'s
  // tensors in place (as the one-row path does), so `lora` must stay alive
  // (its adapter pinned) while the row is in use.
  Status set_row(size_t row, const LoraData* lora);

  // One prompt chunk of one request: forward over slot `slot`'s KV in place,
  // with row `row`'s LoRA, tokens at positions pos..pos+n-1 (n at most
  // prefill_chunk()); writes their K/V into the slot; logits (vocab_size()
  // floats) of the last token. Equals the one-row path (SharedProgram::step
  // with forward) on the same adapter, tokens and earlier KV.
  Status prefill(size_t row, size_t slot, const std::vector<int64_t>& tokens, int64_t pos, std::vector<float>* logits);

  // One decode_batch step over `rows` (each row's token at its pos in its
  // slot; their `row` fields exactly 0..rows.size()-1, each once; no two rows
  // on one slot); writes each row's new K/V into its slot (row pos + 1; a ring
  // slab 1 + pos % W); logits row-major [rows.size() x vocab], in the order
  // of `rows`.
  Status decode(const std::vector<BatchRow>& rows, std::vector<float>* logits);

  // Slot `to` takes slot `from`'s KV of positions 0..positions-1 (a ring
  // slab: all of it): a request's n choices each continue one prefill of
  // their prompt in a slot of their own.
  Status copy_slot(size_t from, size_t to, int64_t positions);

  // One decode_batch step in which each row carries its tokens (DraftRow, the
  // header comment's "Drafts"), under decode's rules for rows and slots, each
  // position inside the context. Rows of fewer tokens than the step's most
  // are padded after their last one (their logits are not returned; their
  // K/V land past the row's tokens, or nowhere past the context). logits:
  // one [vocab] row per token of each row, row by row in the order of `rows`:
  // the logits after that token. Refused (usage) on a program exported before
  // drafts (max_row_tokens() 1).
  Status verify(const std::vector<DraftRow>& rows, std::vector<float>* logits);
  // The most tokens a row of verify carries (decode_batch's bound); 1 for a
  // program exported before drafts.
  size_t max_row_tokens() const;

  int64_t vocab_size() const;
  int64_t max_seq_len() const;
  int64_t prefill_chunk() const;
  bool ring() const;  // any ring (sliding-window) slab: prefix reuse only from the end

 private:
  struct Impl;
  explicit BatchEngine(std::unique_ptr<Impl> impl);
  // decode and verify: rows.size() rows of `steps` tokens each (tokens and
  // pos row-major by batch row), logits of every token [n * steps, vocab] in
  // batch row order.
  Status run(size_t n, size_t steps, const std::vector<int64_t>& tokens, const std::vector<int64_t>& pos,
             const std::vector<int64_t>& slots, std::vector<float>* logits);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lora_share
