// The diagnostic C API (include/lora_share_diag.h): build/runner's loading
// variants, load figures and per-request timings over the same AdapterPool
// and helpers (api_support.h) as lora_share.h.
#include "lora_share_diag.h"

#include <algorithm>
#include <string>
#include <vector>

#include "api_support.h"
#include "attend_kernel.h"
#include "batch_script.h"
#include "et_platform.h"
#include "memory_stats.h"
#include "xnnpack_reshape.h"

using lora_share::AdapterPool;
using namespace lora_share::capi;

extern "C" {

void ls_diag_options_init(ls_diag_options* options) {
  if (options == nullptr) return;
  options->stock = 0;
  options->private_arenas = 0;
  options->weight_cache = 1;
  options->huge_pages = 1;
  options->ignore_eos = 0;
  options->runner_messages = 0;
  options->threads = 0;
  options->tokenizer_dir = nullptr;
  options->bind_tokenizer = 0;
}

size_t ls_diag_sizeof(const char* type_name) {
  if (type_name == nullptr) return 0;
  const std::string name(type_name);
  if (name == "ls_options") return sizeof(ls_options);
  if (name == "ls_generate_options") return sizeof(ls_generate_options);
  if (name == "ls_token_info") return sizeof(ls_token_info);
  if (name == "ls_runtime_stats") return sizeof(ls_runtime_stats);
  if (name == "ls_error") return sizeof(ls_error);
  return 0;
}

const char* ls_diag_last_message(void) { return last_message().c_str(); }

void ls_diag_init_process(int verbose) { lora_share::init_platform(verbose != 0); }

ls_runtime* ls_diag_open(const char* ptd, const char* const* ptes, size_t n_ptes, const ls_options* options,
                         const ls_diag_options* diag, ls_error* error) {
  if (ptes == nullptr && n_ptes > 0) return missing(error, "ptes"), nullptr;
  if (check_options(options, error) != LS_OK) return nullptr;
  ls_diag_options diag_defaults;
  ls_diag_options_init(&diag_defaults);
  const ls_diag_options& d = diag ? *diag : diag_defaults;
  if (d.stock && options != nullptr && options->budget_bytes != 0) {
    set_error(error, LS_ERR_ARGUMENT, "stock loading keeps every adapter loaded: leave budget_bytes 0");
    return nullptr;
  }
  try {
    lora_share::init_platform_for_library();
    lora_share::PoolOptions p = pool_options(options);
    p.ptd = ptd ? ptd : "";
    p.stock = d.stock != 0;
    p.private_arenas = d.private_arenas != 0;
    p.weight_cache = d.weight_cache != 0;
    p.huge_pages = d.huge_pages != 0;
    p.read_eos = d.ignore_eos == 0;
    p.threads = d.threads;
    p.tokenizer_dir = d.tokenizer_dir ? d.tokenizer_dir : "";
    p.check_tokenizer = d.bind_tokenizer != 0;
    std::vector<std::string> files;
    for (size_t i = 0; i < n_ptes; ++i) {
      if (ptes[i] == nullptr) return missing(error, "ptes[i]"), nullptr;
      files.emplace_back(ptes[i]);
    }
    bool wording = d.runner_messages != 0;
    ls_runtime* rt = finish_open(AdapterPool::open_files(files, p), LS_ERR_ARGUMENT, wording, error);
    if (rt == nullptr) return nullptr;
    if (d.bind_tokenizer) {
      ls_status code = LS_OK;
      {
        Guard guard(rt);
        ls_tokenizer* bound = nullptr;
        code = runtime_tokenizer(rt, &bound, error, LS_ERR_ARGUMENT);
      }
      if (code != LS_OK && code != LS_ERR_NOT_FOUND) {
        ls_close(rt);
        return nullptr;
      }
    }
    lora_share::Status s = rt->pool->load_all();
    if (!s.ok()) {
      report(error, s, LS_ERR_ARGUMENT, LS_ERR_LOAD, wording);
      ls_close(rt);
      return nullptr;
    }
    return rt;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_diag_open: ") + e.what());
    return nullptr;
  }
}

ls_status ls_diag_loading_info(ls_runtime* runtime, ls_diag_loading* info, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (info == nullptr) return missing(error, "info");
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  lora_share::LoadingInfo l = runtime->pool->loading();
  info->mode = l.mode;
  info->arena = l.arena;
  info->weight_cache = l.xnnpack.weight_cache ? 1 : 0;
  info->workspace_sharing_mode = l.xnnpack.workspace_sharing_mode;
  info->packed_cache_warm = l.packed_cache_warm ? 1 : 0;
  runtime->packed_cache = l.packed_cache;
  info->packed_cache = runtime->packed_cache.c_str();
  info->planned_bytes = l.planned_bytes;
  info->threads = l.xnnpack.threads;
  clear_error(error);
  return LS_OK;
}

ls_status ls_diag_adapter_info(ls_runtime* runtime, const ls_adapter* adapter, ls_diag_adapter* info, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (info == nullptr) return missing(error, "info");
  if (check_owner(runtime, adapter, error) != LS_OK) return LS_ERR_ARGUMENT;
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    auto i = runtime->pool->info(adapter ? adapter->index : AdapterPool::kBase);
    if (!i.ok()) return report(error, i.status(), LS_ERR_REQUEST, LS_ERR_LOAD, runtime->runner_messages);
    // The strings live as long as the runtime: on the handle, or the runtime for 'base'.
    if (adapter == nullptr) runtime->base_pte = i->pte;
    info->name = adapter ? adapter->name.c_str() : LS_BASE_NAME;
    info->pte = adapter ? adapter->pte.c_str() : runtime->base_pte.c_str();
    info->vocab_size = i->vocab_size;
    info->max_seq_len = i->max_seq_len;
    info->prefill_chunk = i->prefill_chunk;
    info->load_ms = i->load_ms;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_diag_adapter_info: ") + e.what());
    return LS_ERR_RUN;
  }
  clear_error(error);
  return LS_OK;
}

void ls_diag_memory_stats(ls_diag_memory* stats) {
  if (stats == nullptr) return;
  lora_share::MemoryStats m = lora_share::read_memory_stats();
  stats->rss_kb = m.rss_kb;
  stats->pss_kb = m.pss_kb;
  stats->anon_kb = m.anon_kb;
  stats->file_kb = m.file_kb;
  stats->shmem_kb = m.shmem_kb;
  stats->peak_rss_kb = m.peak_rss_kb;
  stats->huge_kb = m.huge_kb;
}

const char* ls_diag_attend_isa(void) { return lora_share::attend_isa(); }

void ls_diag_xnnpack_reshapes(ls_diag_reshapes* counts) {
  if (counts == nullptr) return;
  const lora_share::ReshapeCounts c = lora_share::reshape_counts();
  counts->run = c.run;
  counts->skipped = c.skipped;
}

ls_status ls_diag_slot_variants(ls_runtime* runtime, ls_diag_variants* variants, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (variants == nullptr) return missing(error, "variants");
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  lora_share::VariantStats v = runtime->pool->variant_stats();
  variants->made = v.made;
  variants->refused = v.refused;
  variants->failed = v.failed;
  variants->resident = v.resident;
  clear_error(error);
  return LS_OK;
}

void ls_diag_generate_options_init(ls_diag_generate_options* options) {
  if (options == nullptr) return;
  options->logits = nullptr;
  options->stop_ids = nullptr;
  options->n_stop_ids = 0;
  options->stop_ids_given = 0;
  options->prompt_label = nullptr;
}

ls_status ls_diag_generate(ls_runtime* runtime, ls_adapter* adapter, const int64_t* prompt, size_t n,
                           const ls_generate_options* options, const ls_diag_generate_options* diag,
                           ls_token_callback on_token, void* user_data, ls_diag_generation* out, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (check_owner(runtime, adapter, error) != LS_OK) return LS_ERR_ARGUMENT;
  ls_diag_generate_options defaults;
  ls_diag_generate_options_init(&defaults);
  const ls_diag_generate_options& d = diag ? *diag : defaults;
  if (d.stop_ids_given && d.stop_ids == nullptr && d.n_stop_ids > 0) return missing(error, "stop_ids");
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    std::vector<int64_t> stop_ids;
    if (d.stop_ids_given) stop_ids.assign(d.stop_ids, d.stop_ids + d.n_stop_ids);
    lora_share::Generation g;
    GenerateExtras extras;
    extras.stop_ids = d.stop_ids_given ? &stop_ids : nullptr;
    extras.keep_logits = d.logits != nullptr;
    if (d.prompt_label) extras.prompt_label = d.prompt_label;
    extras.result = &g;
    size_t index = adapter != nullptr ? adapter->index : AdapterPool::kBase;
    ls_status status = generate_index(runtime, index, prompt, n, options, on_token, user_data, extras, error);
    if (status != LS_OK) return status;
    // Rows are at most max_new_tokens x vocab: the room the caller gave.
    if (d.logits) std::copy(g.logits.begin(), g.logits.end(), d.logits);
    if (out) {
      out->tokens = g.tokens.size();
      out->logits_rows = g.rows;
      out->prefill_ms = g.prefill_ms;
      out->decode_ms = g.decode_ms;
      out->prefill_tokens_per_s = g.prefill_tokens_per_s.value_or(-1.0);
      out->decode_tokens_per_s = g.decode_tokens_per_s.value_or(-1.0);
    }
    return LS_OK;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_diag_generate: ") + e.what());
    return LS_ERR_RUN;
  }
}

ls_status ls_diag_batch_script(ls_runtime* runtime, ls_diag_batch_request* requests, size_t n, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (requests == nullptr && n > 0) return missing(error, "requests");
  std::vector<lora_share::ScriptRequest> script(n);
  for (size_t i = 0; i < n; ++i) {
    const ls_diag_batch_request& r = requests[i];
    if (r.prompt == nullptr && r.n_prompt > 0) return missing(error, "requests[i].prompt");
    if (r.prediction == nullptr && r.n_prediction > 0) return missing(error, "requests[i].prediction");
    if (r.tokens == nullptr) return missing(error, "requests[i].tokens");
    if (check_owner(runtime, r.adapter, error) != LS_OK) return LS_ERR_ARGUMENT;
    script[i].index = r.adapter ? r.adapter->index : AdapterPool::kBase;
    script[i].prompt.assign(r.prompt, r.prompt + r.n_prompt);
    script[i].slot = r.slot;
    script[i].max_new_tokens = r.max_new_tokens;
    script[i].joins = r.joins;
    if (r.prediction != nullptr) script[i].prediction.assign(r.prediction, r.prediction + r.n_prediction);
    script[i].max_drafts = r.max_drafts;
  }
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    lora_share::Status s = lora_share::run_batch_script(*runtime->pool, &script);
    if (!s.ok()) return report(error, s, LS_ERR_ARGUMENT, LS_ERR_RUN, runtime->runner_messages);
    for (size_t i = 0; i < n; ++i) {
      std::copy(script[i].tokens.begin(), script[i].tokens.end(), requests[i].tokens);
      if (requests[i].logits) std::copy(script[i].logits.begin(), script[i].logits.end(), requests[i].logits);
      const auto& sizes = script[i].batch_sizes;
      requests[i].max_batch = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
      requests[i].drafted = script[i].drafted;
      requests[i].accepted = script[i].accepted;
      requests[i].steps = static_cast<int64_t>(sizes.size());
    }
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_diag_batch_script: ") + e.what());
    return LS_ERR_RUN;
  }
  clear_error(error);
  return LS_OK;
}

ls_status ls_diag_time_steps(ls_runtime* runtime, ls_adapter* adapter, const int64_t* prompt, size_t n_prompt,
                             size_t rows, size_t tokens, size_t steps, double* ms, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (prompt == nullptr) return missing(error, "prompt");
  if (ms == nullptr && steps > 0) return missing(error, "ms");
  if (tokens < 1) {
    set_error(error, LS_ERR_ARGUMENT, "ls_diag_time_steps: a row carries at least one token");
    return LS_ERR_ARGUMENT;
  }
  if (check_owner(runtime, adapter, error) != LS_OK) return LS_ERR_ARGUMENT;
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    std::vector<double> times;
    lora_share::Status s =
        lora_share::time_steps(*runtime->pool, adapter ? adapter->index : AdapterPool::kBase,
                               std::vector<int64_t>(prompt, prompt + n_prompt), rows, tokens, steps, &times);
    if (!s.ok()) return report(error, s, LS_ERR_ARGUMENT, LS_ERR_RUN, runtime->runner_messages);
    std::copy(times.begin(), times.end(), ms);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_diag_time_steps: ") + e.what());
    return LS_ERR_RUN;
  }
  clear_error(error);
  return LS_OK;
}

}  // extern "C"
