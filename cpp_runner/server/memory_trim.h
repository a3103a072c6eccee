// Gives the allocator's free memory back to the system after large request
// bodies. glibc keeps what a thread freed in that thread's arena, and a body
// of megabytes (its bytes, httplib's copy, the JSON parsed from it: tens of
// bytes per value) leaves hundreds of MiB of free pages counted in the
// process's PSS until something trims them. Constructing a MemoryTrimmer
// fixes glibc's mmap and trim thresholds at 1 MiB for the whole process
// (memory_trim.cpp says why); malloc_trim(0) then returns the free pages
// inside every arena. It runs on a thread of its own, after the request is
// answered, and requests made while it runs fold into one more pass.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>

namespace lora_share::server {

class MemoryTrimmer {
 public:
  // Requests whose bytes reach this are worth a trim afterwards.
  static constexpr size_t kLargeRequest = 1 << 20;

  MemoryTrimmer();
  ~MemoryTrimmer();
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  // Asks for a trim soon (returns at once).
  void request();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  bool pending_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lora_share::server
