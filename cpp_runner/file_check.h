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
  // Named constants of its XNNPACK payloads: key -> bytes read from it.
  std::map<std::string, uint64_t> delegate_constants;
  // Tensors whose data the program expects in a .ptd, by name.
  std::set<std::string> external_tensors;
};

// Checks the whole .ptd (header, FlatTensor flatbuffer, every segment and
// named data entry). `flag` names the command-line flag in messages.
StatusOr<PtdInfo> check_ptd(const std::string& path, const std::string& flag);

// Checks the .pte's header, segment table, named data and XNNPACK payload
// headers, and collects what it needs from a .ptd (ExecuTorch then verifies
// the rest of the Program flatbuffer).
StatusOr<PteInfo> check_pte(const std::string& path, const std::string& flag);

// Always: everything the program reads from the .ptd is there in a usable
// form (tensors have layouts, delegate constants are as large as the
// delegate reads). Unless `verify` is false: the adapter was built for this
// foundation (both records present, fingerprints equal). Failures name both
// files (and both fingerprints).
Status check_pair(const std::string& pte, const PteInfo& adapter,
                  const std::string& ptd, const PtdInfo& foundation,
                  bool verify);

// `text` with every control character and every byte that is not part of
// valid UTF-8 replaced by '?': error messages quote keys and names read from
// files that may be corrupt, and must stay one readable line.
std::string printable(const std::string& text);

}  // namespace lora_share
