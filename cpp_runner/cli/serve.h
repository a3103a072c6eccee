// --serve: one request per input line, one JSON line per request on output.
// A line is either "adapter<TAB>comma-separated ids" or a JSON object
//   {"adapter": "a", "prompt": "text" | "tokens": [ids],
//    "max_new_tokens": 32, "temperature": 0, "seed": 0}   (the last three
// optional, defaulting to the flags). Answers carry "tokens", and "text" when
// the build has a tokenizer; every generation stops after an EOS id of the
// build unless --ignore-eos. The adapter "base" is the foundation alone. A bad
// request gets {"error": ...} and serving goes on; end of input ends it.
#pragma once

#include <istream>
#include <ostream>

#include "binding.h"
#include "flags.h"
#include "runner_runtime.h"
#include "status.h"

namespace lora_share {

// `tokenizer`: the build's, or null when it has none.
Status serve(const RunnerRuntime& runtime, const Options& options, const tok::BoundTokenizer* tokenizer,
             std::istream& in, std::ostream& out);

}  // namespace lora_share
