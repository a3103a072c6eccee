#include "packed_cache.h"

#include "huge_pages.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#ifndef LORA_SHARE_VERSION
#define LORA_SHARE_VERSION "unknown"
#endif
#ifndef LORA_SHARE_EXECUTORCH_VERSION
#define LORA_SHARE_EXECUTORCH_VERSION "unknown"
#endif

namespace lora_share {
namespace {

// The file as XNNPACK writes it (ExecuTorch's XNNWeightsCache): packed data,
// an index of entries [name_len:u32][name][file_offset:u64][data_size:u64]
// [seed:u32], then a footer [index_start:u64][entry_count:u32][magic:u32]
// [version:u32] that it reads from the file's last 20 bytes. It stops reading
// the index after entry_count entries, so bytes between the index and the
// footer are its to ignore: this appends [key][key_len:u32][kMagic:u32] and a
// copy of the footer there. The key includes ExecuTorch's version, so a
// runtime that writes another layout never reads this one.
constexpr size_t kFooter = 20;
constexpr uint32_t kMagic = 0x4b50534c;  // "LSPK"
constexpr size_t kMaxKey = 4096;

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string hex16(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(v));
  return text;
}

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// The CPU's feature list as the kernel reports it ("flags" on x86, "Features"
// on Arm): XNNPACK picks its kernels, and so its packing, from these.
std::string cpu_features() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) return line;
  return "unknown";
}

bool read_at(int fd, void* buf, size_t n, off_t at) { return ::pread(fd, buf, n, at) == static_cast<ssize_t>(n); }

// "" if `fd` holds a complete file for `key`, else why not.
std::string check_file(int fd, const std::string& key) {
  struct stat st;
  if (fstat(fd, &st) != 0) return std::strerror(errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 2 * kFooter + 8) return "truncated";
  uint8_t tail[kFooter + 8];
  if (!read_at(fd, tail, sizeof(tail), static_cast<off_t>(size - sizeof(tail)))) return "unreadable";
  uint32_t key_len = read_le<uint32_t>(tail);
  if (read_le<uint32_t>(tail + 4) != kMagic || key_len > kMaxKey || key_len + sizeof(tail) + kFooter > size)
    return "truncated, or not written by lora-share";
  const uint64_t block = size - sizeof(tail) - key_len;  // where the key starts
  std::string found(key_len, '\0');
  if (!read_at(fd, found.data(), key_len, static_cast<off_t>(block))) return "unreadable";
  if (found != key) return "written for another foundation, program, runtime or CPU";
  // The footer XNNPACK wrote, just before the key, is the one it will read.
  uint8_t footer[kFooter];
  if (!read_at(fd, footer, kFooter, static_cast<off_t>(block - kFooter)) || std::memcmp(footer, tail + 8, kFooter) != 0)
    return "changed after it was written";
  const uint64_t index_start = read_le<uint64_t>(footer);
  const uint32_t entries = read_le<uint32_t>(footer + 8);
  const uint64_t index_end = block - kFooter;
  if (index_start > index_end) return "its index is damaged";
  std::string index(index_end - index_start, '\0');
  if (!read_at(fd, index.data(), index.size(), static_cast<off_t>(index_start))) return "unreadable";
  const auto* p = reinterpret_cast<const uint8_t*>(index.data());
  const uint8_t* end = p + index.size();
  for (uint32_t i = 0; i < entries; ++i) {
    if (end - p < 4) return "its index is damaged";
    uint32_t name_len = read_le<uint32_t>(p);
    if (static_cast<uint64_t>(end - p) < 4ull + name_len + 20) return "its index is damaged";
    p += 4 + name_len;
    uint64_t offset = read_le<uint64_t>(p), bytes = read_le<uint64_t>(p + 8);
    if (offset >= index_start || bytes > index_start - offset) return "its index is damaged";
    p += 20;
  }
  return "";
}

// Removes from `path`'s folder every other packed-weights file and every
// temporary one whose writer is gone. Processes that map a removed file keep
// their mapping (unlinking never takes pages from under a mapping).
void prune_folder(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string folder = path.substr(0, slash), keep = path.substr(slash + 1);
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    const size_t temp = name.find(".bin.tmp-");
    bool stale = false;
    if (temp != std::string::npos) {
      const long pid = std::strtol(name.c_str() + temp + 9, nullptr, 10);
      stale = pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    } else {
      stale = name != keep && name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0;
    }
    if (stale) ::unlink((folder + "/" + name).c_str());
  }
  ::closedir(dir);
}

void note(const std::string& text) { std::fprintf(stderr, "lora-share: packed-weights cache: %s\n", text.c_str()); }

// A new, empty file beside `path` that no other process uses; "" if the
// folder takes none.
std::string new_temp(const std::string& path, std::string* why) {
  static std::atomic<unsigned> counter{0};
  std::string temp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = std::strerror(errno);
    return "";
  }
  ::close(fd);
  return temp;
}

Status make_folders(const std::string& dir) {
  for (size_t at = dir.find('/', 1);; at = dir.find('/', at + 1)) {
    std::string part = dir.substr(0, at);
    if (!part.empty() && ::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::failure(std::strerror(errno));
    if (at == std::string::npos) break;
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return Status::failure("not a folder");
  return Status();
}

}  // namespace

std::string packed_cache_key(const std::string& fingerprint, const std::string& program_sha256) {
  return "lora-share packed weights 1\nfoundation " + fingerprint + "\nprogram " + program_sha256 +
         "\nexecutorch " LORA_SHARE_EXECUTORCH_VERSION "\nlora-share " LORA_SHARE_VERSION "\ncpu " +
         hex16(fnv1a(cpu_features())) + "\n";
}

PackedFolders packed_cache_folders(const std::string& dir, const std::string& ptd) {
  PackedFolders folders;
  if (!dir.empty()) {
    folders.paths = {dir};
    return folders;
  }
  size_t slash = ptd.rfind('/');
  folders.paths.push_back((slash == std::string::npos ? std::string(".") : ptd.substr(0, slash)) + "/.packed");
  folders.own = true;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg != nullptr && xdg[0] == '/')
    folders.paths.push_back(std::string(xdg) + "/lora-share/packed");
  else if (home != nullptr && home[0] == '/')
    folders.paths.push_back(std::string(home) + "/.cache/lora-share/packed");
  return folders;
}

Status check_packed_cache_folder(const std::string& dir) {
  Status s = make_folders(dir);
  if (s.ok()) {
    std::string why, probe = new_temp(dir + "/.probe", &why);
    if (probe.empty())
      s = Status::failure(why);
    else
      ::unlink(probe.c_str());
  }
  if (s.ok()) return s;
  return Status::usage("--packed-cache " + dir + ": cannot write there (" + s.message() +
                       "): give a folder this process can write, or --no-packed-cache");
}

std::unique_ptr<PackedCache> PackedCache::locate(const PackedFolders& folders, const std::string& key) {
  std::unique_ptr<PackedCache> cache(new PackedCache());
  cache->key_ = key;
  const std::string name = hex16(fnv1a(key)) + ".bin";
  for (const std::string& folder : folders.paths) {
    cache->path_ = folder + "/" + name;
    if (::access(cache->path_.c_str(), F_OK) != 0) continue;
    std::string why = cache->open_and_check();
    if (why.empty()) {
      cache->found_warm_ = true;
      // Already in 2 MiB folios when published here; this reads it so again
      // when the page cache has dropped it since (a reboot).
      settle_file_in_huge_folios(cache->fd_, /*drop_cached=*/false);
      return cache;
    }
    note(cache->path_ + " ignored (" + why + "); writing it again");
  }
  std::string tried;
  for (const std::string& folder : folders.paths) {
    std::string why;
    Status s = make_folders(folder);
    if (s.ok()) {
      cache->path_ = folder + "/" + name;
      cache->temp_ = new_temp(cache->path_, &why);
      if (!cache->temp_.empty()) {
        cache->state_ = State::kCold;
        cache->prune_ = folders.own && folder == folders.paths[0];
        return cache;
      }
    } else {
      why = s.message();
    }
    tried += (tried.empty() ? "" : ", ") + folder + ": " + why;
  }
  note("no folder to write it in (" + (tried.empty() ? std::string("none") : tried) + "); packing in memory");
  cache->path_.clear();
  return cache;
}

PackedCache::~PackedCache() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

std::string PackedCache::open_and_check() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return std::strerror(errno);
  // Shared: XNNPACK's exclusive lock (taken to write) then fails, so it never
  // writes or truncates the file other processes map.
  if (::flock(fd_, LOCK_SH | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    return "another process is writing it";
  }
  std::string why = check_file(fd_, key_);
  if (!why.empty()) {
    ::close(fd_);
    fd_ = -1;
    return why;
  }
  state_ = State::kWarm;
  return "";
}

Status PackedCache::publish() {
  if (state_ != State::kCold) return Status();
  int fd = ::open(temp_.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Status::failure(temp_ + ": " + std::strerror(errno));
  struct stat st;
  uint8_t footer[kFooter];
  bool ok = fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) > kFooter &&
            read_at(fd, footer, kFooter, st.st_size - static_cast<off_t>(kFooter));
  std::string block = key_;
  uint8_t tail[8];
  uint32_t key_len = static_cast<uint32_t>(key_.size());
  std::memcpy(tail, &key_len, 4);
  std::memcpy(tail + 4, &kMagic, 4);
  block.append(reinterpret_cast<const char*>(tail), sizeof(tail));
  block.append(reinterpret_cast<const char*>(footer), kFooter);
  ok = ok && ::pwrite(fd, block.data(), block.size(), st.st_size) == static_cast<ssize_t>(block.size());
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) return Status::failure(temp_ + ": XNNPACK wrote no packed weights there");
  if (std::rename(temp_.c_str(), path_.c_str()) != 0)
    return Status::failure("renaming " + temp_ + ": " + std::strerror(errno));
  temp_.clear();
  if (prune_) prune_folder(path_);
  return Status();
}

void PackedCache::open_published() {
  std::string why = open_and_check();
  if (why.empty()) {
    // Written through 4 KiB folios: dropped and read back in 2 MiB ones
    // before XNNPACK maps it (huge_pages.h says why).
    settle_file_in_huge_folios(fd_, /*drop_cached=*/true);
    return;
  }
  abandon(path_ + " cannot be read back (" + why + "); packing in memory");
}

void PackedCache::abandon(const std::string& why) {
  if (!why.empty()) note(why);
  state_ = State::kOff;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
  path_.clear();
}

}  // namespace lora_share
