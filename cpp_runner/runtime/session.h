// Everything loaded once per process: XNNPACK settings, the shared
// foundation (with the adapters' shared tensors, if any) and every adapter
// named with --pte.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "adapter.h"
#include "flags.h"
#include "foundation.h"
#include "memory_stats.h"
#include "planned_arena.h"
#include "shared_adapter.h"
#include "status.h"
#include "xnnpack_options.h"

namespace lora_share {

struct Session {
  // Declaration order is destruction order in reverse: adapters must go
  // before the foundation they point into.
  XnnpackSettings xnnpack;
  // The foundation's data map: the programs' weights (shared path) and the
  // LoRA tensors an adapter reads from adapters_shared.ptd (both paths).
  std::unique_ptr<Foundation> foundation;
  // Planned memory of the programs' forward methods (planned_arena.h): one
  // for all, or one each with --private-arenas; none on the --stock path.
  std::vector<std::unique_ptr<PlannedArena>> arenas;
  // One per distinct program (every adapter of a deployment carries the
  // same one); none on the --stock path.
  std::vector<std::unique_ptr<SharedProgram>> programs;
  std::vector<std::unique_ptr<Adapter>> adapters;
  // The foundation alone ("base"): the first adapter's program with every
  // LoRA input a zero rank-1 pair; null on the --stock path.
  std::unique_ptr<Adapter> base;
  // The build's end-of-sequence ids (manifest.h, read_eos_ids); none with
  // --ignore-eos or without a tokenizer in the build.
  std::vector<int64_t> eos_ids;

  std::string ptd;         // --ptd, as given
  std::string shared_ptd;  // --shared-ptd, as given ("" = none)
  std::string mode;        // "shared" or "stock"
  std::string arena;       // "shared", "private" (one per program) or "module" (stock: each Module its own)
  size_t planned_bytes = 0;  // planned memory the runner allocated for forward
  XnnpackState xnnpack_state;
  bool packed_cache_warm = false;  // the cache file held data before loading
  double load_ms = 0;
  MemoryStats after_load;

  // The adapter called `name` (the .pte stem, or "base"), or null.
  Adapter* find(const std::string& name) const;
  // "a, b, c": the names, for error messages.
  std::string names() const;
};

StatusOr<std::unique_ptr<Session>> load_session(const Options& options);

}  // namespace lora_share
