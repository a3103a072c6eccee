#include "huge_pages.h"

#if defined(__linux__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#endif

namespace lora_share {

#if defined(__linux__)
namespace {

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1's value, for older headers
#endif

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

struct Range {
  uintptr_t start, end;
};

// Private, writable, anonymous mappings (the heap and malloc's own mappings,
// where XNNPACK's packed weights live); files, stacks and the like are left.
std::vector<Range> anonymous_ranges() {
  std::vector<Range> out;
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return out;
  char line[4096 + 128];  // a path of PATH_MAX and the fields before it
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long start = 0, end = 0, inode = 0;
    char perms[8] = {0};
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %7s %*s %*s %lu %n", &start, &end, perms, &inode, &path_at) < 4) continue;
    const char* path = line + path_at;
    bool anonymous = inode == 0 && (path[0] == '\n' || path[0] == '\0' || std::strncmp(path, "[heap]", 6) == 0);
    if (anonymous && std::strncmp(perms, "rw-p", 4) == 0) out.push_back({start, end});
  }
  std::fclose(maps);
  return out;
}

// The 2 MiB-aligned ranges of `ranges` whose every 4 KiB page is resident:
// a partly touched range would gain its absent pages.
std::vector<uintptr_t> resident_chunks(const std::vector<Range>& ranges) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident(kHugePage / page);
  std::vector<uintptr_t> out;
  for (const Range& r : ranges)
    for (uintptr_t at = (r.start + kHugePage - 1) & ~(kHugePage - 1); at + kHugePage <= r.end; at += kHugePage) {
      if (mincore(reinterpret_cast<void*>(at), kHugePage, resident.data()) != 0) continue;
      bool all = true;
      for (unsigned char v : resident) all = all && (v & 1);
      if (all) out.push_back(at);
    }
  return out;
}

}  // namespace

void collapse_resident_memory(int threads) {
  static_assert(sizeof(uintptr_t) == sizeof(unsigned long), "maps addresses are unsigned long");
  std::vector<uintptr_t> chunks = resident_chunks(anonymous_ranges());
  // The kernel copies each range into a new page (~2.7 ms per 2 MiB measured
  // here): the threads the programs run on share the work.
  std::atomic<size_t> next{0};
  std::atomic<bool> unsupported{false};
  auto work = [&] {
    for (size_t i = next++; i < chunks.size() && !unsupported; i = next++) {
      if (madvise(reinterpret_cast<void*>(chunks[i]), kHugePage, MADV_COLLAPSE) != 0 &&
          (errno == EINVAL || errno == EPERM))
        unsupported = true;  // no MADV_COLLAPSE here, or THP disabled: stop asking
    }
  };
  unsigned n = threads > 0 ? static_cast<unsigned>(threads) : std::thread::hardware_concurrency();
  n = std::max(1u, std::min(n, 8u));
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < n; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
}

void settle_file_in_huge_folios(int fd, bool drop_cached) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return;
  const size_t size = static_cast<size_t>(st.st_size);
  if (drop_cached) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return;
  madvise(map, size, MADV_HUGEPAGE);
  // One read per 4 KiB page: where the kernel reads ahead in 2 MiB folios most
  // of these find the page mapped already.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  volatile unsigned char sink = 0;
  const unsigned char* bytes = static_cast<const unsigned char*>(map);
  for (size_t at = 0; at < size; at += page) sink = sink ^ bytes[at];
  (void)sink;
  munmap(map, size);
}

#else

void collapse_resident_memory(int) {}
void settle_file_in_huge_folios(int, bool) {}

#endif

}  // namespace lora_share
