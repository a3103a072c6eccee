#include "api_support.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "file_check.h"

namespace lora_share::capi {
namespace {

// The checks the runner and the library share name the runner's flags; an
// application knows the library's parameters instead.
std::string library_wording(std::string text) {
  static const std::pair<const char*, const char*> kRenames[] = {
      {"; --no-verify skips this check", "; ls_options.verify = 0 skips this check"},
      {"--no-packed-cache", "ls_options.packed_cache = 0"},
      {"--packed-cache ", "packed_cache_dir "},
      {"--max-new-tokens", "max_new_tokens"},
      {"--shared-ptd", "shared_ptd"},
      {"--ptd ", "ptd "},
      {"--pte ", "adapter "},
      {"pass --tokens ids", "give the prompt as token ids"},
  };
  for (const auto& [from, to] : kRenames) {
    const std::string f(from), t(to);
    for (size_t at = text.find(f); at != std::string::npos; at = text.find(f, at + t.size()))
      text.replace(at, f.size(), t);
  }
  return text;
}

// Per thread, as the calls that set it may run on several at once.
thread_local std::string g_last_message;

}  // namespace

const std::string& last_message() { return g_last_message; }

void set_error(ls_error* error, ls_status code, const std::string& message, bool runner_messages) {
  g_last_message = printable(runner_messages ? message : library_wording(message));
  if (error == nullptr) return;
  error->code = code;
  const std::string& line = g_last_message;
  size_t n = std::min(line.size(), sizeof(error->message) - 1);
  std::memcpy(error->message, line.data(), n);
  error->message[n] = '\0';
}

void clear_error(ls_error* error) {
  if (error == nullptr) return;
  error->code = LS_OK;
  error->message[0] = '\0';
}

ls_status report(ls_error* error, const Status& status, ls_status usage_code, ls_status failure_code,
                 bool runner_messages) {
  ls_status code = status.code() == ExitCode::kUsageError ? usage_code : failure_code;
  set_error(error, code, status.message(), runner_messages);
  return code;
}

bool is_budget_error(const Status& status) {
  return status.code() == ExitCode::kUsageError && status.message().rfind("the memory budget", 0) == 0;
}

ls_status missing(ls_error* error, const char* what) {
  set_error(error, LS_ERR_ARGUMENT, std::string(what) + " is NULL");
  return LS_ERR_ARGUMENT;
}

std::string unknown_adapter_message(ls_runtime* rt, const std::string& name) {
  std::string known;
  for (size_t i = 0; i < rt->pool->size(); ++i)
    if (!rt->pool->removed(i)) known += (known.empty() ? "" : ", ") + rt->pool->name(i);
  return "no adapter named '" + name + "' (known: " + (known.empty() ? "none" : known) +
         (name == lora_share::kBaseName
              ? "; 'base', the foundation alone, has no handle: pass a NULL adapter to ls_generate)"
              : ")");
}

ls_status check_owner(ls_runtime* runtime, const ls_adapter* adapter, ls_error* error) {
  if (adapter == nullptr || adapter->runtime == runtime) return LS_OK;
  set_error(error, LS_ERR_ARGUMENT, "adapter '" + adapter->name + "' belongs to another runtime");
  return LS_ERR_ARGUMENT;
}

namespace {

// The runtime whose lock this thread gave up while it waits in the batch (Unguard).
thread_local const ls_runtime* t_waiting_in = nullptr;

void take_lock(ls_runtime* rt) {
  rt->lock_waiters.fetch_add(1);
  rt->lock.lock();
  rt->lock_waiters.fetch_sub(1);
  rt->owner.store(std::this_thread::get_id());
}

}  // namespace

bool inside(const ls_runtime* rt) { return rt->owner.load() == std::this_thread::get_id() || t_waiting_in == rt; }

Guard::Guard(ls_runtime* rt) : rt_(rt) {
  if (inside(rt_)) return;
  take_lock(rt_);
  held_ = true;
}

Unguard::Unguard(ls_runtime* rt) : rt_(rt), outer_(t_waiting_in) {
  t_waiting_in = rt_;
  rt_->owner.store(std::thread::id());
  rt_->lock.unlock();
}

Unguard::~Unguard() {
  take_lock(rt_);
  t_waiting_in = outer_;
}

Guard::~Guard() {
  if (!held_) return;
  rt_->owner.store(std::thread::id());
  rt_->lock.unlock();
}

ls_status busy(ls_error* error) {
  set_error(error, LS_ERR_BUSY,
            "called from inside this runtime's on_token callback: return from the "
            "callback first (another thread may call the runtime meanwhile)");
  return LS_ERR_BUSY;
}

ls_adapter* handle_for(ls_runtime* rt, size_t index) {
  if (rt->pool->is_mix(index)) {
    auto& handle = rt->mix_handles[index];
    if (!handle) handle.reset(new ls_adapter{rt, index, rt->pool->name(index), rt->pool->pte(index)});
    return handle.get();
  }
  while (rt->handles.size() <= index) rt->handles.emplace_back();
  if (!rt->handles[index])
    rt->handles[index].reset(new ls_adapter{rt, index, rt->pool->name(index), rt->pool->pte(index)});
  return rt->handles[index].get();
}

PoolOptions pool_options(const ls_options* options) {
  ls_options defaults;
  ls_options_init(&defaults);
  const ls_options& o = options ? *options : defaults;
  PoolOptions p;
  p.shared_ptd = o.shared_ptd ? o.shared_ptd : "";
  p.verify = o.verify != 0;
  p.budget_bytes = o.budget_bytes;
  if (o.adapter_overhead_bytes != 0) p.adapter_overhead_bytes = o.adapter_overhead_bytes;
  p.parallel = static_cast<size_t>(o.parallel);
  p.packed_cache = o.packed_cache != 0;
  p.packed_cache_dir = o.packed_cache_dir ? o.packed_cache_dir : "";
  p.speculation = o.speculation != LS_SPECULATION_OFF;
  p.every_draft = o.speculation == LS_SPECULATION_EVERY_DRAFT;
  return p;
}

ls_status check_options(const ls_options* options, ls_error* error) {
  if (options == nullptr) return LS_OK;
  if (options->parallel < 1 || options->parallel > LS_MAX_PARALLEL) {
    set_error(error, LS_ERR_ARGUMENT,
              "ls_options.parallel is " + std::to_string(options->parallel) + ": give 1 to " +
                  std::to_string(LS_MAX_PARALLEL) + " KV slots (ls_options_init sets 1)");
    return LS_ERR_ARGUMENT;
  }
  if (options->speculation < LS_SPECULATION_OFF || options->speculation > LS_SPECULATION_EVERY_DRAFT) {
    set_error(error, LS_ERR_ARGUMENT,
              "ls_options.speculation is " + std::to_string(options->speculation) +
                  ": give LS_SPECULATION_OFF (0), LS_SPECULATION_ON (1, ls_options_init's) or "
                  "LS_SPECULATION_EVERY_DRAFT (2)");
    return LS_ERR_ARGUMENT;
  }
  return LS_OK;
}

ls_runtime* finish_open(StatusOr<std::unique_ptr<AdapterPool>> pool, ls_status usage_code, bool runner_messages,
                        ls_error* error) {
  if (!pool.ok()) {
    report(error, pool.status(), is_budget_error(pool.status()) ? LS_ERR_BUDGET : usage_code, LS_ERR_LOAD,
           runner_messages);
    return nullptr;
  }
  auto* rt = new ls_runtime();
  rt->pool = std::move(pool.value());
  rt->runner_messages = runner_messages;
  // One slot with speculation runs its requests through the scheduler too, one at a time: its drafts are
  // verified in decode_batch (docs/batching.md, "One slot"); without, the one-row path under the lock.
  if (rt->pool->parallel() > 1 || (rt->pool->speculation() && !rt->pool->stock()))
    rt->scheduler = std::make_unique<Scheduler>(*rt->pool, rt->lock, rt->lock_waiters, rt->pool->parallel(),
                                                rt->pool->speculation(), rt->pool->every_draft());
  clear_error(error);
  return rt;
}

namespace {

// generate_index's request in the runtime's batch: checked and its adapter
// pinned under the lock (as AdapterPool::generate does), then run with the
// lock released, so that the scheduler and the other callers go on.
StatusOr<Generation> run_in_batch(ls_runtime* rt, size_t index, std::vector<int64_t> prompt, int64_t max_new_tokens,
                                  const Picking& picking, const std::vector<int64_t>& stop_ids,
                                  const ls_generate_options& o, const GenerateExtras& extras,
                                  const TokenCallback& callback) {
  Status s = rt->pool->check(index, prompt, max_new_tokens, extras.prompt_label);
  if (!s.ok()) return s;
  s = rt->pool->pin(index);
  if (!s.ok()) return s;
  BatchRequest request;
  request.adapter = index;
  request.prompt = std::move(prompt);
  request.max_new_tokens = max_new_tokens;
  request.picking = picking;
  request.stop_ids = stop_ids;
  request.keep_logits = extras.keep_logits;
  request.cache_prompt = o.cache_prompt != 0;
  request.speculative = o.speculative != 0;
  if (o.prediction != nullptr) request.prediction.assign(o.prediction, o.prediction + o.n_prediction);
  StatusOr<Generation> g = Status::failure("not run");
  {
    Unguard waiting(rt);
    g = rt->scheduler->run(std::move(request), callback);
    rt->pool->unpin(index);
  }
  return g;
}

// The caller's callbacks as one: on_token_info (with the token's choice,
// logprob and top ids) and then on_token; either returning nonzero stops
// the token's choice.
TokenCallback caller_callback(const ls_generate_options& o, ls_token_callback on_token, void* user_data) {
  if (on_token == nullptr && o.on_token_info == nullptr) return nullptr;
  return [&o, on_token, user_data](const TokenInfo& t) {
    bool go = true;
    if (o.on_token_info != nullptr) {
      std::vector<int64_t> ids;
      std::vector<float> logprobs;
      for (const auto& [id, logprob] : t.top) ids.push_back(id), logprobs.push_back(logprob);
      ls_token_info info{t.token,
                         static_cast<int32_t>(t.choice),
                         t.logprob ? *t.logprob : std::nanf(""),
                         static_cast<int32_t>(ids.size()),
                         ids.data(),
                         logprobs.data()};
      go = o.on_token_info(&info, o.token_info_user_data) == 0;
    }
    if (on_token != nullptr) go = on_token(t.token, user_data) == 0 && go;
    return go;
  };
}

}  // namespace

ls_status generate_index(ls_runtime* rt, size_t index, const int64_t* prompt, size_t n,
                         const ls_generate_options* options, ls_token_callback on_token, void* user_data,
                         const GenerateExtras& extras, ls_error* error) {
  if (prompt == nullptr && n > 0) return missing(error, "prompt");
  if (n == 0) {
    set_error(error, LS_ERR_REQUEST, "the prompt is empty: give at least one token id");
    return LS_ERR_REQUEST;
  }
  ls_generate_options defaults;
  ls_generate_options_init(&defaults);
  const ls_generate_options& o = options ? *options : defaults;
  if (o.n > 1 && on_token != nullptr) {
    set_error(error, LS_ERR_ARGUMENT,
              "n > 1 with on_token: on_token cannot tell the choices apart; give on_token_info (each token "
              "with its choice) and a NULL on_token");
    return LS_ERR_ARGUMENT;
  }
  static const std::vector<int64_t> kNone;
  const std::vector<int64_t>& stop_ids = extras.stop_ids     ? *extras.stop_ids
                                         : o.ignore_eos != 0 ? kNone
                                                             : rt->pool->eos_ids();
  Picking picking;
  ls_status status = read_picking(rt, index, o, stop_ids, &picking, error);
  if (status != LS_OK) return status;
  TokenCallback callback = caller_callback(o, on_token, user_data);
  std::vector<int64_t> ids(prompt, prompt + n);
  auto g = rt->scheduler
               ? run_in_batch(rt, index, std::move(ids), o.max_new_tokens, picking, stop_ids, o, extras, callback)
               : rt->pool->generate(index, ids, o.max_new_tokens, picking, stop_ids, extras.keep_logits, callback,
                                    extras.prompt_label);
  if (!g.ok()) {
    // Usage errors come from the request's check; failures from loading or running.
    bool loading = !rt->pool->resident(index);
    if (is_budget_error(g.status()))
      return report(error, g.status(), LS_ERR_BUDGET, LS_ERR_BUDGET, rt->runner_messages);
    return report(error, g.status(), LS_ERR_REQUEST, loading ? LS_ERR_LOAD : LS_ERR_RUN, rt->runner_messages);
  }
  if (o.drafted != nullptr) *o.drafted = g->drafted;
  if (o.accepted != nullptr) *o.accepted = g->accepted;
  if (extras.result) *extras.result = std::move(g.value());
  clear_error(error);
  return LS_OK;
}

}  // namespace lora_share::capi
