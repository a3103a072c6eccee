// Continuous batching of a runtime's requests (docs/batching.md, "Continuous
// batching" and "The C API's threads"; the C++ port of
// lora_share/inference/batching.py's Scheduler over BatchEngine).
//
// One scheduler thread per runtime opened with parallel > 1, or with one slot
// and speculation (below), owns the BatchEngine and the slot table. ls_generate's callers (any threads) hand a
// request to run() and block on their own queue of tokens; the callback runs
// on the caller's thread. Each iteration of the scheduler thread, under the
// runtime's lock (the pool is not thread-safe):
//   1. requests whose caller hung up leave;
//   2. waiting requests are admitted while rows and slots are free: the
//      adapter is made resident (under a memory budget whose room adapters
//      of running requests hold, the first in line waits for them to end),
//      the slot table picks a slot (a prefix hit
//      starts the prompt after what the slot holds), BatchEngine::set_row
//      fills the row's LoRA once;
//   3. prompt chunks of the requests still in their prompts, up to one
//      chunk's tokens in all (so a long prompt delays the others by one
//      chunk a step, and short prompts arriving together start together);
//   4. one decode step over every request that is generating, each row's
//      token picked by its own TokenPicker (token_picker.h: logprobs, bias,
//      its constraint's mask, its sampler) and handed to its caller; a
//      constrained row's next mask is queued on the mask worker at once, so
//      it is filled while the next step runs; rows that speculate carry
//      their drafts, as many as pay for the step's width (step_width.h);
//   5. finished requests leave; their slot keeps its tokens and KV, unless
//      that KV holds a non-finite value: then it is cleared (kv_rows.h).
// A request with n choices (Picking::choices) is n rows admitted together:
// choice 0 feeds the prompt, then each other choice's slot takes a copy of
// its KV (BatchEngine::copy_slot) and its first token is picked from the same
// logits, each choice with its own picker (seed + i).
// A slot's rows past what it holds are zero: a claim clears the rows past
// the prefix it keeps, and the slots are cleared before the engine goes.
// Rows that decode are kept packed at rows 0..D-1 (BatchEngine's contract);
// a request whose row index changes gets set_row again.
//
// Every request of a batch runs on one program (adapters of one deployment
// share it): a request on another program (another envelope) waits until the
// batch is empty, then the engine is made again over its program, and the
// slots start empty. A program built before decode_batch runs its requests
// one at a time on the one-row path (AdapterPool::generate), as a runtime of
// one slot without speculation does.
//
// One slot (parallel 1 with speculation; docs/batching.md, "One slot"): one
// request at a time, so that its drafts are verified in decode_batch; every
// other step is the one-row path's decode call, and every prompt is fed from
// position 0 (no prefix reuse: a hit could change an answer), so its answers
// are the one-row path's bit for bit. A request that does not speculate, one
// of n > 1 choices (one after the other), and a program whose decode_batch
// takes no drafts (not loaded) run on the one-row path. The slot's rows are
// zeroed when a request ends, as the one-row path zeroes them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "adapter_pool.h"
#include "batch_engine.h"
#include "generate.h"
#include "slot_table.h"
#include "status.h"
#include "step_width.h"
#include "token_picker.h"

namespace lora_share {

// One ls_generate call.
struct BatchRequest {
  size_t adapter = AdapterPool::kBase;  // pool index, or kBase
  std::vector<int64_t> prompt;
  int64_t max_new_tokens = 16;
  Picking picking;
  std::vector<int64_t> stop_ids;  // ends it after one of them
  bool keep_logits = false;
  // false: the prompt is fed from position 0 even when a slot holds its
  // start (ls_generate_options.cache_prompt).
  bool cache_prompt = true;
  // Speculative decoding (docs/batching.md, "Drafts in the batch"): on, its
  // rows verify drafts from prompt lookup and from `prediction` (OpenAI's
  // Predicted Outputs, as ids) when the program's decode_batch takes them.
  bool speculative = true;
  std::vector<int64_t> prediction;
};

// Counters for ls_runtime_stats.
struct SchedulerStats {
  size_t slots = 0, slots_in_use = 0, slot_bytes = 0;
  uint64_t prefix_hits = 0, prefix_tokens = 0, batch_steps = 0, slots_cleared = 0;
  uint64_t prompt_fed = 0;                  // prompt tokens run through the model
  std::vector<uint64_t> batch_size_counts;  // [b - 1]: decode steps of b rows
  uint64_t drafted = 0, accepted = 0;       // drafts verified, and those kept
};

class Scheduler {
 public:
  // `slots` KV slots over `pool`, whose calls the scheduler makes holding
  // `pool_lock`; `lock_waiters` counts the threads waiting for that lock (the
  // scheduler lets them in between its iterations).
  // `speculation` false: no request drafts (--no-speculation); `every_draft`:
  // each step verifies every draft found, not as many as pay (step_width.h).
  Scheduler(AdapterPool& pool, std::mutex& pool_lock, std::atomic<int>& lock_waiters, size_t slots,
            bool speculation = true, bool every_draft = false);
  // Ends the thread; requests still queued end with an error.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Runs `request` in the batch, calling `on_token` (may be null) on this
  // thread with each token of each choice; false stops that choice (its row
  // leaves at the next step). Blocks until every choice ends. The caller
  // checked the request, pinned its adapter, and holds no lock of the runtime.
  StatusOr<Generation> run(BatchRequest request, const TokenCallback& on_token);

  // Call with the pool's lock held.
  SchedulerStats stats() const;

 private:
  struct Job;
  struct Caller;
  void loop();
  void step();
  void admit();
  // Prompt chunks of the requests still in their prompts, in order, up to
  // one chunk's tokens (prefill_chunk) in all: short prompts that arrive
  // together start in one step, a long one delays the others by one chunk.
  void prefill_chunks();
  void decode_all();
  // This step's drafts of `job` (none without its drafter; `loose`: its
  // drafter's weaker ones, Drafter::propose_loose), cut to what the row, its
  // tokens to go and the context leave room for.
  std::vector<int64_t> drafts_of(Job& job, bool loose = false);
  // The step's rows, each of its last token and its drafts: verified, and
  // each row's tokens picked in turn from its logits while they are its
  // drafts; the accepted K/V are committed to the slot table, the rest is
  // written past the row's position and rolled back (overwritten later).
  // `loose[b]`: row b carries loose drafts, of which its drafter hears nothing.
  void verify_all(std::vector<DraftRow>& rows, const std::vector<bool>& loose);
  // Choice `sibling` starts from its leader's prompt: the leader's slot's KV
  // copied into its own, its first token picked from the prompt's `logits`.
  void fork(Job& sibling, const Job& leader, const std::vector<float>& logits);
  // Choices whose leader ended before its prompt did end with it.
  void end_orphans();
  // Puts decoding rows first, each at its index (set_row when it moved).
  void pack();
  void leave_finished();
  void fail_active(const Status& status);
  // Picks the job's next token from `logits` and hands it to its caller;
  // marks the job done when it stops it (max_new_tokens, a stop id), else
  // queues its next mask.
  void deliver(Job& job, std::vector<float>& logits);
  // The job's caller learns that it ended with `status`; the scheduler drops
  // it. `alone`: the timings of a request run_alone ran.
  void finish(Job& job, const Status& status, const Generation* alone = nullptr);
  // A request on a program built before decode_batch (`group`: its choices):
  // the one-row path (AdapterPool::generate), alone, its tokens handed to its
  // caller as they come.
  void run_alone(const std::vector<Job*>& group);
  // The engine over `program` (the pool's program `index`), slots empty.
  Status set_engine(SharedProgram& program, size_t index);
  // Drops the engine and the slot table, their rows cleared first (another
  // program reads the same buffer, with its own layout) while the program
  // they are in is still loaded.
  void drop_engine();
  // The request in `slot` left: the slot keeps its tokens, or is cleared and
  // forgotten when its KV holds a non-finite value.
  void release_slot(size_t slot);

  AdapterPool& pool_;
  std::mutex& pool_lock_;
  std::atomic<int>& lock_waiters_;
  const size_t slots_;
  const bool speculation_;
  const bool every_draft_;

  // The scheduler thread's own state (read by stats() under the pool's lock).
  std::unique_ptr<BatchEngine> engine_;
  std::unique_ptr<SlotTable> table_;
  std::unique_ptr<StepCosts> costs_;  // the engine's steps, timed (how wide a step that verifies pays)
  KvCache kv_;                        // the engine's program's KV slots (slot 0; at_slot for the others)
  size_t engine_program_ = 0;
  uint64_t engine_generation_ = 0;
  std::deque<Job*> waiting_;
  std::vector<Job*> active_;  // index = engine row
  uint64_t batch_steps_ = 0, prompt_fed_ = 0;
  uint64_t drafted_ = 0, accepted_ = 0;
  uint64_t slots_cleared_ = 0;  // over every slot table
  std::vector<uint64_t> batch_size_counts_;

  // Shared with the callers, under mu_.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job*> incoming_;
  bool stop_ = false;

  std::thread thread_;  // last: starts after everything above is ready
};

}  // namespace lora_share
