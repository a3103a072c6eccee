#include "batch_script.h"

#include <algorithm>
#include <map>
#include <memory>

#include "adapter_on_foundation.h"
#include "batch_engine.h"

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

}  // namespace

Status run_batch_script(AdapterPool& pool, std::vector<ScriptRequest>* requests) {
  // Every adapter resident at once (a budget that cannot hold them is refused), all on one program.
  std::map<size_t, SharedAdapter*> adapters;
  for (int pass = 0; pass < 2; ++pass)
    for (const ScriptRequest& r : *requests) {
      auto adapter = pool.acquire(r.index);
      if (!adapter.ok()) return adapter.status();
      auto* shared = dynamic_cast<SharedAdapter*>(adapter.value());
      if (shared == nullptr) return Status::usage("batching needs the shared loading (not stock Modules)");
      adapters[r.index] = shared;
    }
  SharedProgram* program = nullptr;
  for (const auto& [index, adapter] : adapters) {
    if (!pool.resident(index))
      return Status::usage("the memory budget cannot hold every adapter of the script at once");
    if (program != nullptr && adapter->program() != program)
      return Status::usage("the script's adapters run different programs: one batch runs one");
    program = adapter->program();
  }
  if (program == nullptr) return Status();
  auto made = BatchEngine::create(*program, pool.parallel());
  if (!made.ok()) return made.status();
  BatchEngine& engine = *made.value();
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
    std::vector<BatchRow> rows;
    for (size_t i = 0; i < live.size(); ++i)
      rows.push_back({i, live[i].request->slot, live[i].request->tokens.back(), live[i].pos});
    std::vector<float> logits;
    Status s = engine.decode(rows, &logits);
    if (!s.ok()) return s;
    for (size_t i = 0; i < live.size(); ++i) {
      pick(live[i].request, logits.data() + i * vocab, vocab);
      live[i].request->batch_sizes.push_back(live.size());
      ++live[i].pos;
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
