#include "memory_trim.h"

#include <malloc.h>

namespace lora_share::server {

MemoryTrimmer::MemoryTrimmer() {
#ifdef __GLIBC__
  // glibc raises both thresholds to the largest block freed so far (up to
  // 32 MiB, and twice that for the trim), so after one large body every
  // thread's arena kept a body's worth for good, and malloc_trim does not
  // shrink the top of a thread's arena. Fixed (mallopt turns the dynamic
  // ones off): a block of 1 MiB or more is a mapping of its own, unmapped when
  // freed, and an arena's free top above 1 MiB is returned when it forms.
  mallopt(M_MMAP_THRESHOLD, kLargeRequest);
  mallopt(M_TRIM_THRESHOLD, kLargeRequest);
#endif
  thread_ = std::thread([this] { run(); });
}

MemoryTrimmer::~MemoryTrimmer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void MemoryTrimmer::request() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_ = true;
  }
  wake_.notify_all();
}

void MemoryTrimmer::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return pending_ || stopping_; });
    if (stopping_) return;
    pending_ = false;
    lock.unlock();
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    lock.lock();
  }
}

}  // namespace lora_share::server
