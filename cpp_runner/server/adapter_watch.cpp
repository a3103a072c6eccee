#include "adapter_watch.h"

#include <iostream>
#include <utility>

#include <sys/stat.h>

#include "manifest.h"

namespace lora_share::server {
namespace {

// What changes when manifest.json is rewritten (a rename gives a new inode).
struct Stamp {
  ino_t inode = 0;
  off_t size = -1;
  timespec mtime{};
  bool operator==(const Stamp& o) const {
    return inode == o.inode && size == o.size && mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec;
  }
};

Stamp stamp_of(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return Stamp();
  return Stamp{st.st_ino, st.st_size, st.st_mtim};
}

}  // namespace

AdapterWatch::AdapterWatch(std::string dir, std::chrono::milliseconds interval,
                           std::function<void(const std::string&, const std::string&)> offer)
    : dir_(std::move(dir)), interval_(interval), offer_(std::move(offer)) {
  thread_ = std::thread([this] { run(); });
}

AdapterWatch::~AdapterWatch() {
  {
    std::lock_guard<std::mutex> lock(lock_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void AdapterWatch::run() {
  const std::string manifest = dir_ + "/manifest.json";
  Stamp last = stamp_of(manifest);
  // The server read the manifest before this thread took its first stamp: a rewrite in between
  // (a busy machine can schedule this thread late) would never differ from `last`, so one sweep now
  // offers whatever the file lists already.
  offer_listed();
  std::unique_lock<std::mutex> lock(lock_);
  while (!wake_.wait_for(lock, interval_, [this] { return stop_; })) {
    Stamp now = stamp_of(manifest);
    if (now == last || now.size < 0) continue;
    last = now;
    lock.unlock();
    offer_listed();
    lock.lock();
  }
}

void AdapterWatch::offer_listed() {
  // The writer renames a complete file into place: a read sees the old or the new one.
  auto manifest = read_manifest(dir_);
  if (!manifest.ok()) {
    std::cerr << "manifest.json changed but cannot be read (" << manifest.status().message()
              << "): serving the adapters known before" << std::endl;
    return;
  }
  for (const ManifestAdapter& a : manifest->adapters) offer_(a.name, dir_ + "/" + a.file);
}

}  // namespace lora_share::server
