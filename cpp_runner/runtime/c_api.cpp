// The C API (include/lora_share.h) over AdapterPool: argument checks, the
// runtime's lock, and Status -> ls_status + message. No C++ exception leaves
// this file: every entry point catches what the standard library may throw
// (bad_alloc) and reports it as an error.
#include "lora_share.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "api_support.h"
#include "et_platform.h"
#include "memory_stats.h"

using lora_share::AdapterPool;
using lora_share::Status;
using namespace lora_share::capi;

extern "C" {

void ls_options_init(ls_options* options) {
  if (options == nullptr) return;
  options->shared_ptd = nullptr;
  options->verify = 1;
  options->budget_bytes = 0;
  options->adapter_overhead_bytes = 0;
  options->parallel = 1;
  options->packed_cache = 1;
  options->packed_cache_dir = nullptr;
  options->speculation = 1;
}

void ls_generate_options_init(ls_generate_options* options) {
  if (options == nullptr) return;
  options->max_new_tokens = 16;
  options->temperature = 0.0;
  options->seed = 0;
  options->ignore_eos = 0;
  options->top_k = 0;
  options->top_p = 1.0;
  options->min_p = 0.0;
  options->repeat_penalty = 1.0;
  options->presence_penalty = 0.0;
  options->frequency_penalty = 0.0;
  options->cache_prompt = 1;
  options->constraint = LS_CONSTRAINT_NONE;
  options->constraint_text = nullptr;
  options->choices = nullptr;
  options->n_choices = 0;
  options->logit_bias_ids = nullptr;
  options->logit_bias_values = nullptr;
  options->n_logit_bias = 0;
  options->logprobs = 0;
  options->top_logprobs = 0;
  options->n = 1;
  options->on_token_info = nullptr;
  options->token_info_user_data = nullptr;
  options->speculative = 1;
  options->prediction = nullptr;
  options->n_prediction = 0;
  options->drafted = nullptr;
  options->accepted = nullptr;
}

const char* ls_status_name(ls_status code) {
  switch (code) {
    case LS_OK:
      return "LS_OK";
    case LS_ERR_ARGUMENT:
      return "LS_ERR_ARGUMENT";
    case LS_ERR_NOT_FOUND:
      return "LS_ERR_NOT_FOUND";
    case LS_ERR_LOAD:
      return "LS_ERR_LOAD";
    case LS_ERR_REQUEST:
      return "LS_ERR_REQUEST";
    case LS_ERR_RUN:
      return "LS_ERR_RUN";
    case LS_ERR_BUDGET:
      return "LS_ERR_BUDGET";
    case LS_ERR_BUSY:
      return "LS_ERR_BUSY";
  }
  return "unknown";
}

ls_runtime* ls_open(const char* ptd, const ls_options* options, ls_error* error) {
  if (ptd == nullptr) return missing(error, "ptd"), nullptr;
  if (check_options(options, error) != LS_OK) return nullptr;
  try {
    lora_share::init_platform_for_library();
    lora_share::PoolOptions p = pool_options(options);
    p.ptd = ptd;
    return finish_open(AdapterPool::open(p), LS_ERR_LOAD, /*runner_messages=*/false, error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_open: ") + e.what());
    return nullptr;
  }
}

ls_runtime* ls_open_dir(const char* dir, const ls_options* options, ls_error* error) {
  if (dir == nullptr) return missing(error, "dir"), nullptr;
  if (check_options(options, error) != LS_OK) return nullptr;
  if (options != nullptr && options->shared_ptd != nullptr) {
    set_error(error, LS_ERR_ARGUMENT,
              "ls_open_dir reads adapters_shared.ptd from manifest.json: leave "
              "options->shared_ptd NULL");
    return nullptr;
  }
  try {
    lora_share::init_platform_for_library();
    return finish_open(AdapterPool::open_dir(dir, pool_options(options)), LS_ERR_LOAD,
                       /*runner_messages=*/false, error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_open_dir: ") + e.what());
    return nullptr;
  }
}

void ls_close(ls_runtime* runtime) {
  if (runtime == nullptr) return;
  if (inside(runtime)) return;  // from a callback: refused
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
      report(error, index.status(), is_budget_error(index.status()) ? LS_ERR_BUDGET : LS_ERR_LOAD, LS_ERR_LOAD,
             runtime->runner_messages);
      return nullptr;
    }
    auto adapter = runtime->pool->acquire(index.value());
    // The budget's room is held by adapters of running requests: registered
    // (and checked), it loads at its first request, which waits for room.
    if (!adapter.ok() && is_budget_error(adapter.status()))
      return clear_error(error), handle_for(runtime, index.value());
    if (!adapter.ok()) {
      report(error, adapter.status(), LS_ERR_LOAD, LS_ERR_LOAD, runtime->runner_messages);
      return nullptr;
    }
    clear_error(error);
    return handle_for(runtime, index.value());
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_load_adapter: ") + e.what());
    return nullptr;
  }
}

ls_status ls_remove_adapter(ls_runtime* runtime, const char* name, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (name == nullptr) return missing(error, "name");
  try {
    int64_t index = -1;
    {
      Guard guard(runtime);
      if (!guard.held()) return busy(error);
      index = runtime->pool->find(name);
      if (index < 0) {
        set_error(error, LS_ERR_NOT_FOUND, unknown_adapter_message(runtime, name));
        return LS_ERR_NOT_FOUND;
      }
      if (runtime->pool->is_mix(static_cast<size_t>(index))) {
        set_error(error, LS_ERR_ARGUMENT, "'" + std::string(name) + "' is a mix: release it with ls_adapter_release");
        return LS_ERR_ARGUMENT;
      }
      runtime->pool->retire(static_cast<size_t>(index));
    }
    // Without the runtime's lock: the requests pinning it must be able to finish.
    runtime->pool->wait_unpinned(static_cast<size_t>(index));
    Guard guard(runtime);
    if (!guard.held()) return busy(error);
    runtime->pool->drop(static_cast<size_t>(index));
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_remove_adapter: ") + e.what());
    return LS_ERR_RUN;
  }
  clear_error(error);
  return LS_OK;
}

ls_adapter* ls_adapter_by_name(ls_runtime* runtime, const char* name, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime"), nullptr;
  if (name == nullptr) return missing(error, "name"), nullptr;
  Guard guard(runtime);
  if (!guard.held()) return busy(error), nullptr;
  try {
    int64_t index = runtime->pool->find(name);
    if (index < 0) {
      set_error(error, LS_ERR_NOT_FOUND, unknown_adapter_message(runtime, name));
      return nullptr;
    }
    clear_error(error);
    return handle_for(runtime, static_cast<size_t>(index));
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_NOT_FOUND, std::string("ls_adapter_by_name: ") + e.what());
    return nullptr;
  }
}

ls_adapter* ls_adapter_at(ls_runtime* runtime, size_t index, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime"), nullptr;
  Guard guard(runtime);
  if (!guard.held()) return busy(error), nullptr;
  try {
    int64_t at = runtime->pool->live_at(index);
    if (at < 0) {
      set_error(error, LS_ERR_NOT_FOUND,
                "no adapter at index " + std::to_string(index) + " (the runtime knows " +
                    std::to_string(runtime->pool->stats().known) + ")");
      return nullptr;
    }
    clear_error(error);
    return handle_for(runtime, static_cast<size_t>(at));
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_NOT_FOUND, std::string("ls_adapter_at: ") + e.what());
    return nullptr;
  }
}

const char* ls_adapter_name(const ls_adapter* adapter) { return adapter ? adapter->name.c_str() : ""; }

int ls_adapter_resident(const ls_adapter* adapter) {
  if (adapter == nullptr) return 0;
  Guard guard(adapter->runtime);
  return adapter->runtime->pool->resident(adapter->index) ? 1 : 0;
}

ls_adapter* ls_adapter_mix(ls_runtime* runtime, const ls_lora_term* terms, size_t n, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime"), nullptr;
  if (n > 0 && terms == nullptr) return missing(error, "terms"), nullptr;
  if (n == 0) {
    set_error(error, LS_ERR_ARGUMENT, "a mix needs at least one term: n is 0");
    return nullptr;
  }
  Guard guard(runtime);
  if (!guard.held()) return busy(error), nullptr;
  try {
    std::vector<std::pair<size_t, double>> indices;
    for (size_t i = 0; i < n; ++i) {
      if (terms[i].name == nullptr) return missing(error, ("terms[" + std::to_string(i) + "].name").c_str()), nullptr;
      int64_t index = runtime->pool->find(terms[i].name);
      if (index < 0 || runtime->pool->is_mix(static_cast<size_t>(index))) {
        set_error(error, LS_ERR_NOT_FOUND,
                  "terms[" + std::to_string(i) + "]: " + unknown_adapter_message(runtime, terms[i].name));
        return nullptr;
      }
      indices.emplace_back(static_cast<size_t>(index), terms[i].scale);
    }
    auto index = runtime->pool->mix(indices);
    if (!index.ok()) {
      report(error, index.status(), is_budget_error(index.status()) ? LS_ERR_BUDGET : LS_ERR_REQUEST, LS_ERR_LOAD,
             runtime->runner_messages);
      return nullptr;
    }
    clear_error(error);
    return handle_for(runtime, index.value());
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_adapter_mix: ") + e.what());
    return nullptr;
  }
}

ls_status ls_adapter_release(ls_adapter* adapter, ls_error* error) {
  if (adapter == nullptr) return clear_error(error), LS_OK;
  ls_runtime* runtime = adapter->runtime;
  const size_t index = adapter->index;
  try {
    {
      Guard guard(runtime);
      if (!guard.held()) return busy(error);
      if (!runtime->pool->is_mix(index)) {
        set_error(error, LS_ERR_ARGUMENT,
                  "adapter '" + adapter->name + "' is no mix: adapters live until ls_close, only a mix is released");
        return LS_ERR_ARGUMENT;
      }
      auto last = runtime->pool->release_mix(index);
      if (!last.ok()) return report(error, last.status(), LS_ERR_ARGUMENT, LS_ERR_ARGUMENT, runtime->runner_messages);
      if (!last.value()) return clear_error(error), LS_OK;
    }
    // The last hold: as a removal, without the runtime's lock while requests on it finish.
    runtime->pool->wait_unpinned(index);
    Guard guard(runtime);
    if (!guard.held()) return busy(error);
    runtime->pool->drop_mix(index);
    runtime->mix_handles.erase(index);  // `adapter` is gone
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_adapter_release: ") + e.what());
    return LS_ERR_RUN;
  }
  clear_error(error);
  return LS_OK;
}

ls_status ls_generate(ls_runtime* runtime, ls_adapter* adapter, const int64_t* prompt, size_t n,
                      const ls_generate_options* options, ls_token_callback on_token, void* user_data,
                      ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (check_owner(runtime, adapter, error) != LS_OK) return LS_ERR_ARGUMENT;
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    size_t index = adapter != nullptr ? adapter->index : AdapterPool::kBase;
    if (runtime->pool->removed(index)) {
      set_error(error, LS_ERR_NOT_FOUND, "adapter '" + adapter->name + "' was removed (ls_remove_adapter)");
      return LS_ERR_NOT_FOUND;
    }
    return generate_index(runtime, index, prompt, n, options, on_token, user_data, GenerateExtras(), error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_generate: ") + e.what());
    return LS_ERR_RUN;
  }
}

ls_status ls_generate_named(ls_runtime* runtime, const char* name, const int64_t* prompt, size_t n,
                            const ls_generate_options* options, ls_token_callback on_token, void* user_data,
                            ls_error* error) {
  if (name != nullptr && std::strcmp(name, lora_share::kBaseName) == 0)
    return ls_generate(runtime, nullptr, prompt, n, options, on_token, user_data, error);
  ls_adapter* adapter = ls_adapter_by_name(runtime, name, error);
  if (adapter == nullptr) return error ? error->code : LS_ERR_NOT_FOUND;
  return ls_generate(runtime, adapter, prompt, n, options, on_token, user_data, error);
}

ls_status ls_check_request(ls_runtime* runtime, const char* name, const int64_t* prompt, size_t n,
                           int64_t max_new_tokens, ls_error* error) {
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
    if (!s.ok()) return report(error, s, LS_ERR_REQUEST, LS_ERR_REQUEST, runtime->runner_messages);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_check_request: ") + e.what());
    return LS_ERR_RUN;
  }
  clear_error(error);
  return LS_OK;
}

ls_status ls_check_options(ls_runtime* runtime, const char* name, const ls_generate_options* options, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (name == nullptr) return missing(error, "name");
  if (options == nullptr) return missing(error, "options");
  bool base = std::strcmp(name, lora_share::kBaseName) == 0;
  ls_adapter* adapter = base ? nullptr : ls_adapter_by_name(runtime, name, error);
  if (!base && adapter == nullptr) return error ? error->code : LS_ERR_NOT_FOUND;
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    static const std::vector<int64_t> kNone;
    const std::vector<int64_t>& stop_ids = options->ignore_eos != 0 ? kNone : runtime->pool->eos_ids();
    lora_share::Picking picking;
    ls_status status =
        read_picking(runtime, base ? AdapterPool::kBase : adapter->index, *options, stop_ids, &picking, error);
    if (status != LS_OK) return status;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_check_options: ") + e.what());
    return LS_ERR_RUN;
  }
  clear_error(error);
  return LS_OK;
}

ls_status ls_context_length(ls_runtime* runtime, const char* name, int64_t* max_seq_len, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (name == nullptr) return missing(error, "name");
  if (max_seq_len == nullptr) return missing(error, "max_seq_len");
  bool base = std::strcmp(name, lora_share::kBaseName) == 0;
  ls_adapter* adapter = base ? nullptr : ls_adapter_by_name(runtime, name, error);
  if (!base && adapter == nullptr) return error ? error->code : LS_ERR_NOT_FOUND;
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    auto info = runtime->pool->info(base ? AdapterPool::kBase : adapter->index);
    if (!info.ok()) return report(error, info.status(), LS_ERR_REQUEST, LS_ERR_LOAD, runtime->runner_messages);
    *max_seq_len = info->max_seq_len;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_context_length: ") + e.what());
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
  lora_share::SchedulerStats b;
  if (runtime->scheduler) b = runtime->scheduler->stats();
  stats->parallel = static_cast<uint32_t>(runtime->pool->parallel());
  stats->slots_in_use = static_cast<uint32_t>(b.slots_in_use);
  stats->prefix_hits = b.prefix_hits;
  stats->prefix_tokens = b.prefix_tokens;
  stats->batch_steps = b.batch_steps;
  std::fill(std::begin(stats->batch_size_counts), std::end(stats->batch_size_counts), uint64_t{0});
  std::copy(b.batch_size_counts.begin(), b.batch_size_counts.end(), stats->batch_size_counts);
  // The pool's figure before the scheduler has run (and with one slot): the same slot.
  stats->slot_bytes = b.slot_bytes != 0 ? b.slot_bytes : s.slot_bytes;
  stats->prompt_tokens_fed = s.prompt_fed + b.prompt_fed;
  lora_share::constraint::Stats none;
  const lora_share::constraint::Stats& c = runtime->constraints ? runtime->constraints->stats() : none;
  auto ms = [](const std::atomic<uint64_t>& ns) { return static_cast<double>(ns.load()) / 1e6; };
  stats->constraint_compiles = c.compiles;
  stats->constraint_compile_ms = ms(c.compile_ns);
  stats->constraint_cache_hits = c.cache_hits;
  stats->constraint_cache_hit_ms = ms(c.hit_ns);
  stats->masked_tokens = c.masked_tokens;
  stats->mask_ms = ms(c.mask_ns);
  stats->mask_wait_ms = ms(c.mask_wait_ns);
  stats->slots_cleared = b.slots_cleared;
  stats->drafted_tokens = b.drafted;
  stats->accepted_tokens = b.accepted;
  clear_error(error);
  return LS_OK;
}

}  // extern "C"

extern "C" {

ls_program* ls_load_program(ls_runtime* runtime, const char* pte, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime"), nullptr;
  if (pte == nullptr) return missing(error, "pte"), nullptr;
  Guard guard(runtime);
  if (!guard.held()) return busy(error), nullptr;
  try {
    const lora_share::AdapterPool& pool = *runtime->pool;
    auto program = lora_share::ForwardProgram::load(pte, pool.foundation(), pool.backend_options());
    if (!program.ok()) {
      report(error, program.status(), LS_ERR_LOAD, LS_ERR_LOAD, runtime->runner_messages);
      return nullptr;
    }
    runtime->programs.push_back(std::unique_ptr<ls_program>(new ls_program{runtime, std::move(program.value()), {}}));
    clear_error(error);
    return runtime->programs.back().get();
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_load_program: ") + e.what());
    return nullptr;
  }
}

ls_status ls_run_program(ls_program* program, const ls_tensor* inputs, size_t n_inputs, ls_tensor* outputs,
                         size_t max_outputs, size_t* n_outputs, ls_error* error) {
  if (program == nullptr) return missing(error, "program");
  if (n_inputs > 0 && inputs == nullptr) return missing(error, "inputs");
  if (outputs == nullptr) return missing(error, "outputs");
  if (n_outputs == nullptr) return missing(error, "n_outputs");
  Guard guard(program->runtime);
  if (!guard.held()) return busy(error);
  try {
    std::vector<lora_share::TensorView> in(n_inputs);
    for (size_t i = 0; i < n_inputs; ++i) {
      if (inputs[i].ndim < 0 || (inputs[i].ndim > 0 && inputs[i].sizes == nullptr)) {
        set_error(error, LS_ERR_ARGUMENT, "inputs[" + std::to_string(i) + "]: sizes is NULL or ndim < 0");
        return LS_ERR_ARGUMENT;
      }
      in[i].dtype = inputs[i].dtype;
      in[i].sizes.assign(inputs[i].sizes, inputs[i].sizes + inputs[i].ndim);
      in[i].data = inputs[i].data;
      in[i].nbytes = inputs[i].nbytes;
    }
    auto out = program->program->run(in);
    if (!out.ok()) return report(error, out.status(), LS_ERR_REQUEST, LS_ERR_RUN, program->runtime->runner_messages);
    if (out->size() > max_outputs) {
      set_error(
          error, LS_ERR_REQUEST,
          "forward returns " + std::to_string(out->size()) + " tensors; max_outputs is " + std::to_string(max_outputs));
      return LS_ERR_REQUEST;
    }
    program->output_sizes.clear();
    for (const lora_share::TensorView& v : out.value()) program->output_sizes.push_back(v.sizes);
    for (size_t i = 0; i < out->size(); ++i) {
      const lora_share::TensorView& v = out.value()[i];
      outputs[i] =
          ls_tensor{v.dtype, static_cast<int32_t>(v.sizes.size()), program->output_sizes[i].data(), v.data, v.nbytes};
    }
    *n_outputs = out->size();
    clear_error(error);
    return LS_OK;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_run_program: ") + e.what());
    return LS_ERR_RUN;
  }
}

}  // extern "C"
