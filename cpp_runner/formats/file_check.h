// The runner's own checks of its input files, made before ExecuTorch sees
// them: structure (magic, headers, offsets, the flatbuffer tables the
// runtime reads without verifying), that the .ptd holds what the .pte will
// read from it in the form it will read it, and lora-share's records, so that
// a truncated, corrupt or mismatched file is one "error: ..." line, never a
// crash. Layouts: schema/FORMAT.md.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lora_record.h"
#include "status.h"

namespace lora_share {

// Checks that `path` is a readable regular file before ExecuTorch sees it,
// because ExecuTorch reports "missing" and "unreadable" with the same code.
// `flag` names the flag the path came from.
Status check_readable_file(const std::string& path, const std::string& flag);

struct PtdEntry {
  uint64_t size = 0;
  bool has_layout = false;
};

struct PtdInfo {
  Record record;
  std::map<std::string, PtdEntry> keys;
};

struct PteInfo {
  Record record;
  std::set<std::string> own_keys;  // the program's own named data
  // Where each of them is: key -> (absolute start, size) in the file.
  std::map<std::string, std::pair<uint64_t, uint64_t>> own_ranges;
  // Named constants of its XNNPACK payloads: key -> bytes read from it.
  std::map<std::string, uint64_t> delegate_constants;
  // Tensors whose data the program expects in a .ptd, by name.
  std::set<std::string> external_tensors;
};

// Checks the whole .ptd (header, FlatTensor flatbuffer, every segment and
// named data entry). `flag` names the command-line flag in messages.
StatusOr<PtdInfo> check_ptd(const std::string& path, const std::string& flag);

// The data files programs resolve against: the foundation (--ptd) and, for
// builds that hoist tensors several adapters share, adapters_shared.ptd
// (--shared-ptd). No key is in both (check_data_files makes sure).
struct DataFiles {
  std::string ptd;
  PtdInfo foundation;
  std::string shared_ptd;  // "" = none
  PtdInfo shared;

  // The entry for `key` and, in `path`, the file holding it; null if no
  // file has it.
  const PtdEntry* find(const std::string& key, std::string* path) const;
};

// check_ptd on both files, then that no key is in both: ExecuTorch's merged
// map refuses that, without naming the files.
StatusOr<DataFiles> check_data_files(const std::string& ptd, const std::string& shared_ptd);

// Checks the .pte's header, segment table, named data and XNNPACK payload
// headers, and collects what it needs from a .ptd (ExecuTorch then verifies
// the rest of the Program flatbuffer).
StatusOr<PteInfo> check_pte(const std::string& path, const std::string& flag);

// Whether the program reads anything from a data file: a weight or a LoRA
// tensor it does not hold itself (a stand-alone program holds them all).
bool needs_data_file(const PteInfo& info);

// Always: what the program reads from the data files is in a usable form
// wherever it is found (tensors have layouts, delegate constants are as large
// as the delegate reads). Unless `verify` is false: the adapter was built for
// this foundation (both records present, fingerprints equal). Then always:
// every key the program needs and does not hold itself, and every LoRA
// tensor its record names, is in one of the files. Failures name the files
// (and both fingerprints).
Status check_pair(const std::string& pte, const PteInfo& adapter, const DataFiles& files, bool verify);

// The one line for a program whose `missing` keys no data file has. With
// `built_for_foundation` (the records agree), a missing content hash can only
// be a tensor the build hoisted into adapters_shared.ptd.
std::string missing_keys_message(const std::string& pte, const std::string& ptd, const std::string& shared_ptd,
                                 const std::vector<std::string>& missing, bool built_for_foundation);

// `text` with every control character and every byte that is not part of
// valid UTF-8 replaced by '?': error messages quote keys and names read from
// files that may be corrupt, and must stay one readable line.
std::string printable(const std::string& text);

}  // namespace lora_share
