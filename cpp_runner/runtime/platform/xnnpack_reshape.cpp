#include "xnnpack_reshape.h"

#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

namespace lora_share {
namespace {

// XNNPACK's types and values as its C API (xnnpack.h) declares them; the
// wheel does not ship that header. Only the ABI matters here: an opaque
// runtime pointer and an int-sized status enum.
using Runtime = struct xnn_runtime*;
constexpr int kSuccess = 0;        // xnn_status_success
constexpr int kUninitialized = 1;  // xnn_status_uninitialized
constexpr size_t kMaxDims = 16;    // XNNPACK allows 6 (XNN_MAX_TENSOR_DIMS)

using ReshapeExternalFn = int (*)(Runtime, uint32_t, size_t, const size_t*);
using RuntimeFn = int (*)(Runtime);
using ShapeFn = int (*)(Runtime, uint32_t, size_t*, size_t*);

// The backend's own definitions, the next ones after this library's.
template <typename Fn>
Fn next_definition(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

bool skipping_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("LORA_SHARE_XNNPACK_RESHAPE");
    return v == nullptr || std::strcmp(v, "every-call") != 0;
  }();
  return enabled;
}

// Runtimes whose operators are reshaped for their inputs' current shapes.
std::mutex g_mutex;
std::unordered_set<Runtime>& planned() {
  static auto* set = new std::unordered_set<Runtime>();  // never destroyed: may be used at exit
  return *set;
}
std::atomic<uint64_t> g_run{0}, g_skipped{0};

bool same_shape(Runtime runtime, uint32_t id, size_t num_dims, const size_t* dims) {
  static const auto shape_of = next_definition<ShapeFn>("xnn_get_external_value_shape");
  size_t current_dims = 0;
  size_t current[kMaxDims];
  if (shape_of == nullptr || num_dims > kMaxDims || shape_of(runtime, id, &current_dims, current) != kSuccess) {
    return false;
  }
  return current_dims == num_dims && std::memcmp(current, dims, num_dims * sizeof(size_t)) == 0;
}

}  // namespace

ReshapeCounts reshape_counts() { return ReshapeCounts{g_run.load(), g_skipped.load()}; }

}  // namespace lora_share

using lora_share::Runtime;

extern "C" {

__attribute__((visibility("default"))) int xnn_reshape_external_value(Runtime runtime, uint32_t external_id,
                                                                      size_t num_dims, const size_t* dims) {
  static const auto real = lora_share::next_definition<lora_share::ReshapeExternalFn>("xnn_reshape_external_value");
  if (real == nullptr) return lora_share::kUninitialized;
  if (!lora_share::same_shape(runtime, external_id, num_dims, dims)) {
    std::lock_guard<std::mutex> lock(lora_share::g_mutex);
    lora_share::planned().erase(runtime);
  }
  return real(runtime, external_id, num_dims, dims);
}

__attribute__((visibility("default"))) int xnn_reshape_runtime(Runtime runtime) {
  static const auto real = lora_share::next_definition<lora_share::RuntimeFn>("xnn_reshape_runtime");
  if (real == nullptr) return lora_share::kUninitialized;
  if (lora_share::skipping_enabled()) {
    std::lock_guard<std::mutex> lock(lora_share::g_mutex);
    if (lora_share::planned().count(runtime) != 0) {
      lora_share::g_skipped.fetch_add(1, std::memory_order_relaxed);
      return lora_share::kSuccess;
    }
  }
  const int status = real(runtime);
  lora_share::g_run.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(lora_share::g_mutex);
  if (status == lora_share::kSuccess) {
    lora_share::planned().insert(runtime);
  } else {
    lora_share::planned().erase(runtime);
  }
  return status;
}

// A deleted runtime's address may be reused by the next one created.
__attribute__((visibility("default"))) int xnn_delete_runtime(Runtime runtime) {
  static const auto real = lora_share::next_definition<lora_share::RuntimeFn>("xnn_delete_runtime");
  if (real == nullptr) return lora_share::kUninitialized;
  {
    std::lock_guard<std::mutex> lock(lora_share::g_mutex);
    lora_share::planned().erase(runtime);
  }
  return real(runtime);
}

}  // extern "C"
