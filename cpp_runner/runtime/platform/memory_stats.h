// Process memory as the kernel accounts it. PSS is the number that matters:
// pages of the foundation file mapped by several adapters (or processes) are
// divided among them, so it shows what one more adapter really costs.
#pragma once

#include <cstdint>

namespace lora_share {

struct MemoryStats {
  int64_t rss_kb = -1;       // Rss
  int64_t pss_kb = -1;       // Pss
  int64_t anon_kb = -1;      // Pss_Anon: heap, packed weights, KV caches
  int64_t file_kb = -1;      // Pss_File: mapped .ptd/.pte/libraries
  int64_t shmem_kb = -1;     // Pss_Shmem
  int64_t peak_rss_kb = -1;  // VmHWM from /proc/self/status
  int64_t huge_kb = -1;      // AnonHugePages: anonymous memory in 2 MiB pages
};

// Reads /proc/self/smaps_rollup and /proc/self/status; fields it cannot read
// stay -1 (e.g. on a kernel without smaps_rollup).
MemoryStats read_memory_stats();

}  // namespace lora_share
