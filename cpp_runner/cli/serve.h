// --serve: one request per input line, its answer as JSON lines on output.
// A line is one of:
//   "adapter<TAB>comma-separated ids";
//   the runner's JSON object {"adapter": "a", "prompt": "text" | "tokens":
//     [ids] | "messages": [...], "max_new_tokens": 32, "temperature": 0,
//     "seed": 0} (the last three optional, defaulting to the flags; a line's
//     temperature is the schema's, 0 to 2, --temperature any), answered
//     with one object: "tokens" (ending with the EOS id that stopped it),
//     "text" when the build has a tokenizer, the prompt's length and timings;
//   an OpenAI body ({"model": ..., "prompt": ...} or {"model": ...,
//     "messages": [...]}, every field the server takes), answered with the
//     server's JSON: the response, or with "stream": true one chunk a line.
// All three go through the library's one request schema (lora_share.h,
// REQUESTS): the runner's keys are its fields under other names. Generation
// stops after an EOS id of the build unless --ignore-eos (or the body's
// ignore_eos); the adapter "base" is the foundation alone. A bad request gets
// {"error": ...} and serving goes on; end of input ends it.
#pragma once

#include <istream>
#include <optional>
#include <ostream>

#include "flags.h"
#include "runner_runtime.h"
#include "status.h"
#include "text.h"

namespace lora_share {

// `text`: the build's tokenizer, or none when it has none.
Status serve(const RunnerRuntime& runtime, const Options& options, const std::optional<RunnerText>& text,
             std::istream& in, std::ostream& out);

}  // namespace lora_share
