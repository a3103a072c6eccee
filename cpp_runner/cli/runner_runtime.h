// The runner's side of the library: the runtime opened through
// lora_share_diag.h with the flags' loading variants and every --pte loaded,
// what the report needs of it (load time, memory, each adapter's shape), and
// requests with their timings and logits rows. Everything goes through the C
// API: the runner is one client of liblora_share, as any application can be.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flags.h"
#include "lora_share_diag.h"
#include "status.h"

namespace lora_share {

// Status for a failed C API call (`error`, filled by the call just made):
// the caller's mistakes (arguments, requests, the budget) are usage errors
// (exit 2), loading and running failures run errors (exit 1).
Status status_of(ls_status code, const ls_error& error);

// One adapter the runtime loaded, or the foundation alone ('base').
struct AdapterView {
  ls_adapter* handle = nullptr;  // null: 'base'
  std::string name, pte;
  int64_t vocab_size = 0, max_seq_len = 0, prefill_chunk = 0;
  double load_ms = 0;
};

struct GenerateRequest {
  std::vector<int64_t> prompt;
  ls_generate_options options;  // max_new_tokens, sampling; ignore_eos: stop at no id
  bool keep_logits = false;
  std::string prompt_label = "--tokens";  // names the prompt in request errors
};

// The options of the command line's flags (--max-new-tokens, --temperature,
// --seed, --ignore-eos), for a request from the command line.
ls_generate_options flag_options(const Options& options);

struct Reply {
  std::vector<int64_t> tokens;
  std::vector<float> logits;  // rows x vocab, row-major; empty unless kept
  int64_t rows = 0, vocab = 0;
  double prefill_ms = 0, decode_ms = 0;
  std::optional<double> prefill_tokens_per_s, decode_tokens_per_s;
};

class RunnerRuntime {
 public:
  // Opens --ptd (and --shared-ptd) and loads every --pte, timing it.
  static StatusOr<std::unique_ptr<RunnerRuntime>> load(const Options& options);
  ~RunnerRuntime();
  RunnerRuntime(const RunnerRuntime&) = delete;
  RunnerRuntime& operator=(const RunnerRuntime&) = delete;

  // The adapter called `name` (the .pte stem, or "base"), or null (also for
  // 'base' with --stock, which loads no shared program).
  const AdapterView* find(const std::string& name) const;
  // "a, b, c": the names, for error messages.
  std::string names() const;

  // Generates for `adapter`; `on_token`, if given, sees each token as it comes.
  StatusOr<Reply> generate(const AdapterView& adapter, const GenerateRequest& request,
                           const std::function<void(int64_t)>& on_token) const;

  // The program variants made so far (ls_diag_slot_variants).
  ls_diag_variants variants() const;

  std::string ptd, shared_ptd;        // as given ("" = none)
  std::vector<AdapterView> adapters;  // in --pte order
  std::optional<AdapterView> base;    // none with --stock
  ls_diag_loading loading{};
  ls_runtime* handle() const { return runtime_; }
  double load_ms = 0;
  ls_diag_memory after_load{};

 private:
  explicit RunnerRuntime(ls_runtime* runtime) : runtime_(runtime) {}
  ls_runtime* runtime_;
};

}  // namespace lora_share
