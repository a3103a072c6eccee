#include "batch_script.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include "adapter_on_foundation.h"
#include "batch_engine.h"
#include "drafts.h"

namespace lora_share {
namespace {

struct Live {
  ScriptRequest* request;
  const LoraData* lora;
  int64_t pos;  // the position of its last token (the next one decode feeds)
};

int64_t argmax(const float* logits, int64_t vocab) {
  return std::max_element(logits, logits + vocab) - logits;  // first index on ties, as the sampler
}

// Appends the token picked from `logits` (and the row) to `request`.
void pick(ScriptRequest* request, const float* logits, int64_t vocab) {
  request->logits.insert(request->logits.end(), logits, logits + vocab);
  request->tokens.push_back(argmax(logits, vocab));
}

// The drafts `live` verifies this step: its prediction after the tokens it has, at most max_drafts
// and the engine's row, and no more than it has tokens to go after the one this step picks anyway.
std::vector<int64_t> drafts_of(const Live& live, size_t row_tokens) {
  const ScriptRequest& r = *live.request;
  size_t have = r.tokens.size();
  int64_t room = std::min<int64_t>(
      {r.max_drafts, static_cast<int64_t>(row_tokens) - 1, r.max_new_tokens - static_cast<int64_t>(have) - 1});
  if (room <= 0 || have >= r.prediction.size()) return {};
  size_t end = std::min(r.prediction.size(), have + static_cast<size_t>(room));
  return std::vector<int64_t>(r.prediction.begin() + static_cast<std::ptrdiff_t>(have),
                              r.prediction.begin() + static_cast<std::ptrdiff_t>(end));
}

}  // namespace

namespace {

// The adapters `indices` (each resident at once: a budget that cannot hold them is refused), all on one
// program, and an engine over it with the pool's slots; nullptr without adapters.
Status engine_for(AdapterPool& pool, const std::vector<size_t>& indices, std::map<size_t, SharedAdapter*>* adapters,
                  std::unique_ptr<BatchEngine>* engine) {
  for (int pass = 0; pass < 2; ++pass)
    for (size_t index : indices) {
      auto adapter = pool.acquire(index);
      if (!adapter.ok()) return adapter.status();
      auto* shared = dynamic_cast<SharedAdapter*>(adapter.value());
      if (shared == nullptr) return Status::usage("batching needs the shared loading (not stock Modules)");
      (*adapters)[index] = shared;
    }
  SharedProgram* program = nullptr;
  for (const auto& [index, adapter] : *adapters) {
    if (!pool.resident(index))
      return Status::usage("the memory budget cannot hold every adapter of the script at once");
    if (program != nullptr && adapter->program() != program)
      return Status::usage("the script's adapters run different programs: one batch runs one");
    program = adapter->program();
  }
  if (program == nullptr) return Status();
  auto made = BatchEngine::create(*program, pool.parallel());
  if (!made.ok()) return made.status();
  *engine = std::move(made.value());
  return Status();
}

}  // namespace

Status run_batch_script(AdapterPool& pool, std::vector<ScriptRequest>* requests) {
  std::vector<size_t> indices;
  for (const ScriptRequest& r : *requests) indices.push_back(r.index);
  std::map<size_t, SharedAdapter*> adapters;
  std::unique_ptr<BatchEngine> made;
  Status ready = engine_for(pool, indices, &adapters, &made);
  if (!ready.ok() || made == nullptr) return ready;
  BatchEngine& engine = *made;
  int64_t vocab = engine.vocab_size();

  for (ScriptRequest& r : *requests) {
    r.tokens.clear();
    r.logits.clear();
    r.batch_sizes.clear();
    if (r.prompt.empty() || r.max_new_tokens < 1)
      return Status::usage("a script request needs a prompt and max_new_tokens >= 1");
    if (static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens > engine.max_seq_len())
      return Status::usage("a script request's prompt + new tokens exceed max_seq_len " +
                           std::to_string(engine.max_seq_len()));
    r.drafted = r.accepted = 0;
  }
  std::vector<Live> live;  // live[i] runs in batch row i
  size_t started = 0;
  std::vector<ScriptRequest*> order;
  for (ScriptRequest& r : *requests) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(),
                   [](const ScriptRequest* a, const ScriptRequest* b) { return a->joins < b->joins; });
  for (int64_t step = 0; started < order.size() || !live.empty(); ++step) {
    // Arrivals: each prompt fed in chunks on its slot, with its row's LoRA.
    while (started < order.size() && order[started]->joins <= step) {
      ScriptRequest* r = order[started++];
      size_t row = live.size();
      if (row >= engine.rows())
        return Status::usage("more live requests than the engine's " + std::to_string(engine.rows()) + " rows");
      for (const Live& l : live)
        if (l.request->slot == r->slot) return Status::usage("two live requests on KV slot " + std::to_string(r->slot));
      const LoraData* lora = adapters[r->index]->lora_data();
      Status s = engine.set_row(row, lora);
      if (!s.ok()) return s;
      std::vector<float> logits;
      int64_t chunk = engine.prefill_chunk();
      for (size_t at = 0; at < r->prompt.size(); at += static_cast<size_t>(chunk)) {
        std::vector<int64_t> part(r->prompt.begin() + at, r->prompt.begin() + std::min(r->prompt.size(), at + chunk));
        s = engine.prefill(row, r->slot, part, static_cast<int64_t>(at), &logits);
        if (!s.ok()) return s;
      }
      pick(r, logits.data(), vocab);
      if (r->max_new_tokens > 1) live.push_back({r, lora, static_cast<int64_t>(r->prompt.size())});
    }
    if (live.empty()) continue;
    std::vector<std::vector<int64_t>> drafts;
    bool drafting = false;
    for (const Live& l : live) {
      // A program exported before drafts verifies none: verify says so.
      drafts.push_back(drafts_of(l, std::max<size_t>(engine.max_row_tokens(), 2)));
      drafting = drafting || !drafts.back().empty();
    }
    std::vector<float> logits;
    if (!drafting) {
      std::vector<BatchRow> rows;
      for (size_t i = 0; i < live.size(); ++i)
        rows.push_back({i, live[i].request->slot, live[i].request->tokens.back(), live[i].pos});
      Status s = engine.decode(rows, &logits);
      if (!s.ok()) return s;
      for (size_t i = 0; i < live.size(); ++i) {
        pick(live[i].request, logits.data() + i * vocab, vocab);
        live[i].request->batch_sizes.push_back(live.size());
        ++live[i].pos;
      }
    } else {
      std::vector<DraftRow> rows;
      for (size_t i = 0; i < live.size(); ++i) {
        std::vector<int64_t> tokens{live[i].request->tokens.back()};
        tokens.insert(tokens.end(), drafts[i].begin(), drafts[i].end());
        rows.push_back({i, live[i].request->slot, std::move(tokens), live[i].pos});
      }
      Status s = engine.verify(rows, &logits);
      if (!s.ok()) return s;
      const float* row_logits = logits.data();
      for (size_t i = 0; i < live.size(); ++i) {
        ScriptRequest* r = live[i].request;
        std::vector<int64_t> gained = accept_greedy(rows[i].tokens, row_logits, vocab);
        for (size_t j = 0; j < gained.size(); ++j) pick(r, row_logits + j * vocab, vocab);
        row_logits += rows[i].tokens.size() * vocab;
        r->batch_sizes.push_back(live.size());
        r->drafted += static_cast<int64_t>(drafts[i].size());
        r->accepted += static_cast<int64_t>(gained.size()) - 1;
        live[i].pos += static_cast<int64_t>(gained.size());
      }
    }
    // Leavers: the last row moves into a leaver's place, so rows stay 0..B-1.
    for (size_t i = live.size(); i-- > 0;) {
      if (static_cast<int64_t>(live[i].request->tokens.size()) < live[i].request->max_new_tokens) continue;
      if (i + 1 != live.size()) {
        live[i] = live.back();
        Status moved = engine.set_row(i, live[i].lora);
        if (!moved.ok()) return moved;
      }
      live.pop_back();
    }
  }
  return Status();
}

}  // namespace lora_share

namespace lora_share {

Status time_steps(AdapterPool& pool, size_t index, const std::vector<int64_t>& prompt, size_t rows, size_t tokens,
                  size_t steps, std::vector<double>* ms) {
  std::map<size_t, SharedAdapter*> adapters;
  std::unique_ptr<BatchEngine> engine;
  Status s = engine_for(pool, {index}, &adapters, &engine);
  if (!s.ok()) return s;
  if (rows < 1 || rows > engine->rows())
    return Status::usage(std::to_string(rows) + " rows; the engine runs 1.." + std::to_string(engine->rows()));
  if (prompt.empty() || static_cast<int64_t>(prompt.size() + tokens) > engine->max_seq_len())
    return Status::usage("the prompt and the row's tokens must fit max_seq_len " +
                         std::to_string(engine->max_seq_len()));
  std::vector<float> logits;
  std::vector<DraftRow> drafting;
  std::vector<BatchRow> plain;
  for (size_t r = 0; r < rows; ++r) {
    s = engine->set_row(r, adapters[index]->lora_data());
    for (size_t at = 0; s.ok() && at < prompt.size(); at += static_cast<size_t>(engine->prefill_chunk())) {
      std::vector<int64_t> part(
          prompt.begin() + static_cast<std::ptrdiff_t>(at),
          prompt.begin() +
              static_cast<std::ptrdiff_t>(std::min(prompt.size(), at + static_cast<size_t>(engine->prefill_chunk()))));
      s = engine->prefill(r, r, part, static_cast<int64_t>(at), &logits);
    }
    if (!s.ok()) return s;
    int64_t pos = static_cast<int64_t>(prompt.size());
    // The drafts: the prompt's first tokens (what they are does not change the step's work).
    std::vector<int64_t> row(prompt.begin(),
                             prompt.begin() + static_cast<std::ptrdiff_t>(std::min(prompt.size(), tokens)));
    row.resize(tokens, prompt.back());
    drafting.push_back({r, r, row, pos});
    plain.push_back({r, r, row[0], pos});
  }
  ms->clear();
  for (size_t i = 0; i < steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    s = tokens == 1 ? engine->decode(plain, &logits) : engine->verify(drafting, &logits);
    if (!s.ok()) return s;
    ms->push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return Status();
}

}  // namespace lora_share
