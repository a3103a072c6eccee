// JSON from clients, read with bounds: a body is refused for its size or
// its nesting while it is read (a SAX pass that stops at the first level too
// deep), before any value is built from it, so no body can make the parser,
// a destructor or a message recurse deeply; and values are quoted in
// messages by a short prefix written without recursion.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "status.h"

namespace lora_share::requests {

struct JsonBounds {
  size_t max_bytes;
  size_t max_depth;  // levels of arrays and objects; the body's own object is 1
};

// `text` parsed, or a usage error: too large, nested deeper than the bounds
// (naming the byte where it went too deep), or not JSON (naming the byte).
StatusOr<nlohmann::json> parse_bounded(const std::string& text, const JsonBounds& bounds);

// At most `limit` bytes of `value` as JSON text, "…" after a cut: written
// element by element with an explicit stack, whatever the value's depth.
std::string preview(const nlohmann::json& value, size_t limit = 48);

}  // namespace lora_share::requests
