#include "memory_stats.h"

#include <fstream>
#include <sstream>
#include <string>

namespace lora_share {
namespace {

// Calls `on_field(name, kb)` for each "Name:   123 kB" line of `path`.
template <typename F>
void read_kb_fields(const char* path, F on_field) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream value(line.substr(colon + 1));
    int64_t kb = 0;
    std::string unit;
    if (value >> kb >> unit && unit == "kB") on_field(line.substr(0, colon), kb);
  }
}

}  // namespace

MemoryStats read_memory_stats() {
  MemoryStats s;
  read_kb_fields("/proc/self/smaps_rollup", [&](const std::string& k, int64_t kb) {
    if (k == "Rss")
      s.rss_kb = kb;
    else if (k == "Pss")
      s.pss_kb = kb;
    else if (k == "Pss_Anon")
      s.anon_kb = kb;
    else if (k == "Pss_File")
      s.file_kb = kb;
    else if (k == "Pss_Shmem")
      s.shmem_kb = kb;
    else if (k == "AnonHugePages")
      s.huge_kb = kb;
  });
  read_kb_fields("/proc/self/status", [&](const std::string& k, int64_t kb) {
    if (k == "VmHWM") s.peak_rss_kb = kb;
  });
  return s;
}

}  // namespace lora_share
