// The tokenizer a build shipped, bound to the foundation it was built with
// (the contract lora_share/tokenizer/files.py bind_tokenizer follows too):
// the folder's manifest.json must describe the .ptd's foundation
// (foundation.fingerprint), its tokenizer section must be for that
// foundation, and every listed file present must have the listed sha256.
// Any mismatch is refused naming both files, as a usage error (the wrong
// files were given), with the wording of the Python side. The manifest comes
// parsed (formats/manifest.h, the one reader of the file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chat_format.h"
#include "manifest.h"
#include "status.h"
#include "tokenizer.h"

namespace lora_share::tok {

struct BoundTokenizer {
  std::string folder;
  Tokenizer tokenizer;
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::optional<ChatFormat> chat;  // none: the build resolved no chat template
};

// The folder a --ptd's tokenizer is looked for in by default: the .ptd's own.
std::string folder_of(const std::string& path);

// The tokenizer in `folder`, whose manifest.json is `manifest` (parsed),
// bound to `ptd`; `ptd_fingerprint`: the fingerprint recorded inside `ptd`
// ("" if it has no lora-share record). nullopt: the manifest has no
// tokenizer section; see no_tokenizer_message.
StatusOr<std::optional<BoundTokenizer>> bind_tokenizer(const Manifest& manifest, const std::string& folder,
                                                       const std::string& ptd, const std::string& ptd_fingerprint);

// "<folder> has no tokenizer (the build's checkpoint had none): pass --tokens ids, ..."
std::string no_tokenizer_message(const std::string& folder);

}  // namespace lora_share::tok
