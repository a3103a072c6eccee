#include "kv_rows.h"

#include <algorithm>
#include <cstring>

namespace lora_share {
namespace {

// The rows [first, last) of slab `j` that positions from..to-1 occupy, as at
// most two ranges (a ring wraps): a non-ring slab keeps position p at row
// p + 1 (the context's last position has none), a ring slab at 1 + p % W.
struct RowRanges {
  int64_t first[2] = {0, 0}, last[2] = {0, 0};
};

RowRanges rows_of(const KvLayout& kv, int64_t slab, int64_t from, int64_t to) {
  RowRanges r;
  if (from >= to) return r;
  if (!kv.is_ring[slab]) {
    r.first[0] = from + 1;
    r.last[0] = std::min(to + 1, kv.max_seq_len);
    if (r.first[0] > r.last[0]) r.first[0] = r.last[0];
    return r;
  }
  int64_t w = kv.ring;
  if (to - from >= w) {
    r.first[0] = 1;
    r.last[0] = w + 1;
    return r;
  }
  int64_t a = from % w, b = to % w;  // rows 1 + a .. 1 + b - 1, wrapping
  if (a < b) {
    r.first[0] = 1 + a;
    r.last[0] = 1 + b;
  } else {
    r.first[0] = 1 + a;
    r.last[0] = w + 1;
    r.first[1] = 1;
    r.last[1] = 1 + b;
  }
  return r;
}

// Whether `count` values of `bytes` each (4: float32, 2: float16) are finite:
// a value is inf or NaN exactly when its exponent bits are all set.
bool finite_values(const uint8_t* data, size_t count, size_t bytes) {
  if (bytes == 4) {
    const uint32_t mask = 0x7f800000u;
    for (size_t i = 0; i < count; ++i) {
      uint32_t v;
      std::memcpy(&v, data + i * 4, 4);
      if ((v & mask) == mask) return false;
    }
    return true;
  }
  const uint16_t mask = 0x7c00u;
  for (size_t i = 0; i < count; ++i) {
    uint16_t v;
    std::memcpy(&v, data + i * 2, 2);
    if ((v & mask) == mask) return false;
  }
  return true;
}

}  // namespace

bool rows_finite(const KvCache& cache, int64_t positions) {
  const KvLayout& kv = cache.layout;
  size_t row = static_cast<size_t>(kv.head_dim);
  for (int64_t j = 0; j < kv.slabs; ++j) {
    RowRanges r = rows_of(kv, j, 0, positions);
    for (int k = 0; k < 2; ++k) {
      if (r.last[k] <= r.first[k]) continue;
      const uint8_t* start = cache.slab(j) + static_cast<size_t>(r.first[k]) * row * kv.value_bytes();
      if (!finite_values(start, static_cast<size_t>(r.last[k] - r.first[k]) * row, kv.value_bytes())) return false;
    }
  }
  return true;
}

void clear_rows(const KvCache& cache, int64_t from, int64_t to) {
  const KvLayout& kv = cache.layout;
  size_t row_bytes = static_cast<size_t>(kv.head_dim) * kv.value_bytes();
  for (int64_t j = 0; j < kv.slabs; ++j) {
    RowRanges r = rows_of(kv, j, std::max<int64_t>(from, 0), to);
    for (int k = 0; k < 2; ++k)
      if (r.last[k] > r.first[k])
        std::memset(cache.slab(j) + static_cast<size_t>(r.first[k]) * row_bytes, 0,
                    static_cast<size_t>(r.last[k] - r.first[k]) * row_bytes);
  }
}

}  // namespace lora_share
