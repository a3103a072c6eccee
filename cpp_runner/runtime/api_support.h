// What the two C headers' implementations share (c_api.cpp for lora_share.h,
// diag_api.cpp for lora_share_diag.h): the handles, the lock that serialises
// a runtime's calls, and Status -> ls_status with a one-line message. No C++
// exception may leave an entry point: each catches what the standard library
// may throw (bad_alloc) and reports it.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "adapter_pool.h"
#include "binding.h"
#include "compiler.h"
#include "lora_share.h"
#include "program_forward.h"
#include "row_constraint.h"
#include "scheduler.h"

struct ls_adapter {
  ls_runtime* runtime;
  size_t index;
  std::string name;
  std::string pte;
};

// A tokenizer and what the build says of it (EOS ids, chat template). Its
// lock serialises its calls: the BPE cache is not thread-safe.
struct ls_tokenizer {
  lora_share::tok::BoundTokenizer bound;
  std::mutex lock;
};

struct ls_program {
  ls_runtime* runtime;
  std::unique_ptr<lora_share::ForwardProgram> program;
  std::vector<std::vector<int64_t>> output_sizes;  // what the last run's ls_tensor.sizes point at
};

struct ls_runtime {
  std::unique_ptr<lora_share::AdapterPool> pool;
  // After `pool`, so that they go first: they read its foundation.
  std::vector<std::unique_ptr<ls_program>> programs;
  // Handles by pool index; unique_ptr so that handles stay where they are.
  std::vector<std::unique_ptr<ls_adapter>> handles;
  std::map<size_t, std::unique_ptr<ls_adapter>> mix_handles;  // by pool index, while held
  std::string base_pte;                                       // the file 'base' runs, once asked (ls_diag_adapter_info)
  std::string packed_cache;  // the packed-weights file in use, once asked (ls_diag_loading_info)
  std::mutex lock;
  std::atomic<std::thread::id> owner{};  // the thread holding `lock`
  std::atomic<int> lock_waiters{0};      // threads waiting for `lock` (Guard)
  // Messages name build/runner's flags (ls_diag_options.runner_messages).
  bool runner_messages = false;
  std::unique_ptr<ls_tokenizer> tokenizer;  // bound on first ask (ls_runtime_tokenizer)
  // Structured output, made with the first constraint (request_options.cpp): the
  // build's vocabulary compiled once with its grammars' cache, and the thread that
  // fills masks. Before `scheduler`, whose requests use them.
  std::unique_ptr<lora_share::constraint::Compiler> constraints;
  std::unique_ptr<lora_share::constraint::MaskWorker> mask_worker;
  // parallel > 1, or one slot with speculation: runs every ls_generate
  // (THREADS, SPECULATION). Last, so that it goes first: its thread uses the
  // pool and the lock.
  std::unique_ptr<lora_share::Scheduler> scheduler;
};

namespace lora_share::capi {

// Fills `error` (may be NULL) with `code` and `message` as one printable
// line; the checks the runner and the library share name the runner's flags,
// which are renamed to the library's parameters unless `runner_messages`.
void set_error(ls_error* error, ls_status code, const std::string& message, bool runner_messages = false);
void clear_error(ls_error* error);

// The whole text of this thread's last set_error (ls_diag_last_message).
const std::string& last_message();

// Status -> ls_status: a usage error of `usage_code`'s kind, else `failure_code`.
ls_status report(ls_error* error, const Status& status, ls_status usage_code, ls_status failure_code,
                 bool runner_messages = false);

// Whether `status` is the memory budget's refusal (LS_ERR_BUDGET).
bool is_budget_error(const Status& status);

// LS_ERR_ARGUMENT for a NULL `what`.
ls_status missing(ls_error* error, const char* what);

// LS_ERR_ARGUMENT if `adapter` (may be NULL: 'base') is another runtime's, else LS_OK.
ls_status check_owner(ls_runtime* runtime, const ls_adapter* adapter, ls_error* error);

// Holds the runtime's lock for one call; refuses a call from inside this
// runtime's own callback instead of deadlocking.
class Guard {
 public:
  explicit Guard(ls_runtime* rt);
  ~Guard();
  bool held() const { return held_; }

 private:
  ls_runtime* rt_;
  bool held_ = false;
};

// Whether this thread is inside a call on `rt` (holding its lock, or waiting
// in the batch with it released): a call from its callback is refused.
bool inside(const ls_runtime* rt);

// Releases the runtime's lock that this thread's Guard holds, for as long as
// it waits in the batch (the scheduler and the other callers need the lock),
// and takes it back; the thread still counts as inside the runtime.
class Unguard {
 public:
  explicit Unguard(ls_runtime* rt);
  ~Unguard();

 private:
  ls_runtime* rt_;
  const ls_runtime* outer_;
};

// LS_ERR_BUSY: a call from inside this runtime's callback.
ls_status busy(ls_error* error);

// "no adapter named 'x' (known: a, b)": LS_ERR_NOT_FOUND's message.
std::string unknown_adapter_message(ls_runtime* rt, const std::string& name);

// The handle of pool entry `index`, made on first ask.
ls_adapter* handle_for(ls_runtime* rt, size_t index);

// ls_options (NULL: defaults) as the pool's.
PoolOptions pool_options(const ls_options* options);

// LS_ERR_ARGUMENT for an option out of its range (parallel), else LS_OK.
ls_status check_options(const ls_options* options, ls_error* error);

// A runtime over `pool`, or NULL with `error` set: the budget's refusal is
// LS_ERR_BUDGET, another usage error `usage_code`, a failure LS_ERR_LOAD.
ls_runtime* finish_open(StatusOr<std::unique_ptr<AdapterPool>> pool, ls_status usage_code, bool runner_messages,
                        ls_error* error);

// The message of `error`, or of this thread's last error when it is NULL.
const char* error_text(const ls_error* error);

// `o`'s fields as adapter `index`'s requests pick tokens (request_options.cpp),
// ending at `stop_ids`: every field checked (LS_ERR_ARGUMENT for a value out of
// its range, LS_ERR_REQUEST for logit_bias ids outside the vocabulary and a
// constraint that is invalid or unsupported) and the constraint compiled. Call
// with the runtime's lock held: it is released while a constraint compiles.
ls_status read_picking(ls_runtime* rt, size_t index, const ls_generate_options& o, const std::vector<int64_t>& stop_ids,
                       Picking* picking, ls_error* error);

// What ls_diag_generate adds to a request; the defaults are ls_generate's.
struct GenerateExtras {
  const std::vector<int64_t>* stop_ids = nullptr;  // null: the build's EOS ids
  bool keep_logits = false;
  std::string prompt_label = "prompt";
  Generation* result = nullptr;  // filled on success when given
};

// ls_generate for pool entry `index` (AdapterPool::kBase: the foundation
// alone), with the runtime's lock held.
ls_status generate_index(ls_runtime* rt, size_t index, const int64_t* prompt, size_t n,
                         const ls_generate_options* options, ls_token_callback on_token, void* user_data,
                         const GenerateExtras& extras, ls_error* error);

// The runtime's tokenizer (ls_runtime_tokenizer) with the runtime's lock
// held, bound on first ask: LS_OK and *out set, or the error: LS_ERR_NOT_FOUND
// when the build has none, `usage_code` for files that do not go together.
ls_status runtime_tokenizer(ls_runtime* rt, ls_tokenizer** out, ls_error* error, ls_status usage_code = LS_ERR_LOAD);

}  // namespace lora_share::capi
