// One row's constraint: xgrammar's matcher over a compiled grammar, and the
// token mask of the row's next pick, filled by the mask worker while the
// model's step runs (docs/structured-output.md, "Masks beside the step").
//
//   prepare(worker)   after the row's last token was accepted, before the step
//                     that computes the logits of its next one: the worker
//                     starts filling the mask
//   apply(logits)     after the step: waits for the mask (fills it on this
//                     thread if the worker has not started it), and sets every
//                     forbidden token to -inf
//   accept(token)     the picked token advances the grammar
//
// End-of-sequence ids are allowed exactly when the grammar can end, and are
// all that is allowed once nothing else can follow. The mask also goes
// through token_bytes.h's filters (valid UTF-8; no raw control byte in JSON).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <xgrammar/matcher.h>

#include "compiler.h"

namespace lora_share::constraint {

class RowConstraint;

// One thread that fills rows' masks, started with the runtime's first
// constraint and shared by every row of every request (the one-row path's and
// the batch's): the rows of a step are queued before it and filled one after
// the other while the step's matrix products run.
class MaskWorker {
 public:
  MaskWorker();
  ~MaskWorker();
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;

 private:
  friend class RowConstraint;
  void submit(RowConstraint* row);
  // Returns once `row`'s fill is done; a fill still queued is taken off the
  // queue and run on the calling thread (no waiting on a busy worker).
  void wait(RowConstraint* row);
  void loop();

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<RowConstraint*> queue_;
  RowConstraint* filling_ = nullptr;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

class RowConstraint {
 public:
  // A fresh matcher over `compiled`, ending at `stop_ids` (the request's: the
  // build's EOS ids, or the caller's); time and counts go to `stats`.
  RowConstraint(std::shared_ptr<const Compiled> compiled, const std::vector<int64_t>& stop_ids, Stats* stats);
  // Waits for a fill in flight: the worker never outlives what it fills.
  ~RowConstraint();
  RowConstraint(const RowConstraint&) = delete;
  RowConstraint& operator=(const RowConstraint&) = delete;

  // Starts filling the next token's mask: on `worker`, or at apply() when it is null.
  void prepare(MaskWorker* worker);
  // The mask over `vocab` logits: every token the grammar forbids next becomes -inf.
  void apply(float* logits, int64_t vocab);
  // Whether the grammar takes `token` next (after apply, the only ones it allows are those left).
  bool accept(int64_t token);

 private:
  friend class MaskWorker;
  void fill();

  std::shared_ptr<const Compiled> compiled_;  // the matcher's grammar, kept alive
  xgrammar::GrammarMatcher matcher_;
  std::vector<int32_t> bitmask_;
  Stats* stats_;
  Utf8State utf8_;                // the answer's bytes so far, as UTF-8 (token_bytes.h)
  MaskWorker* worker_ = nullptr;  // the one filling the mask now, if any
  bool filled_ = false;
};

}  // namespace lora_share::constraint
