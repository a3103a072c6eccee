// The attend kernel's driver (attend_kernel.cpp's header comment): key
// blocks, online softmax, merge, threads, written once over an `Ops` struct
// of inner loops. Each instruction set's file (attend_portable.cpp,
// attend_avx2.cpp, attend_avx512.cpp) defines its Ops and instantiates the
// driver with them; attend_kernel.cpp picks one at run time.
#pragma once

#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "attend_kernel.h"

namespace lora_share {
namespace attend_loops {

using executorch::aten::TensorList;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kChunk = 64;     // keys per online-softmax step
constexpr int kRowBlock = 16;  // query rows per task (decode has R <= 16)
// Software prefetch: the cache rows about 8 KB ahead of the ones being read
// (the hardware prefetcher alone leaves a single core well below its bandwidth).
constexpr int kPrefetchBytes = 8192;
inline int prefetch_rows(int64_t row_bytes) {
  return static_cast<int>(std::max<int64_t>(16, kPrefetchBytes / std::max<int64_t>(1, row_bytes)));
}
// Below this much work (n_kv * R * (S + T) * hd multiply-adds) one call stays on the
// calling thread: the threadpool hand-off costs about as much as the work itself
// (measured: SmolLM2-135M's shape, 3 x 3 x 64, gains from 2 threads from S ~ 50).
constexpr int64_t kParallelMinWork = 32 * 1024;
// A key block handed to a thread covers at least this many positions.
constexpr int64_t kMinBlock = 128;

// ---- the driver: key blocks, online softmax, merge, threads --------------------------

struct Problem {
  int64_t n_kv, R, hd, hdp, S, T;
  const void* q;
  const void* k_new;
  const void* v_new;
  const void* bias;
  void* out;
  TensorList keys, values;
  int64_t slab_offset;  // elements into each of keys[h] and values[h] where the S rows start
};

// A 64-byte aligned float buffer that only grows: one per thread, so a call
// allocates nothing once the shapes have been seen.
class Scratch {
 public:
  float* get(size_t n) {
    if (n > size_) {
      buf_.reset(new float[n + 16]);
      size_ = n;
    }
    auto addr = reinterpret_cast<uintptr_t>(buf_.get());
    return reinterpret_cast<float*>((addr + 63) & ~static_cast<uintptr_t>(63));
  }

 private:
  std::unique_ptr<float[]> buf_;
  size_t size_ = 0;
};

inline thread_local Scratch t_work;      // a task's q, scores and key tile (and its accumulators when serial)
inline thread_local Scratch t_partials;  // the calling thread's per-task partial results

// One task's partial result: acc [kRowBlock][hdp], then m [kRowBlock], l [kRowBlock].
inline size_t partial_floats(int64_t hdp) { return static_cast<size_t>(kRowBlock * (hdp + 2)); }
inline size_t work_floats(int64_t hdp) { return static_cast<size_t>(kRowBlock * hdp + kRowBlock * kChunk + 16 * hdp); }

template <class Ops, class T>
struct Attend {
  // Rows [r0, r0 + nr) of head h over positions [p0, p1) of the S + T: running
  // max m, sum l and unnormalised accumulator acc (nr x hdp) per row.
  static void block(const Problem& P, int64_t h, int64_t r0, int nr, int64_t p0, int64_t p1, float* acc, float* m,
                    float* l, float* work) {
    const int hd = static_cast<int>(P.hd), hdp = static_cast<int>(P.hdp);
    float* q32 = work;
    float* s = q32 + kRowBlock * hdp;
    float* kt = s + kRowBlock * kChunk;
    const T* q = static_cast<const T*>(P.q) + (h * P.R + r0) * P.hd;
    for (int r = 0; r < nr; ++r) {
      Ops::to_f32(q + r * P.hd, hd, q32 + r * hdp);
      for (int d = hd; d < hdp; ++d) q32[r * hdp + d] = 0.0f;
    }
    std::fill(acc, acc + nr * hdp, 0.0f);
    std::fill(m, m + nr, kNegInf);
    std::fill(l, l + nr, 0.0f);
    const int64_t L = P.S + P.T;
    const T* bias = static_cast<const T*>(P.bias) + r0 * L;

    // Positions [a, b) of one segment (the cache, or this call's keys), whose
    // first position is bias column col0.
    auto segment = [&](const T* kb, const T* vb, int64_t a, int64_t b, int64_t col0) {
      for (int64_t c0 = a; c0 < b; c0 += kChunk) {
        const int n = static_cast<int>(std::min<int64_t>(kChunk, b - c0));
        bool any = false;  // a chunk no row may see is skipped (sliding windows)
        for (int r = 0; r < nr; ++r) {
          Ops::to_f32(bias + r * L + col0 + c0, n, s + r * kChunk);
          any = any || Ops::row_max(s + r * kChunk, n) != kNegInf;
        }
        if (!any) continue;
        Ops::scores(q32, nr, hdp, kb + c0 * P.hd, n, hd, kt, s, kChunk);
        for (int r = 0; r < nr; ++r) {
          float* row = s + r * kChunk;
          const float mx = Ops::row_max(row, n);
          if (mx == kNegInf) {
            std::fill(row, row + n, 0.0f);
            continue;
          }
          const float mn = std::max(m[r], mx);
          if (m[r] != kNegInf && mn > m[r]) {
            const float f = std::exp(m[r] - mn);
            Ops::scale(acc + r * hdp, hd, f);
            l[r] *= f;
          }
          l[r] += Ops::exp_sum(row, n, mn);
          m[r] = mn;
        }
        Ops::pv(s, nr, kChunk, vb + c0 * P.hd, n, hd, acc, hdp, kt);
      }
    };
    if (p0 < std::min(p1, P.S))
      segment(static_cast<const T*>(P.keys[h].const_data_ptr()) + P.slab_offset,
              static_cast<const T*>(P.values[h].const_data_ptr()) + P.slab_offset, p0, std::min(p1, P.S), 0);
    if (std::max(p0, P.S) < p1)
      segment(static_cast<const T*>(P.k_new) + h * P.T * P.hd, static_cast<const T*>(P.v_new) + h * P.T * P.hd,
              std::max(p0, P.S) - P.S, p1 - P.S, P.S);
  }

  static void finish(const Problem& P, int64_t h, int64_t r0, int nr, const float* acc, const float* l) {
    T* out = static_cast<T*>(P.out) + (h * P.R + r0) * P.hd;
    for (int r = 0; r < nr; ++r) {
      T* o = out + r * P.hd;
      if (l[r] > 0.0f)
        Ops::store(acc + r * P.hdp, 1.0f / l[r], static_cast<int>(P.hd), o);
      else
        std::memset(o, 0, static_cast<size_t>(P.hd) * sizeof(T));  // a row that sees nothing
    }
  }

  // Unit u (head, row block) over its whole range, finished into out.
  static void unit(const Problem& P, int64_t u, int64_t nrb) {
    const int64_t h = u / nrb, r0 = (u % nrb) * kRowBlock;
    const int nr = static_cast<int>(std::min<int64_t>(kRowBlock, P.R - r0));
    float* work = t_work.get(work_floats(P.hdp) + partial_floats(P.hdp));
    float* acc = work + work_floats(P.hdp);
    float* m = acc + kRowBlock * P.hdp;
    float* l = m + kRowBlock;
    block(P, h, r0, nr, 0, P.S + P.T, acc, m, l, work);
    finish(P, h, r0, nr, acc, l);
  }

  static void run(const Problem& P) {
    const int64_t nrb = (P.R + kRowBlock - 1) / kRowBlock;
    const int64_t units = P.n_kv * nrb;
    const int64_t L = P.S + P.T;
    const int64_t threads = std::max<int64_t>(1, executorch::extension::get_thread_count());
    const int64_t work = P.n_kv * P.R * L * P.hd;
    if (units == 0) return;
    if (threads == 1 || work < kParallelMinWork) {
      for (int64_t u = 0; u < units; ++u) unit(P, u, nrb);
      return;
    }
    // Key blocks per unit: the fewest that spread the tasks evenly over the
    // threads (parallel_for gives each thread one contiguous run of tasks).
    int64_t splits = 1;
    double best = 0.0;
    const int64_t max_splits = std::max<int64_t>(1, std::min<int64_t>(64, L / kMinBlock));
    for (int64_t sp = 1; sp <= max_splits; ++sp) {
      const int64_t tasks = units * sp;
      const double balance = static_cast<double>(tasks) / (((tasks + threads - 1) / threads) * threads);
      if (balance > best + 1e-9) {
        best = balance;
        splits = sp;
      }
      if (balance >= 0.99) break;
    }
    if (units * splits == 1) {
      unit(P, 0, nrb);
      return;
    }
    if (splits == 1) {
      const bool ok = executorch::extension::parallel_for(0, units, 1, [&](int64_t b, int64_t e) {
        for (int64_t u = b; u < e; ++u) unit(P, u, nrb);
      });
      if (!ok)
        for (int64_t u = 0; u < units; ++u) unit(P, u, nrb);
      return;
    }
    // Block b of a unit covers [b * span, (b + 1) * span), whole chunks.
    const int64_t span = ((L + splits - 1) / splits + kChunk - 1) / kChunk * kChunk;
    const int64_t tasks = units * splits;
    const size_t pf = partial_floats(P.hdp);
    float* partials = t_partials.get(pf * static_cast<size_t>(tasks));
    auto task = [&](int64_t t) {
      const int64_t u = t / splits, b = t % splits;
      const int64_t h = u / nrb, r0 = (u % nrb) * kRowBlock;
      const int nr = static_cast<int>(std::min<int64_t>(kRowBlock, P.R - r0));
      float* acc = partials + pf * static_cast<size_t>(t);
      float* m = acc + kRowBlock * P.hdp;
      float* l = m + kRowBlock;
      const int64_t p0 = std::min(L, b * span), p1 = std::min(L, (b + 1) * span);
      if (p0 >= p1) {  // nothing left for this block
        std::fill(m, m + nr, kNegInf);
        std::fill(l, l + nr, 0.0f);
        return;
      }
      block(P, h, r0, nr, p0, p1, acc, m, l, t_work.get(work_floats(P.hdp)));
    };
    const bool ok = executorch::extension::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) task(t);
    });
    if (!ok)
      for (int64_t t = 0; t < tasks; ++t) task(t);
    // Merge each unit's blocks into the first: rescale to the common max.
    const int hd = static_cast<int>(P.hd);
    for (int64_t u = 0; u < units; ++u) {
      const int64_t h = u / nrb, r0 = (u % nrb) * kRowBlock;
      const int nr = static_cast<int>(std::min<int64_t>(kRowBlock, P.R - r0));
      float* first = partials + pf * static_cast<size_t>(u * splits);
      float* fm = first + kRowBlock * P.hdp;
      float* fl = fm + kRowBlock;
      for (int r = 0; r < nr; ++r) {
        float mx = kNegInf;
        for (int64_t b = 0; b < splits; ++b) {
          const float* mb = partials + pf * static_cast<size_t>(u * splits + b) + kRowBlock * P.hdp;
          mx = std::max(mx, mb[r]);
        }
        if (mx == kNegInf) {
          fl[r] = 0.0f;
          continue;
        }
        float* a0 = first + r * P.hdp;
        const float w0 = fm[r] == kNegInf ? 0.0f : std::exp(fm[r] - mx);
        if (w0 != 1.0f) Ops::scale(a0, hd, w0);
        float lsum = fl[r] * w0;
        for (int64_t b = 1; b < splits; ++b) {
          const float* pb = partials + pf * static_cast<size_t>(u * splits + b);
          const float* mb = pb + kRowBlock * P.hdp;
          const float* lb = mb + kRowBlock;
          if (mb[r] == kNegInf) continue;
          const float w = std::exp(mb[r] - mx);
          Ops::axpy(a0, pb + r * P.hdp, w, hd);
          lsum += lb[r] * w;
        }
        fl[r] = lsum;
      }
      finish(P, h, r0, nr, first, fl);
    }
  }
};

// One instruction set's driver, for a float32 and a float16 cache.
using RunFn = void (*)(const Problem&);
struct Loops {
  RunFn f32;
  RunFn f16;
};

template <class Ops>
constexpr Loops loops_of() {
  return Loops{&Attend<Ops, float>::run, &Attend<Ops, half_t>::run};
}

// Defined by each instruction set's file; the x86-64 ones only there.
Loops portable_loops();
Loops avx2_loops();
Loops avx512_loops();

}  // namespace attend_loops
}  // namespace lora_share
