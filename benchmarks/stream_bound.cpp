// The fastest a float32 decode of SmolLM2-135M's shape can be on this machine: every weight streamed
// once per token and nothing else. SmolLM2-135M's 30 layers of 7 linears (q, k, v, o, gate, up, down)
// and its 49,152-row output projection, 540 MB of float32, each linear a product of one input row on
// two threads (each half of the output rows, a barrier after every linear, as an engine must), the
// weights in 2 MiB pages, laid out [rows / 32][in][32] as XNNPACK packs them. No attention, norms or
// LoRA: what is left of an engine's token beyond this figure is its own work.
//
// `lora-share bench-peers` compiles it and runs it between its fp32 requests, so both engines' decode
// is read against the bound of the same minutes (README, "Against llama.cpp"). By hand:
//   g++ -O3 -march=native -pthread benchmarks/stream_bound.cpp -o /tmp/stream_bound && /tmp/stream_bound
// prints the median and best milliseconds per token over 60 tokens and the rate that median streams at.
// `--tokens N` times N tokens instead; `--json` prints one JSON object (what bench-peers reads);
// `--fused` runs q/k/v and gate/up as one linear each (what fusing them would save an engine);
// `--small-pages` leaves the weights in 4 KiB pages (as a process that does not ask for 2 MiB ones).
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr size_t kTile = 32;  // output rows per packed tile, XNNPACK's 1x32 layout on AVX-512

struct Linear {
  size_t rows, in;
  const float* packed;  // [rows / kTile][in][kTile]
};

float input[4096] __attribute__((aligned(64)));
float output[49152] __attribute__((aligned(64)));

// Output rows [begin, end) of `l` for the one input row.
void product(const Linear& l, size_t begin, size_t end) {
  for (size_t r = begin; r < end; r += kTile) {
    const float* w = l.packed + r * l.in;
#if defined(__AVX512F__)
    __m512 lo = _mm512_setzero_ps(), hi = lo;
    for (size_t k = 0; k < l.in; ++k, w += kTile) {
      const __m512 x = _mm512_set1_ps(input[k]);
      lo = _mm512_fmadd_ps(_mm512_load_ps(w), x, lo);
      hi = _mm512_fmadd_ps(_mm512_load_ps(w + 16), x, hi);
    }
    _mm512_storeu_ps(output + r, lo);
    _mm512_storeu_ps(output + r + 16, hi);
#elif defined(__AVX2__) && defined(__FMA__)
    // Four 8-wide accumulators cover a 32-row tile: the same bytes in the same order, on AVX2.
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (size_t k = 0; k < l.in; ++k, w += kTile) {
      const __m256 x = _mm256_set1_ps(input[k]);
      for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(_mm256_load_ps(w + 8 * j), x, acc[j]);
    }
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(output + r + 8 * j, acc[j]);
#else
    float acc[kTile] = {};
    for (size_t k = 0; k < l.in; ++k, w += kTile)
      for (size_t j = 0; j < kTile; ++j) acc[j] += w[j] * input[k];
    std::memcpy(output + r, acc, sizeof acc);
#endif
  }
}

std::vector<Linear> linears;
std::atomic<long> posted{0}, finished{0};

size_t half(const Linear& l) { return l.rows / (2 * kTile) * kTile; }

// The second thread: the upper half of every linear the main thread posts; spins, as engines' pools do.
void helper() {
  for (long seen = 0;;) {
    long now;
    while ((now = posted.load(std::memory_order_acquire)) == seen) {
    }
    if (now < 0) return;
    seen = now;
    const Linear& l = linears[(now - 1) % linears.size()];
    product(l, half(l), l.rows);
    finished.fetch_add(1, std::memory_order_release);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool fused = false, small_pages = false, json = false;
  int tokens = 60;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fused") == 0)
      fused = true;
    else if (std::strcmp(argv[i], "--small-pages") == 0)
      small_pages = true;
    else if (std::strcmp(argv[i], "--json") == 0)
      json = true;
    else if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc && (tokens = std::atoi(argv[i + 1])) > 0)
      ++i;
    else
      return std::fprintf(stderr, "error: bad flag %s (flags: --tokens N >= 1, --json, --fused, --small-pages)\n",
                          argv[i]),
             2;
  }
  std::vector<std::pair<size_t, size_t>> shapes;  // (rows, in)
  for (int layer = 0; layer < 30; ++layer) {
    if (fused)
      shapes.insert(shapes.end(), {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}});
    else
      shapes.insert(shapes.end(),
                    {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}});
  }
  shapes.push_back({49152, 576});

  size_t floats = 0;
  for (auto& s : shapes) floats += s.first * s.second;
  const size_t page = size_t{2} << 20, bytes = (floats * sizeof(float) + page - 1) / page * page;
  auto* weights = static_cast<float*>(std::aligned_alloc(page, bytes));
  if (weights == nullptr) return std::fprintf(stderr, "error: cannot allocate %zu bytes\n", bytes), 1;
  if (!small_pages) madvise(weights, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < floats; ++i) weights[i] = static_cast<float>(i % 7) * 0.01f;  // touch every page
  for (size_t k = 0; k < 4096; ++k) input[k] = 1.0f / 64;
  size_t at = 0;
  for (auto& s : shapes) linears.push_back({s.first, s.second, weights + at}), at += s.first * s.second;

  std::thread second(helper);
  std::vector<double> ms;
  long post = 0;
  for (int token = 0; token < tokens; ++token) {
    const auto start = std::chrono::steady_clock::now();
    for (const Linear& l : linears) {
      finished.store(0, std::memory_order_relaxed);
      posted.store(++post, std::memory_order_release);
      product(l, 0, half(l));
      while (finished.load(std::memory_order_acquire) == 0) {
      }
    }
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  posted.store(-1, std::memory_order_release);
  second.join();
  std::sort(ms.begin(), ms.end());
  const double mb = floats * sizeof(float) / 1e6, median = ms[ms.size() / 2];
  if (json)
    std::printf(
        "{\"mb\": %.1f, \"tokens\": %d, \"median_ms\": %.3f, \"best_ms\": %.3f, \"fused\": %s, "
        "\"huge_pages\": %s}\n",
        mb, tokens, median, ms[0], fused ? "true" : "false", small_pages ? "false" : "true");
  else
    std::printf("%s, %s pages: %.0f MB per token, median %.2f ms (%.1f GB/s, %.1f tokens/s), best %.2f ms\n",
                fused ? "fused q/k/v, gate/up" : "separate linears", small_pages ? "4 KiB" : "2 MiB", mb, median,
                mb / median, 1000 / median, ms[0]);
  std::free(weights);
}
