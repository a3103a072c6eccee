// ls_generate_options as the runtime picks a request's tokens (token_picker.h):
// every field checked, with the field's name in the message, and the
// constraint compiled for the runtime's vocabulary (constraint/). No C++
// exception leaves this file's functions: their callers catch.
#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "api_support.h"
#include "row_constraint.h"
#include "vocabulary.h"

namespace lora_share::capi {
namespace {

constexpr int kMaxTopLogprobs = 20;  // OpenAI's bound

ls_status argument(ls_error* error, const std::string& message) {
  set_error(error, LS_ERR_ARGUMENT, message);
  return LS_ERR_ARGUMENT;
}

// The sampler's fields, as ls_generate always checked them.
ls_status read_sampling(const ls_generate_options& o, Sampling* sampling, ls_error* error) {
  const char* bad = !(o.temperature >= 0)             ? "temperature must be 0 (greedy) or more"
                    : o.top_k < 0                     ? "top_k must be 0 (off) or more"
                    : !(o.top_p >= 0 && o.top_p <= 1) ? "top_p must be in [0, 1]"
                    : !(o.min_p >= 0 && o.min_p <= 1) ? "min_p must be in [0, 1]"
                    : !(o.repeat_penalty > 0 && std::isfinite(o.repeat_penalty)) ? "repeat_penalty must be above 0"
                    : !(std::fabs(o.presence_penalty) <= 2)                      ? "presence_penalty must be in [-2, 2]"
                    : !(std::fabs(o.frequency_penalty) <= 2) ? "frequency_penalty must be in [-2, 2]"
                                                             : nullptr;
  if (bad != nullptr) return argument(error, bad);
  sampling->temperature = o.temperature;
  sampling->seed = o.seed;
  sampling->top_k = o.top_k;
  sampling->top_p = o.top_p;
  sampling->min_p = o.min_p;
  sampling->repeat_penalty = o.repeat_penalty;
  sampling->presence_penalty = o.presence_penalty;
  sampling->frequency_penalty = o.frequency_penalty;
  return LS_OK;
}

ls_status read_logit_bias(const ls_generate_options& o, int64_t vocab, Picking* picking, ls_error* error) {
  if (o.n_logit_bias == 0) return LS_OK;
  if (o.logit_bias_ids == nullptr || o.logit_bias_values == nullptr)
    return argument(error, "logit_bias_ids and logit_bias_values must not be NULL when n_logit_bias is " +
                               std::to_string(o.n_logit_bias));
  for (size_t i = 0; i < o.n_logit_bias; ++i) {
    const int64_t id = o.logit_bias_ids[i];
    const double bias = o.logit_bias_values[i];
    if (!(bias >= -100 && bias <= 100))
      return argument(error, "logit_bias_values[" + std::to_string(i) + "] must be in [-100, 100] (OpenAI's range)");
    if (id < 0 || id >= vocab) {
      set_error(error, LS_ERR_REQUEST,
                "logit_bias_ids[" + std::to_string(i) + "]: id " + std::to_string(id) +
                    " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
      return LS_ERR_REQUEST;
    }
    picking->logit_bias.emplace_back(id, static_cast<float>(bias));
  }
  return LS_OK;
}

// The runtime's constraint compiler, made with its first constraint (under the runtime's lock):
// the build's tokenizer's vocabulary over the program's ids, and the mask worker.
ls_status constraint_compiler(ls_runtime* rt, int64_t vocab, ls_error* error) {
  if (!rt->constraints) {
    ls_tokenizer* t = nullptr;
    if (runtime_tokenizer(rt, &t, error) != LS_OK) {
      set_error(error, LS_ERR_REQUEST, std::string("a constraint needs the build's tokenizer: ") + error_text(error));
      return LS_ERR_REQUEST;
    }
    tok::Vocabulary vocabulary;
    {
      std::lock_guard<std::mutex> lock(t->lock);
      vocabulary = t->bound.tokenizer.vocabulary();
    }
    auto info = constraint::make_tokenizer_info(vocabulary, vocab, rt->pool->eos_ids());
    if (!info.ok()) return report(error, info.status(), LS_ERR_REQUEST, LS_ERR_LOAD);
    // Its compile threads build a grammar's token masks: as many as there are cores, at most 8.
    int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
    rt->constraints = std::make_unique<constraint::Compiler>(info.value(), threads);
    rt->mask_worker = std::make_unique<constraint::MaskWorker>();
  }
  if (rt->constraints->vocab_size() != vocab) {
    set_error(error, LS_ERR_REQUEST,
              "this adapter's program has " + std::to_string(vocab) + " ids; the runtime's constraints were made for " +
                  std::to_string(rt->constraints->vocab_size()));
    return LS_ERR_REQUEST;
  }
  return LS_OK;
}

// The constraint fields as a Spec; LS_ERR_ARGUMENT for a kind out of range or text where none belongs.
ls_status read_spec(const ls_generate_options& o, constraint::Spec* spec, ls_error* error) {
  const bool wants_text = o.constraint == LS_CONSTRAINT_JSON_SCHEMA || o.constraint == LS_CONSTRAINT_GRAMMAR ||
                          o.constraint == LS_CONSTRAINT_REGEX;
  if (o.constraint < LS_CONSTRAINT_NONE || o.constraint > LS_CONSTRAINT_CHOICES)
    return argument(error, "constraint is " + std::to_string(o.constraint) +
                               ": give an ls_constraint_kind (LS_CONSTRAINT_NONE .. LS_CONSTRAINT_CHOICES)");
  if (wants_text && o.constraint_text == nullptr)
    return argument(error, "constraint_text is NULL: this constraint kind needs its schema, grammar or regex");
  if (!wants_text && o.constraint_text != nullptr)
    return argument(error, "constraint_text is set, but this constraint kind takes none");
  if (o.constraint == LS_CONSTRAINT_CHOICES) {
    if (o.n_choices > 0 && o.choices == nullptr) return argument(error, "choices is NULL");
    for (size_t i = 0; i < o.n_choices; ++i) {
      if (o.choices[i] == nullptr) return argument(error, "choices[" + std::to_string(i) + "] is NULL");
      spec->choices.emplace_back(o.choices[i]);
    }
  } else if (o.n_choices > 0) {
    return argument(error, "n_choices is set, but the constraint is not LS_CONSTRAINT_CHOICES");
  }
  static const constraint::Kind kinds[] = {constraint::Kind::kJsonSchema, constraint::Kind::kJsonSchema,
                                           constraint::Kind::kJsonObject, constraint::Kind::kGrammar,
                                           constraint::Kind::kRegex,      constraint::Kind::kChoices};
  spec->kind = kinds[o.constraint];
  if (wants_text) spec->text = o.constraint_text;
  return LS_OK;
}

}  // namespace

const char* error_text(const ls_error* error) { return error != nullptr ? error->message : last_message().c_str(); }

ls_status read_picking(ls_runtime* rt, size_t index, const ls_generate_options& o, const std::vector<int64_t>& stop_ids,
                       Picking* picking, ls_error* error) {
  ls_status status = read_sampling(o, &picking->sampling, error);
  if (status != LS_OK) return status;
  if (o.top_logprobs < 0 || o.top_logprobs > kMaxTopLogprobs)
    return argument(
        error, "top_logprobs is " + std::to_string(o.top_logprobs) + ": give 0 to " + std::to_string(kMaxTopLogprobs));
  if (o.top_logprobs > 0 && o.logprobs == 0) return argument(error, "top_logprobs needs logprobs: set logprobs to 1");
  picking->logprobs = o.logprobs != 0;
  picking->top_logprobs = o.top_logprobs;
  if (o.n < 1 || o.n > LS_MAX_PARALLEL)
    return argument(error, "n is " + std::to_string(o.n) + ": give 1 to " + std::to_string(LS_MAX_PARALLEL) +
                               " choices (ls_generate_options_init sets 1)");
  picking->choices = static_cast<size_t>(o.n);
  constraint::Spec spec;
  status = read_spec(o, &spec, error);
  if (status != LS_OK) return status;
  auto info = rt->pool->info(index);
  if (!info.ok()) return report(error, info.status(), LS_ERR_REQUEST, LS_ERR_LOAD, rt->runner_messages);
  status = read_logit_bias(o, info->vocab_size, picking, error);
  if (status != LS_OK || o.constraint == LS_CONSTRAINT_NONE) return status;
  if (o.ignore_eos != 0)
    return argument(error, "ignore_eos with a constraint: a constrained answer ends with its end-of-sequence id");
  if (stop_ids.empty()) {
    set_error(error, LS_ERR_REQUEST,
              "a constraint needs an end-of-sequence id to end the answer: the request has none");
    return LS_ERR_REQUEST;
  }
  status = constraint_compiler(rt, info->vocab_size, error);
  if (status != LS_OK) return status;
  constraint::Compiler* compiler = rt->constraints.get();
  StatusOr<std::shared_ptr<const constraint::Compiled>> compiled = Status::failure("not compiled");
  {
    // A new schema takes a while to compile: the batch and the other callers go on meanwhile.
    Unguard compiling(rt);
    compiled = compiler->compile(spec);
  }
  if (!compiled.ok()) return report(error, compiled.status(), LS_ERR_REQUEST, LS_ERR_REQUEST, rt->runner_messages);
  picking->constraint = std::move(compiled.value());
  picking->mask_worker = rt->mask_worker.get();
  picking->constraint_stats = &compiler->stats();
  return LS_OK;
}

}  // namespace lora_share::capi
