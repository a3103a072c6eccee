// The named constants an XNNPACK delegate payload refers to (layout:
// schema/FORMAT.md, "XNNPACK payloads"), read with bounds checks.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace lora_share {

// Adds key -> size for every named constant of the payload at
// data[start, start + size) to `out`. Returns false and sets `error` if the
// payload is malformed.
bool xnnpack_named_constants(const uint8_t* data, uint64_t start, uint64_t size, std::map<std::string, uint64_t>* out,
                             std::string* error);

}  // namespace lora_share
