// What a JSON schema asks that xgrammar would silently not enforce: keywords
// its converter reads past without a word (it warns about the rest, which
// the compiler turns into refusals: xgrammar_log.h). A constrained answer
// must validate against the schema as written, so such a schema is refused,
// naming the keyword and where it is (a JSON pointer into the schema).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "status.h"

namespace lora_share::constraint {

// Usage error for the first keyword xgrammar cannot enforce, walking the
// schema's subschemas (properties, items, $defs, anyOf, ...) but not its data
// (enum, const, default, examples).
Status check_schema_keywords(const nlohmann::json& schema);

}  // namespace lora_share::constraint
