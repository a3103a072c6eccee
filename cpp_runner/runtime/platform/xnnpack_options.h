// XNNPACK settings. The delegate's option keys live in a header the wheel does
// not ship, so they are spelled out here as the strings the backend reads.
//
// - "weight_cache_enabled" (bool, process-wide): delegated weights are packed
//   once per name and shared by every method that uses them. Foundation
//   weights have the same name in every adapter, so N adapters pay for one
//   packed foundation.
// - "workspace_sharing_mode" (int, process-wide): 2 = one activation
//   workspace for every delegate in the process. Safe here because the runner
//   runs one method at a time.
// - "packed_cache_path" (string, per load only): back the weight cache with a
//   file so a later process maps the packed weights instead of repacking
//   (packed_cache.h chooses the file). One weight cache per path: loads with
//   the same path share their packed weights.
#pragma once

#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/options.h>

#include <string>

#include "status.h"

namespace lora_share {

struct XnnpackState {
  bool weight_cache = false;
  int workspace_sharing_mode = -1;  // -1: could not be read
  int threads = 0;                  // ExecuTorch's threadpool (thread_count)
};

// Sets how many threads ExecuTorch's threadpool (XNNPACK's and the CPU
// kernels') runs: `threads` >= 1, or 0 to keep its default (one per core).
// Process-wide, and only before the first program loads: an XNNPACK runtime
// keeps the pool it was created with. Each op a delegate parallelizes hands
// work to the other threads and waits for them; a decoded token runs a few
// hundred such ops (three per LoRA slot), most of them tiny, so on a host whose
// cores are busy with other work that hand-off, not the arithmetic, is most
// of a small op's time (docs/decoding.md, "Threads").
Status set_threads(int threads);

// The threads ExecuTorch's threadpool runs now.
int thread_count();

class XnnpackSettings {
 public:
  XnnpackSettings() = default;
  // The options map points into this object: it must stay where it is.
  XnnpackSettings(const XnnpackSettings&) = delete;
  XnnpackSettings& operator=(const XnnpackSettings&) = delete;

  // Turns the process-wide weight cache on or off. With `share_workspace`,
  // also asks for one workspace for the whole process.
  Status configure(bool weight_cache, bool share_workspace);

  // Per-load option: back the weight cache with `path` ("" = none: packed in memory).
  Status use_packed_cache(const std::string& path);

  // The options to pass to Program::load_method (nullptr if none).
  const executorch::runtime::LoadBackendOptionsMap* load_options() const {
    return has_load_options_ ? &load_options_map_ : nullptr;
  }

  // Writes the packed-weight index so the next process can map the file.
  Status save_packed_cache();

  // What the backend reports now.
  XnnpackState read_state() const;

 private:
  executorch::runtime::BackendOptions<2> load_options_;
  executorch::runtime::LoadBackendOptionsMap load_options_map_;
  bool has_load_options_ = false;
};

}  // namespace lora_share
