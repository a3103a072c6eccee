// What the runner prints: the --json object, the --serve answer lines, the
// error line of --serve, and the human summary.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "runner_runtime.h"

namespace lora_share {

// The one object --json prints for a single run. `text`: the decoded
// reply, present when there is a tokenizer.
std::string run_json(const RunnerRuntime& runtime, const AdapterView& adapter, const std::vector<int64_t>& prompt,
                     const Reply& g, const ls_diag_memory& end, const std::optional<std::string>& text = std::nullopt);

// One --serve answer line.
std::string serve_answer_json(const AdapterView& adapter, const std::vector<int64_t>& prompt, const Reply& g,
                              const std::optional<std::string>& text = std::nullopt);

// One --serve error line: {"error": "..."}.
std::string error_json(const std::string& message);

// Plain output: the ids on stdout's line is printed by main; this is the
// summary for stderr.
void print_summary(std::FILE* out, const RunnerRuntime& runtime, const AdapterView& adapter,
                   const std::vector<int64_t>& prompt, const Reply& g, const ls_diag_memory& end);

}  // namespace lora_share
