// SHA-256 of a file, hex, through OpenSSL's libcrypto: a checksum the binding
// check compares with Python's hashlib, so it comes from a library both sides
// trust rather than a hand-written digest.
#pragma once

#include <string>

#include "status.h"

namespace lora_share::tok {

StatusOr<std::string> sha256_file(const std::string& path);

}  // namespace lora_share::tok
