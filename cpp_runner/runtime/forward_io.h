// One forward call, from plain C++ values to logits, over a KV cache the
// runtime owns, with a clear error when the program does not follow the
// export contract (lora_share/model/decoder.py):
//
//   forward(tokens [1, T] int64, pos [1] int64, slab_0 [S, hd] kv, ...,
//           slab_{N-1}, A_0 [r_0, in_0] f32, B_0 [out_0, r_0] f32, ...)
//     -> (logits [1, vocab] f32, new_0 [H, T, hd] kv, ..., new_{G-1})
//
// where kv, the cache's element type, is f32 or f16 (foundation.kv_cache),
//
// feeds T tokens at positions P.. (P = pos). There is one slab per layer, K
// or V, and KV head, in that order (N = 2 * n_layers * n_kv_heads); slab j's
// input is its cache rows 0..S-1 for any S > P (kv_view_rows): the program
// masks the rows after P. There is one new-rows output per layer and K or V
// (G = 2 * n_layers, H = N / G): new_g holds the rows for positions
// P..P+T-1 of slabs g * H.. g * H + H - 1, which the runtime writes back into
// the cache before the next call (KvLayout). The LoRA inputs, two per slot of
// the program's envelope, come last (lora_data.h).
#pragma once

#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/executor/method_meta.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

// The runtime's KV cache: one buffer of `slabs` slabs, each max_seq_len
// rows of head_dim values of `dtype` (float32, or float16 when the program
// runs attention in float16). Position p lives at row p + 1, but for the
// context's last position, which no later call reads. Row 0 of every slab
// is a sink row that stays zero: the program masks it, and it exists only so
// that a slab input is never empty (it is all there is at position 0).
// A program with get_ring_size (M, `ring`; Gemma 3's sliding layers; before
// exporter revision 14, get_sliding_window, M = the window) takes those
// layers' slabs as rings of M + 1 rows, passed whole on every call: position
// p lives at row 1 + p % M, and the program masks the rows outside each
// query's window from the position. M is the window plus the most drafts a
// row of decode_batch verifies (batch/batch_engine.h), so that drafts written
// ahead never overwrite a position the window still reads.
struct KvLayout {
  int64_t slabs = 0, head_dim = 0, max_seq_len = 0;
  executorch::aten::ScalarType dtype = executorch::aten::ScalarType::Float;
  int64_t groups = 0;                // new-rows outputs: one per layer and K or V
  int64_t ring = 0;                  // M, or 0: no ring slabs
  std::vector<bool> is_ring;         // per slab
  std::vector<size_t> offsets;       // per slab, its first value; then the end
  int64_t slabs_per_group() const;   // the KV heads
  int64_t rows(int64_t slab) const;  // ring + 1 or max_seq_len
  size_t values() const;             // the whole cache
  size_t value_bytes() const;        // 4 (float32) or 2 (float16)
  size_t bytes() const;
};

// The rows of a slab (of `rows`) forward is given at position pos: pos + 1
// rounded up to a multiple of kKvRowBlock, at most `rows`. XNNPACK re-plans
// a delegate's memory whenever an input grows; a length that grew at every
// token cost every decoded token that (4-5% of an 8da4w token at
// SmolLM2-135M's shape), one that grows once per block costs it once per
// block. llama.cpp pads its KV view the same way. lora_share/model/decoder.py's
// KV_ROW_BLOCK is the same.
constexpr int64_t kKvRowBlock = 32;
int64_t kv_view_rows(int64_t pos, int64_t rows);

// forward's KV layout, read from its method meta (N = inputs - 2 -
// `lora_inputs`, hd = input 2's second dimension, the element type input 2's; with `ring` M > 0, the
// slab inputs of M + 1 rows are rings); refuses a program whose inputs and
// outputs do not follow the contract above, and names the fix for one built
// before it.
StatusOr<KvLayout> read_kv_layout(const executorch::runtime::MethodMeta& forward, int64_t max_seq_len, int64_t ring,
                                  size_t lora_inputs, const std::string& pte);

// A KV cache: layout.bytes() bytes at `data`, zeroed when allocated and
// owned by the caller. With `pool_slots` N > 1, `data` holds N caches laid
// out per slab (decode_batch's pools, docs/batching.md): pool j is
// [N, rows(j), head_dim] at N x offsets[j] values, and this cache is slot
// `slot` of them, each of its slabs contiguous (slab()).
struct KvCache {
  KvLayout layout;
  uint8_t* data = nullptr;
  size_t pool_slots = 1, slot = 0;
  // Slab j's first byte in this cache.
  uint8_t* slab(int64_t j) const;
  // Slot n of the same pools.
  KvCache at_slot(size_t n) const;
};

// Sets forward's inputs, runs it and returns its outputs, however the
// adapter holds its method.
using ForwardExecutor = std::function<StatusOr<std::vector<executorch::runtime::EValue>>(
    const std::vector<executorch::runtime::EValue>& inputs)>;

// Feeds `tokens` (1..prefill_chunk of them) at positions pos.. through
// `execute` over `cache` and the adapter's `lora` inputs
// (lora_input_tensors), writes their K/V rows into the cache and returns the
// logits after the last one (vocab_size floats) in `logits`. `what` names
// the call in errors.
Status run_forward(const ForwardExecutor& execute, const KvCache& cache,
                   const std::vector<executorch::extension::TensorPtr>& lora, const std::vector<int64_t>& tokens,
                   int64_t pos, int64_t vocab_size, const std::string& what, std::vector<float>* logits);

// The refusal for a program without get_prefill_chunk: exported before
// prefill chunks, so no input this runner builds fits it.
Status pre_chunk_program(const std::string& pte);

// A constant method's single int64 (get_max_seq_len, get_vocab_size).
StatusOr<int64_t> int_from_output(const executorch::runtime::EValue& value, const std::string& what);

}  // namespace lora_share
