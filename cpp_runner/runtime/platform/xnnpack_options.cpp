#include "xnnpack_options.h"

#include <executorch/runtime/backend/interface.h>

#include <cstring>
#include <mutex>
#include <string>

// ExecuTorch's threadpool; its header (extension/threadpool/threadpool.h) is
// not in the wheel, so the two members used here are declared as it declares
// them (the library exports them).
namespace executorch::extension::threadpool {
class ThreadPool final {
 public:
  size_t get_thread_count() const;
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace lora_share {

Status set_threads(int threads) {
  // Replacing the pool frees the one every loaded XNNPACK runtime points at:
  // only the first runtime of the process may choose; later ones take it as is.
  static std::mutex mutex;
  static bool in_use = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (threads < 0) return Status::usage("threads must be 0 (one per core) or more");
  auto* pool = executorch::extension::threadpool::get_threadpool();
  if (threads > 0 && (pool == nullptr || static_cast<int>(pool->get_thread_count()) != threads)) {
    if (in_use)
      return Status::usage("threads: this process already runs programs on " + std::to_string(thread_count()) +
                           " thread(s); the count is set before the first runtime opens");
    if (pool == nullptr || !pool->_unsafe_reset_threadpool(static_cast<uint32_t>(threads)))
      return Status::failure("could not set ExecuTorch's threadpool to " + std::to_string(threads) + " thread(s)");
  }
  in_use = true;
  return Status();
}

int thread_count() {
  auto* pool = executorch::extension::threadpool::get_threadpool();
  return pool == nullptr ? 1 : static_cast<int>(pool->get_thread_count());
}

using executorch::runtime::BackendOption;
using executorch::runtime::BackendOptions;
using executorch::runtime::Error;
using executorch::runtime::Span;

namespace {
constexpr char kBackend[] = "XnnpackBackend";
constexpr int kGlobalWorkspace = 2;
}  // namespace

Status XnnpackSettings::configure(bool weight_cache, bool share_workspace) {
  BackendOptions<2> options;
  options.set_option("weight_cache_enabled", weight_cache);
  if (share_workspace) options.set_option("workspace_sharing_mode", kGlobalWorkspace);
  Error err = executorch::runtime::set_option(kBackend, options.view());
  if (err == Error::NotFound)
    return Status::failure(
        "the XNNPACK backend is not registered: the runner "
        "was linked without libexecutorch_backend_xnnpack");
  if (err != Error::Ok)
    return Status::failure(std::string("XNNPACK rejected its options (") + executorch::runtime::to_string(err) + ")");
  return Status();
}

Status XnnpackSettings::use_packed_cache(const std::string& path) {
  if (path.empty()) {
    has_load_options_ = false;
    return Status();
  }
  if (path.size() >= executorch::runtime::kMaxOptionValueLength)
    return Status::failure(path + ": the packed-weights file's path must be shorter than " +
                           std::to_string(executorch::runtime::kMaxOptionValueLength) + " characters");
  load_options_.set_option("packed_cache_path", path.c_str());
  Error err = load_options_map_.set_options(kBackend, load_options_.view());
  if (err != Error::Ok) return Status::failure("could not set XNNPACK's packed_cache_path load option");
  has_load_options_ = true;
  return Status();
}

Status XnnpackSettings::save_packed_cache() {
  BackendOptions<1> options;
  options.set_option("save_weight_cache_on_disk", true);
  Error err = executorch::runtime::set_option(kBackend, options.view());
  if (err != Error::Ok)
    return Status::failure(std::string("could not save the packed-weight cache (") +
                           executorch::runtime::to_string(err) + ")");
  return Status();
}

XnnpackState XnnpackSettings::read_state() const {
  XnnpackState state;
  BackendOptions<2> options;
  options.set_option("weight_cache_enabled", false);
  options.set_option("workspace_sharing_mode", 0);
  if (executorch::runtime::get_option(kBackend, options.view()) == Error::Ok) {
    options.get_option("weight_cache_enabled", state.weight_cache);
    options.get_option("workspace_sharing_mode", state.workspace_sharing_mode);
  }
  state.threads = thread_count();
  return state;
}

}  // namespace lora_share
