// XNNPACK's packed weights of a foundation, kept in a file between starts.
//
// Why: XNNPACK repacks every foundation weight into its own layout each time
// a program loads (578 ms for SmolLM2-135M in float32, most of a start). Its
// weight cache can back the packed weights with a file instead: the first
// start writes it, later starts map it (31 ms). This decides which file, and
// keeps it safe to share:
//
// - Where: <folder of foundation.ptd>/.packed/ when that can be written, else
//   the user's cache folder ($XDG_CACHE_HOME/lora-share/packed, or
//   ~/.cache/lora-share/packed); or one folder the caller names.
// - Which: the file is named by a hash of its key and carries the whole key
//   (packed_cache_key: the foundation's fingerprint, the program's sha256,
//   the ExecuTorch and lora-share versions, the CPU's features), checked
//   before XNNPACK reads it. A file that is truncated, damaged or for another
//   key is ignored with a one-line note on stderr and written again.
// - How: written under a temporary name, then the key appended and the file
//   renamed into place, so no process ever maps a half-written file. XNNPACK
//   keeps an exclusive lock on a file it writes, and would truncate a file it
//   cannot read: a published file is only ever opened for reading here,
//   under a shared lock held as long as the runtime, so XNNPACK never takes
//   it for writing and any number of processes map it at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share {

// The key a packed-weights file is valid for: packed bytes depend on the
// foundation's weights and quantization (its fingerprint), on the program that
// uses them (its sha256: the operators, hence the packing), on the runtime
// (ExecuTorch's and lora-share's versions) and on the CPU (XNNPACK packs for
// the kernels it picks from the CPU's features).
std::string packed_cache_key(const std::string& fingerprint, const std::string& program_sha256);

// The folders a packed-weights file may live in, in order: `dir` alone when
// given, else beside `ptd` (its folder's .packed/, which belongs to that
// deployment alone: `own` is set) and the user's cache folder.
struct PackedFolders {
  std::vector<std::string> paths;
  bool own = false;  // paths[0] is the deployment's own folder
};
PackedFolders packed_cache_folders(const std::string& dir, const std::string& ptd);

// Makes `dir` (and its parents) a folder this process can write a file into;
// a usage error naming it otherwise.
Status check_packed_cache_folder(const std::string& dir);

class PackedCache {
 public:
  enum class State {
    kOff,   // no file: XNNPACK packs in memory
    kWarm,  // a valid file: XNNPACK maps it
    kCold,  // a temporary file XNNPACK writes; publish() puts it in place
  };

  // The file for `key` in `folders`: the first valid one (warm), else a new
  // temporary file in the first folder that takes one (cold), else none
  // (off, with a note). Files found invalid are noted and replaced later.
  static std::unique_ptr<PackedCache> locate(const PackedFolders& folders, const std::string& key);
  ~PackedCache();
  PackedCache(const PackedCache&) = delete;
  PackedCache& operator=(const PackedCache&) = delete;

  State state() const { return state_; }
  // The file to hand XNNPACK ("" when off): the published file when warm, the
  // temporary one when cold.
  const std::string& path() const { return state_ == State::kCold ? temp_ : path_; }
  // Whether a valid file was there before this process (the runner reports it).
  bool found_warm() const { return found_warm_; }

  // Cold, once XNNPACK has written the temporary file (a program loaded):
  // appends the key and renames it into place. In the deployment's own
  // folder, the files of other keys (an earlier build, runtime or CPU) and
  // temporary files of processes that died go: only this key is read there.
  // The caller then unloads what it loaded (XNNPACK's writer goes with it)
  // and calls open_published().
  Status publish();
  // After publish(): the published file, opened and locked for reading
  // (warm); off with a note if it cannot be.
  void open_published();
  // Gives up on the file (off), with a note saying `why` unless it is "":
  // the caller packs in memory.
  void abandon(const std::string& why);

 private:
  PackedCache() = default;
  // Opens path_ for reading, takes the shared lock and checks its key:
  // "" when valid (warm), else why not.
  std::string open_and_check();

  State state_ = State::kOff;
  std::string key_, path_, temp_;
  bool prune_ = false;  // publish() clears path_'s folder of stale files
  int fd_ = -1;         // path_, read-only, under a shared lock while warm
  bool found_warm_ = false;
};

}  // namespace lora_share
