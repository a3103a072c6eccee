// A script of requests run through a BatchEngine (lora_share_diag.h,
// ls_diag_batch_script): the diagnostic that tests every row of a mixed batch
// against the same request alone. Each request joins at a given step, on a
// given KV slot, feeds its prompt chunk by chunk (forward on its slot) and then
// decodes greedily, one decode_batch step over every decoding row, until it
// has its tokens; then it leaves. Live rows stay packed at rows 0..B-1
// (batch_engine.h): a leaving row's place goes to the last row (set_row again).
// A request with a prediction drafts from it (BatchEngine::verify): at each
// step, the tokens of its prediction after as many as it has, up to
// max_drafts, within its tokens to go and the context, accepted greedily
// (drafts.h); a step where no row drafts is a plain decode step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "adapter_pool.h"
#include "status.h"

namespace lora_share {

struct ScriptRequest {
  size_t index = AdapterPool::kBase;  // the adapter (kBase: the foundation alone)
  std::vector<int64_t> prompt;
  size_t slot = 0;                  // its KV slot
  int64_t max_new_tokens = 1;       // greedy tokens, no stop ids
  int64_t joins = 0;                // the decode step before which it arrives
  std::vector<int64_t> prediction;  // what it drafts from: its answer as guessed
  int64_t max_drafts = 0;           // drafts a step, at most (0: none)
  // Out: its tokens, and the logits each was picked from (tokens x vocab).
  std::vector<int64_t> tokens;
  std::vector<float> logits;
  // Out: the rows of the decode steps it was part of (its first token comes from its prompt).
  std::vector<size_t> batch_sizes;
  // Out: drafts it verified, and how many of them it accepted.
  int64_t drafted = 0, accepted = 0;
};

// Runs `requests` over `pool`'s program with pool.parallel() KV slots. Usage
// errors: a slot or adapter the engine cannot take, two live requests on one
// slot, more live requests than rows, adapters of different programs, drafts
// on a program exported before them.
Status run_batch_script(AdapterPool& pool, std::vector<ScriptRequest>* requests);

// The cost of a step (speculative decoding's trade): `rows` rows on adapter
// `index`, each on its own KV slot (0..rows-1) with `prompt` fed, each carrying
// `tokens` tokens (its last and tokens - 1 drafts; one token: a plain decode
// step), `steps` steps one after another at the same positions; the
// milliseconds of each step into `ms`.
Status time_steps(AdapterPool& pool, size_t index, const std::vector<int64_t>& prompt, size_t rows, size_t tokens,
                  size_t steps, std::vector<double>* ms);

}  // namespace lora_share
