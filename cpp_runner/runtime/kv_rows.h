// What of a request stays in a KV cache after it (issue 58): only the rows of
// the tokens its slot keeps for a later request, and only while they are
// finite.
//
// forward reads a slab's rows 0..S-1 with S past the position (kv_view_rows
// pads it to a block) and masks the rows after it: a masked score is q.k +
// (-inf), so a row holding inf or NaN, or a key so large that q.k overflows,
// turns the next request's attention into NaN even though it is masked. A
// request that ran an adapter of absurd weights, or a mix of absurd scales,
// leaves such rows behind. So the runtime keeps every row past what a slot
// holds at zero, as a fresh cache is: the one-row path clears the rows a
// request wrote when it ends, a KV slot the rows past the prefix a new request
// keeps (SlotTable's Claim), and a slot whose rows hold a non-finite value
// after its request is cleared whole and never continued (rows_finite).
// Zeroed rows are bit for bit a fresh cache's, so an answer does not depend
// on what ran before it (but for a prefix hit's chunking, docs/batching.md).
#pragma once

#include <cstdint>

#include "forward_io.h"

namespace lora_share {

// Whether the rows of positions 0..positions-1 (a ring slab: the rows they
// map to) hold finite values only. Reads positions x slabs x head_dim values:
// one request's rows, once, against the steps that wrote them.
bool rows_finite(const KvCache& cache, int64_t positions);

// Zeroes the rows of positions from..to-1 in every slab (a ring slab: the rows
// they map to, every row once to - from reaches its window). Positions past
// the context's last row are ignored.
void clear_rows(const KvCache& cache, int64_t from, int64_t to);

}  // namespace lora_share
