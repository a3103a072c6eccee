// The C API (include/lora_share.h) over AdapterPool: argument checks, the
// runtime's lock, and Status -> ls_status + message. No C++ exception leaves
// this file: every entry point catches what the standard library may throw
// (bad_alloc) and reports it as an error.
#include "lora_share.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "adapter_pool.h"
#include "et_platform.h"
#include "file_check.h"
#include "memory_stats.h"

using lora_share::AdapterPool;
using lora_share::ExitCode;
using lora_share::Status;

struct ls_adapter {
  ls_runtime* runtime;
  size_t index;
  std::string name;
};

struct ls_runtime {
  std::unique_ptr<AdapterPool> pool;
  // Handles by pool index; unique_ptr so that handles stay where they are.
  std::vector<std::unique_ptr<ls_adapter>> handles;
  std::mutex lock;
  std::atomic<std::thread::id> owner{};  // the thread holding `lock`
};

namespace {

// The checks the runner and the library share name the runner's flags; an
// application knows the library's parameters instead.
std::string library_wording(std::string text) {
  static const std::pair<const char*, const char*> kRenames[] = {
      {"; --no-verify skips this check", "; ls_options.verify = 0 skips this check"},
      {"--max-new-tokens", "max_new_tokens"},
      {"--shared-ptd", "shared_ptd"},
      {"--ptd ", "ptd "},
      {"--pte ", "adapter "},
  };
  for (const auto& [from, to] : kRenames) {
    const std::string f(from), t(to);
    for (size_t at = text.find(f); at != std::string::npos; at = text.find(f, at + t.size()))
      text.replace(at, f.size(), t);
  }
  return text;
}

void set_error(ls_error* error, ls_status code, const std::string& message) {
  if (error == nullptr) return;
  error->code = code;
  std::string line = lora_share::printable(library_wording(message));
  size_t n = std::min(line.size(), sizeof(error->message) - 1);
  std::memcpy(error->message, line.data(), n);
  error->message[n] = '\0';
}

void clear_error(ls_error* error) {
  if (error == nullptr) return;
  error->code = LS_OK;
  error->message[0] = '\0';
}

// Status -> ls_status: a usage error of `usage_code`'s kind, else `failure_code`.
ls_status report(ls_error* error, const Status& status, ls_status usage_code,
                 ls_status failure_code) {
  ls_status code = status.code() == ExitCode::kUsageError ? usage_code : failure_code;
  set_error(error, code, status.message());
  return code;
}

ls_status missing(ls_error* error, const char* what) {
  set_error(error, LS_ERR_ARGUMENT, std::string(what) + " is NULL");
  return LS_ERR_ARGUMENT;
}

// Holds the runtime's lock for one call; refuses a call from inside this
// runtime's own callback instead of deadlocking.
class Guard {
 public:
  explicit Guard(ls_runtime* rt) : rt_(rt) {
    if (rt_->owner.load() == std::this_thread::get_id()) return;
    rt_->lock.lock();
    rt_->owner.store(std::this_thread::get_id());
    held_ = true;
  }
  ~Guard() {
    if (!held_) return;
    rt_->owner.store(std::thread::id());
    rt_->lock.unlock();
  }
  bool held() const { return held_; }

 private:
  ls_runtime* rt_;
  bool held_ = false;
};

ls_status busy(ls_error* error) {
  set_error(error, LS_ERR_BUSY,
            "called from inside this runtime's on_token callback: return from the "
            "callback first (requests of one runtime run one at a time)");
  return LS_ERR_BUSY;
}

ls_adapter* handle_for(ls_runtime* rt, size_t index) {
  while (rt->handles.size() <= index) rt->handles.emplace_back();
  if (!rt->handles[index])
    rt->handles[index].reset(new ls_adapter{rt, index, rt->pool->name(index)});
  return rt->handles[index].get();
}

ls_runtime* finish_open(lora_share::StatusOr<std::unique_ptr<AdapterPool>> pool,
                        ls_error* error) {
  if (!pool.ok()) {
    report(error, pool.status(), LS_ERR_BUDGET, LS_ERR_LOAD);
    return nullptr;
  }
  auto* rt = new ls_runtime();
  rt->pool = std::move(pool.value());
  clear_error(error);
  return rt;
}

lora_share::PoolOptions pool_options(const ls_options* options) {
  ls_options defaults;
  ls_options_init(&defaults);
  const ls_options& o = options ? *options : defaults;
  lora_share::PoolOptions p;
  p.shared_ptd = o.shared_ptd ? o.shared_ptd : "";
  p.verify = o.verify != 0;
  p.budget_bytes = o.budget_bytes;
  if (o.adapter_overhead_bytes != 0) p.adapter_overhead_bytes = o.adapter_overhead_bytes;
  return p;
}

ls_status generate_index(ls_runtime* rt, size_t index, const int64_t* prompt, size_t n,
                         const ls_generate_options* options, ls_token_callback on_token,
                         void* user_data, ls_error* error) {
  if (prompt == nullptr && n > 0) return missing(error, "prompt");
  if (n == 0) {
    set_error(error, LS_ERR_REQUEST, "the prompt is empty: give at least one token id");
    return LS_ERR_REQUEST;
  }
  ls_generate_options defaults;
  ls_generate_options_init(&defaults);
  const ls_generate_options& o = options ? *options : defaults;
  if (!(o.temperature >= 0)) {
    set_error(error, LS_ERR_ARGUMENT, "temperature must be 0 (greedy) or more");
    return LS_ERR_ARGUMENT;
  }
  lora_share::TokenCallback callback;
  if (on_token)
    callback = [on_token, user_data](int64_t token) { return on_token(token, user_data) == 0; };
  auto g = rt->pool->generate(index, std::vector<int64_t>(prompt, prompt + n),
                              o.max_new_tokens, o.temperature, o.seed, o.ignore_eos != 0, callback);
  if (!g.ok()) {
    // Usage errors come from check_request; failures from loading or running.
    bool loading = !rt->pool->resident(index);
    return report(error, g.status(), LS_ERR_REQUEST, loading ? LS_ERR_LOAD : LS_ERR_RUN);
  }
  clear_error(error);
  return LS_OK;
}

}  // namespace

extern "C" {

void ls_options_init(ls_options* options) {
  if (options == nullptr) return;
  options->shared_ptd = nullptr;
  options->verify = 1;
  options->budget_bytes = 0;
  options->adapter_overhead_bytes = 0;
}

void ls_generate_options_init(ls_generate_options* options) {
  if (options == nullptr) return;
  options->max_new_tokens = 16;
  options->temperature = 0.0;
  options->seed = 0;
  options->ignore_eos = 0;
}

const char* ls_status_name(ls_status code) {
  switch (code) {
    case LS_OK: return "LS_OK";
    case LS_ERR_ARGUMENT: return "LS_ERR_ARGUMENT";
    case LS_ERR_NOT_FOUND: return "LS_ERR_NOT_FOUND";
    case LS_ERR_LOAD: return "LS_ERR_LOAD";
    case LS_ERR_REQUEST: return "LS_ERR_REQUEST";
    case LS_ERR_RUN: return "LS_ERR_RUN";
    case LS_ERR_BUDGET: return "LS_ERR_BUDGET";
    case LS_ERR_BUSY: return "LS_ERR_BUSY";
  }
  return "unknown";
}

ls_runtime* ls_open(const char* ptd, const ls_options* options, ls_error* error) {
  if (ptd == nullptr) return missing(error, "ptd"), nullptr;
  try {
    lora_share::init_platform_for_library();
    lora_share::PoolOptions p = pool_options(options);
    p.ptd = ptd;
    return finish_open(AdapterPool::open(p), error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_open: ") + e.what());
    return nullptr;
  }
}

ls_runtime* ls_open_dir(const char* dir, const ls_options* options, ls_error* error) {
  if (dir == nullptr) return missing(error, "dir"), nullptr;
  if (options != nullptr && options->shared_ptd != nullptr) {
    set_error(error, LS_ERR_ARGUMENT,
              "ls_open_dir reads adapters_shared.ptd from manifest.json: leave "
              "options->shared_ptd NULL");
    return nullptr;
  }
  try {
    lora_share::init_platform_for_library();
    return finish_open(AdapterPool::open_dir(dir, pool_options(options)), error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_open_dir: ") + e.what());
    return nullptr;
  }
}

void ls_close(ls_runtime* runtime) {
  if (runtime == nullptr) return;
  if (runtime->owner.load() == std::this_thread::get_id()) return;  // from a callback: refused
  delete runtime;
}

ls_adapter* ls_load_adapter(ls_runtime* runtime, const char* pte, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime"), nullptr;
  if (pte == nullptr) return missing(error, "pte"), nullptr;
  Guard guard(runtime);
  if (!guard.held()) return busy(error), nullptr;
  try {
    auto index = runtime->pool->add(pte);
    if (!index.ok()) {
      bool budget = index.status().message().rfind("the memory budget", 0) == 0;
      report(error, index.status(), budget ? LS_ERR_BUDGET : LS_ERR_LOAD, LS_ERR_LOAD);
      return nullptr;
    }
    auto adapter = runtime->pool->acquire(index.value());
    if (!adapter.ok()) {
      report(error, adapter.status(), LS_ERR_LOAD, LS_ERR_LOAD);
      return nullptr;
    }
    clear_error(error);
    return handle_for(runtime, index.value());
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_load_adapter: ") + e.what());
    return nullptr;
  }
}

ls_adapter* ls_adapter_by_name(ls_runtime* runtime, const char* name, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime"), nullptr;
  if (name == nullptr) return missing(error, "name"), nullptr;
  Guard guard(runtime);
  if (!guard.held()) return busy(error), nullptr;
  try {
    int64_t index = runtime->pool->find(name);
    if (index < 0) {
      std::string known;
      for (size_t i = 0; i < runtime->pool->size(); ++i)
        known += (known.empty() ? "" : ", ") + runtime->pool->name(i);
      set_error(error, LS_ERR_NOT_FOUND,
                std::string("no adapter named '") + name + "' (known: " +
                    (known.empty() ? "none" : known) +
                    (std::strcmp(name, lora_share::kBaseName) == 0
                         ? "; 'base', the foundation alone, has no handle: pass a NULL adapter to "
                           "ls_generate)"
                         : ")"));
      return nullptr;
    }
    clear_error(error);
    return handle_for(runtime, static_cast<size_t>(index));
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_NOT_FOUND, std::string("ls_adapter_by_name: ") + e.what());
    return nullptr;
  }
}

const char* ls_adapter_name(const ls_adapter* adapter) {
  return adapter ? adapter->name.c_str() : "";
}

int ls_adapter_resident(const ls_adapter* adapter) {
  if (adapter == nullptr) return 0;
  Guard guard(adapter->runtime);
  return adapter->runtime->pool->resident(adapter->index) ? 1 : 0;
}

ls_status ls_generate(ls_runtime* runtime, ls_adapter* adapter, const int64_t* prompt,
                      size_t n, const ls_generate_options* options,
                      ls_token_callback on_token, void* user_data, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (adapter != nullptr && adapter->runtime != runtime) {
    set_error(error, LS_ERR_ARGUMENT,
              "adapter '" + adapter->name + "' belongs to another runtime");
    return LS_ERR_ARGUMENT;
  }
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    size_t index = adapter != nullptr ? adapter->index : AdapterPool::kBase;
    return generate_index(runtime, index, prompt, n, options, on_token, user_data, error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_generate: ") + e.what());
    return LS_ERR_RUN;
  }
}

ls_status ls_generate_named(ls_runtime* runtime, const char* name, const int64_t* prompt,
                            size_t n, const ls_generate_options* options,
                            ls_token_callback on_token, void* user_data, ls_error* error) {
  if (name != nullptr && std::strcmp(name, lora_share::kBaseName) == 0)
    return ls_generate(runtime, nullptr, prompt, n, options, on_token, user_data, error);
  ls_adapter* adapter = ls_adapter_by_name(runtime, name, error);
  if (adapter == nullptr) return error ? error->code : LS_ERR_NOT_FOUND;
  return ls_generate(runtime, adapter, prompt, n, options, on_token, user_data, error);
}

ls_status ls_check_request(ls_runtime* runtime, const char* name, const int64_t* prompt,
                           size_t n, int64_t max_new_tokens, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (name == nullptr) return missing(error, "name");
  bool base = std::strcmp(name, lora_share::kBaseName) == 0;
  ls_adapter* adapter = base ? nullptr : ls_adapter_by_name(runtime, name, error);
  if (!base && adapter == nullptr) return error ? error->code : LS_ERR_NOT_FOUND;
  if (prompt == nullptr && n > 0) return missing(error, "prompt");
  if (n == 0) {
    set_error(error, LS_ERR_REQUEST, "the prompt is empty: give at least one token id");
    return LS_ERR_REQUEST;
  }
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    Status s = runtime->pool->check(base ? AdapterPool::kBase : adapter->index,
                                    std::vector<int64_t>(prompt, prompt + n), max_new_tokens);
    if (!s.ok()) return report(error, s, LS_ERR_REQUEST, LS_ERR_REQUEST);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_check_request: ") + e.what());
    return LS_ERR_RUN;
  }
  clear_error(error);
  return LS_OK;
}

ls_status ls_stats(ls_runtime* runtime, ls_runtime_stats* stats, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (stats == nullptr) return missing(error, "stats");
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  lora_share::PoolStats s = runtime->pool->stats();
  stats->adapters_known = s.known;
  stats->adapters_resident = s.resident;
  stats->loads = s.loads;
  stats->evictions = s.evictions;
  stats->hits = s.hits;
  stats->last_load_ms = s.last_load_ms;
  stats->total_load_ms = s.total_load_ms;
  stats->budget_bytes = s.budget_bytes;
  stats->foundation_bytes = s.foundation_bytes;
  stats->program_bytes = s.program_bytes;
  stats->arena_bytes = s.arena_bytes;
  stats->resident_adapter_bytes = s.resident_adapter_bytes;
  stats->largest_adapter_bytes = s.largest_adapter_bytes;
  int64_t pss_kb = lora_share::read_memory_stats().pss_kb;
  stats->process_pss_bytes = pss_kb < 0 ? -1 : pss_kb * 1024;
  clear_error(error);
  return LS_OK;
}

}  // extern "C"
