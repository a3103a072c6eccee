#include "scheduler.h"

#include <algorithm>
#include <chrono>

#include "adapter_on_foundation.h"
#include "drafter.h"
#include "kv_rows.h"
#include "step_width.h"

namespace lora_share {

using Clock = std::chrono::steady_clock;

// One run() call: its choices' tokens on their way to the caller, under mu_.
struct Scheduler::Caller {
  std::deque<TokenInfo> pending;
  size_t open = 0;  // choices still running
  Status status;    // the first failure of a choice
  Generation result;
  std::condition_variable ready;
};

// One choice of a request: one row of the batch.
struct Scheduler::Job {
  Job(const BatchRequest& r, size_t c, Caller& owner)
      : request(r), choice(c), caller(owner), picker(r.picking, r.prompt, r.stop_ids, c) {}
  const BatchRequest& request;  // the caller's, shared by its choices
  const size_t choice;
  Caller& caller;
  Job* leader = nullptr;  // choice > 0: forks choice 0's slot once its prompt is fed
  TokenPicker picker;
  std::atomic<bool> cancelled{false};  // the caller's callback asked to stop

  // The scheduler thread's.
  const LoraData* lora = nullptr;
  size_t slot = 0, row = 0;
  bool placed = false;  // its row's LoRA is set (set_row)
  size_t fed = 0;       // prompt tokens whose KV the slot holds
  std::vector<int64_t> tokens;
  std::vector<float> logits;  // kept rows (keep_logits)
  bool ended = false;
  Status failure;  // why it ended, if it failed
  Clock::time_point admitted, first_token, last_token;
  std::unique_ptr<Drafter> drafter;  // null: it does not speculate
  uint64_t drafted = 0, accepted = 0;

  bool decoding() const { return fed == request.prompt.size() && !ended; }
};

Scheduler::Scheduler(AdapterPool& pool, std::mutex& pool_lock, std::atomic<int>& lock_waiters, size_t slots,
                     bool speculation, bool every_draft)
    : pool_(pool),
      pool_lock_(pool_lock),
      lock_waiters_(lock_waiters),
      slots_(slots),
      speculation_(speculation),
      every_draft_(every_draft),
      batch_size_counts_(slots, 0),
      thread_([this] { loop(); }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> q(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

StatusOr<Generation> Scheduler::run(BatchRequest request, const TokenCallback& on_token) {
  Caller caller;
  const size_t n = std::max<size_t>(request.picking.choices, 1);
  std::vector<std::unique_ptr<Job>> jobs;
  for (size_t c = 0; c < n; ++c) {
    jobs.push_back(std::make_unique<Job>(request, c, caller));
    if (c > 0) jobs[c]->leader = jobs[0].get();
  }
  std::unique_lock<std::mutex> q(mu_);
  if (stop_) return Status::failure("the runtime is closing");
  caller.open = n;
  for (auto& job : jobs) incoming_.push_back(job.get());  // together: admitted as one group
  wake_.notify_all();
  std::vector<bool> stopped(n, false);
  std::vector<int64_t> delivered;
  for (;;) {
    caller.ready.wait(q, [&] { return caller.open == 0 || !caller.pending.empty(); });
    std::deque<TokenInfo> tokens;
    tokens.swap(caller.pending);
    bool done = caller.open == 0;
    q.unlock();
    for (const TokenInfo& t : tokens) {
      if (stopped[t.choice]) continue;  // what came after the caller hung up is not its answer
      delivered.push_back(t.token);
      if (on_token && !on_token(t)) {
        stopped[t.choice] = true;
        jobs[t.choice]->cancelled.store(true);
      }
    }
    q.lock();
    if (done && caller.pending.empty()) break;
  }
  if (!caller.status.ok()) return caller.status;
  Generation g = std::move(caller.result);
  if (n == 1 && stopped[0] && g.rows > static_cast<int64_t>(delivered.size())) {
    g.rows = static_cast<int64_t>(delivered.size());
    g.logits.resize(static_cast<size_t>(g.rows * g.vocab));
  }
  g.tokens = std::move(delivered);
  return g;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.slots = slots_;
  s.batch_steps = batch_steps_;
  s.prompt_fed = prompt_fed_;
  s.slots_cleared = slots_cleared_;
  s.batch_size_counts = batch_size_counts_;
  s.drafted = drafted_;
  s.accepted = accepted_;
  if (table_) {
    s.slots_in_use = table_->in_use();
    s.prefix_hits = table_->prefix_hits();
    s.prefix_tokens = table_->prefix_tokens();
  }
  if (engine_) s.slot_bytes = engine_->slot_bytes();
  return s;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> q(mu_);
      wake_.wait(q, [&] { return stop_ || !incoming_.empty() || !active_.empty() || !waiting_.empty(); });
      if (stop_) break;
      waiting_.insert(waiting_.end(), incoming_.begin(), incoming_.end());
      incoming_.clear();
    }
    // Callers waiting for the runtime's lock (to submit, to load, for stats)
    // go first: the scheduler would take it back before they wake otherwise.
    while (lock_waiters_.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::lock_guard<std::mutex> lock(pool_lock_);
    step();
  }
  std::lock_guard<std::mutex> lock(pool_lock_);
  fail_active(Status::failure("the runtime was closed while this request ran"));
  std::lock_guard<std::mutex> q(mu_);
  waiting_.insert(waiting_.end(), incoming_.begin(), incoming_.end());
  incoming_.clear();
  for (Job* job : waiting_) {
    Caller& c = job->caller;
    if (c.status.ok()) c.status = Status::failure("the runtime was closed before this request ran");
    --c.open;
    c.ready.notify_all();
  }
  waiting_.clear();
}

void Scheduler::step() {
  for (Job* job : active_)
    if (job->cancelled.load()) job->ended = true;
  leave_finished();
  admit();
  if (!engine_) return;  // nothing in the batch: each request admitted ran alone (run_alone drops the engine)
  prefill_chunks();
  end_orphans();
  decode_all();
  leave_finished();
}

Status Scheduler::set_engine(SharedProgram& program, size_t index) {
  drop_engine();
  auto engine = BatchEngine::create(program, slots_);
  if (!engine.ok()) return engine.status();
  engine_ = std::move(engine.value());
  table_ = std::make_unique<SlotTable>(engine_->slots(), engine_->ring());
  costs_ = std::make_unique<StepCosts>(engine_->rows(), engine_->max_row_tokens());
  kv_ = program.kv();
  engine_program_ = index;
  engine_generation_ = pool_.programs_generation();
  return Status();
}

void Scheduler::drop_engine() {
  // After a re-planned arena the rows are gone with it (a new arena is zeroed).
  if (table_ && pool_.programs_generation() == engine_generation_)
    for (size_t slot = 0; slot < table_->size(); ++slot)
      clear_rows(kv_.at_slot(slot), 0, static_cast<int64_t>(table_->tokens(slot).size()));
  table_.reset();
  costs_.reset();
  engine_.reset();
}

void Scheduler::release_slot(size_t slot) {
  int64_t held = static_cast<int64_t>(table_->tokens(slot).size());
  if (slots_ == 1) {
    // One slot continues nothing (admit): as on the one-row path, the rows the request wrote are zeroed
    // when it ends, its rejected drafts' after what it holds included (none is "cleared" for a value).
    clear_rows(kv_.at_slot(slot), 0, held + static_cast<int64_t>(engine_->max_row_tokens()));
    table_->forget(slot);
    table_->release(slot);
    return;
  }
  if (!rows_finite(kv_.at_slot(slot), held)) {
    clear_rows(kv_.at_slot(slot), 0, held);
    table_->forget(slot);
    ++slots_cleared_;
  }
  table_->release(slot);
}

void Scheduler::admit() {
  // Loading a program of another shape re-plans the arena: the engine's
  // program and every row's LoRA are gone, so are their requests.
  if (engine_ && pool_.programs_generation() != engine_generation_) {
    fail_active(
        Status::failure("a program of another shape was loaded while this request ran "
                        "(the runtime re-planned its memory): run it again"));
    engine_.reset();
    table_.reset();
  }
  while (!waiting_.empty()) {
    // A request's choices wait together, its leader (choice 0) first, and are admitted together.
    Job& lead = *waiting_.front();
    const size_t n = std::max<size_t>(lead.request.picking.choices, 1);
    auto program = pool_.program_of(lead.request.adapter);
    // Another program than the batch's: after this batch (loading it may
    // re-plan the memory the batch runs in).
    bool other = program.ok() && (!engine_ || program.value() != engine_program_);
    if (other && !active_.empty()) return;
    if (program.ok() && !other && active_.size() + n > engine_->rows() && n <= engine_->rows()) return;
    // Its adapter fits the budget only once running requests have ended: it
    // waits (first in line) rather than overshooting; acquire refuses what
    // never fits.
    if (!active_.empty() && pool_.room_for(lead.request.adapter) == AdapterPool::Room::kWait) return;
    // One slot (a runtime of parallel 1 that speculates): n choices run one after the other, and a
    // request that does not speculate runs, on the one-row path, as with speculation off.
    const bool one_row = slots_ == 1 && (n > 1 || !lead.request.speculative);
    if (one_row && !active_.empty()) return;
    std::vector<Job*> group(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(n));
    waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(n));
    auto fail = [&](const Status& status) {
      for (Job* job : group) finish(*job, status);
    };
    auto adapter = program.ok() ? pool_.acquire(lead.request.adapter) : StatusOr<Adapter*>(program.status());
    if (!adapter.ok()) {
      fail(adapter.status());
      continue;
    }
    auto* shared = dynamic_cast<SharedAdapter*>(adapter.value());
    if (shared == nullptr) {
      fail(
          Status::usage("parallel > 1 batches adapters over one shared program: stock "
                        "loading (a Module per adapter) cannot"));
      continue;
    }
    // A build before decode_batch (or, with one slot, before its drafts: not loaded): one request at a
    // time on the one-row path, as with parallel 1.
    if (one_row || (other && !shared->program()->has_batch())) {
      run_alone(group);
      continue;
    }
    if (other) {
      Status s = set_engine(*shared->program(), program.value());
      if (!s.ok()) {
        fail(s);
        continue;
      }
    }
    if (n > engine_->rows()) {
      fail(Status::usage("n is " + std::to_string(n) + ": the batch runs at most " + std::to_string(engine_->rows()) +
                         " rows at once (ls_options.parallel), one per choice"));
      continue;
    }
    for (Job* next : group) {
      Job& job = *next;
      // Choice 0 may continue a slot holding its prompt's start; the others take any free slot,
      // which the fork fills. One slot feeds every prompt from position 0, as the one-row path does: a
      // prefix hit could change an answer (its KV computed in other chunks).
      auto claim =
          table_->claim(job.request.adapter, job.request.prompt, job.request.cache_prompt && !job.leader && slots_ > 1);
      if (!claim) {  // rows <= slots: a free row has a free slot
        finish(job, Status::failure("no free KV slot for a free row"));
        continue;
      }
      // Rows past the kept prefix go back to zero: masked, but read (kv_rows.h).
      clear_rows(kv_.at_slot(claim->slot), static_cast<int64_t>(claim->kept), static_cast<int64_t>(claim->stale));
      job.lora = shared->lora_data();
      job.slot = claim->slot;
      job.fed = claim->kept;
      job.row = active_.size();
      job.admitted = Clock::now();
      Status s = engine_->set_row(job.row, job.lora);
      if (!s.ok()) {
        table_->release(job.slot);
        finish(job, s);
        continue;
      }
      job.placed = true;
      // Drafts need a decode_batch that takes them (exporter revision 14).
      if (speculation_ && job.request.speculative && engine_->max_row_tokens() > 1) {
        DrafterOptions options;
        options.max_drafts = engine_->max_row_tokens() - 1;
        job.drafter = std::make_unique<Drafter>(job.request.prompt, job.request.prediction, options);
      }
      job.picker.prepare();                  // its first mask, filled while the prompt runs
      pool_.begin_use(job.request.adapter);  // until it leaves: the budget's eviction skips it
      active_.push_back(&job);
    }
  }
}

void Scheduler::run_alone(const std::vector<Job*>& group) {
  drop_engine();
  const BatchRequest& r = group.front()->request;
  auto g = pool_.generate(r.adapter, r.prompt, r.max_new_tokens, r.picking, r.stop_ids, r.keep_logits,
                          [&](const TokenInfo& token) {
                            Job& job = *group[token.choice];
                            job.tokens.push_back(token.token);
                            std::lock_guard<std::mutex> q(mu_);
                            job.caller.pending.push_back(token);
                            job.caller.ready.notify_all();
                            return !job.cancelled.load();
                          });
  if (!g.ok()) {
    for (Job* job : group) finish(*job, g.status());
    return;
  }
  // Its prompt tokens are the pool's count (ls_stats adds both).
  group.front()->logits = std::move(g->logits);
  for (Job* job : group) finish(*job, Status(), &g.value());
}

void Scheduler::pack() {
  std::stable_partition(active_.begin(), active_.end(), [](const Job* j) { return j->decoding(); });
  for (size_t i = 0; i < active_.size(); ++i) {
    Job& job = *active_[i];
    if (job.row == i && job.placed) continue;
    job.row = i;
    Status s = engine_->set_row(i, job.lora);
    job.placed = s.ok();
    if (!s.ok()) {
      job.ended = true;
      job.failure = s;
    }
  }
}

void Scheduler::prefill_chunks() {
  size_t chunk = static_cast<size_t>(std::max<int64_t>(engine_->prefill_chunk(), 1));
  size_t budget = chunk;
  for (Job* next : active_) {
    Job& job = *next;
    const std::vector<int64_t>& prompt = job.request.prompt;
    if (job.ended || job.leader || job.fed >= prompt.size()) continue;
    // The chunk this request is fed alone too (never cut to fit the budget): its KV, and so its
    // answer, do not depend on who else is prefilling.
    size_t n = std::min(prompt.size() - job.fed, chunk);
    if (n > budget) continue;
    std::vector<int64_t> part(prompt.begin() + job.fed, prompt.begin() + job.fed + n);
    std::vector<float> logits;
    Status s = engine_->prefill(job.row, job.slot, part, static_cast<int64_t>(job.fed), &logits);
    if (!s.ok()) {
      job.ended = true;
      job.failure = s;
      continue;
    }
    table_->fed(job.slot, part.data(), part.size());
    job.fed += n;
    prompt_fed_ += n;
    budget -= n;
    if (job.fed == prompt.size()) {
      job.first_token = Clock::now();
      // The other choices first: deliver picks from `logits` in place.
      for (Job* sibling : active_)
        if (sibling->leader == &job && !sibling->ended) fork(*sibling, job, logits);
      deliver(job, logits);
    }
    if (budget == 0) break;
  }
}

void Scheduler::fork(Job& sibling, const Job& leader, const std::vector<float>& logits) {
  const std::vector<int64_t>& prompt = leader.request.prompt;
  Status s = engine_->copy_slot(leader.slot, sibling.slot, static_cast<int64_t>(prompt.size()));
  if (!s.ok()) {
    sibling.ended = true;
    sibling.failure = s;
    return;
  }
  table_->fed(sibling.slot, prompt.data(), prompt.size());
  sibling.fed = prompt.size();
  sibling.first_token = Clock::now();
  std::vector<float> own = logits;
  deliver(sibling, own);
}

void Scheduler::end_orphans() {
  for (Job* job : active_) {
    if (!job->leader || job->ended || job->fed == job->request.prompt.size() || !job->leader->ended) continue;
    job->ended = true;
    job->failure =
        job->leader->failure.ok() ? Status::failure("the request's prompt did not finish") : job->leader->failure;
  }
}

void Scheduler::decode_all() {
  pack();
  std::vector<DraftRow> rows;
  std::vector<RowDrafts> proposed;
  for (Job* job : active_) {
    if (!job->decoding() || job->tokens.empty()) break;  // packed: decoding rows first
    std::vector<int64_t> tokens{job->tokens.back()};
    std::vector<int64_t> drafts = drafts_of(*job);
    proposed.push_back(
        RowDrafts{drafts.empty() ? std::vector<double>{} : chained_kept(job->drafter->acceptance(), drafts.size())});
    tokens.insert(tokens.end(), drafts.begin(), drafts.end());
    rows.push_back(DraftRow{job->row, job->slot, std::move(tokens),
                            static_cast<int64_t>(job->request.prompt.size() + job->tokens.size() - 1)});
  }
  if (rows.empty()) return;
  // Every row runs at the widest row's width: drafts only as far as they pay for the whole step
  // (step_width.h). Drafts cut here were not verified: their drafter hears only of those that were.
  size_t widest = 1;
  for (const DraftRow& r : rows) widest = std::max(widest, r.tokens.size());
  const size_t width = every_draft_ ? widest : best_width(proposed, *costs_);
  if (width > 1) {
    std::vector<bool> loose(rows.size(), false);
    for (size_t b = 0; b < rows.size(); ++b) {
      DraftRow& r = rows[b];
      if (r.tokens.size() == 1 && active_[b]->drafter) {
        // No drafts of its own: its padding runs anyway, so it carries the weaker ones (free to verify).
        std::vector<int64_t> drafts = drafts_of(*active_[b], true);
        r.tokens.insert(r.tokens.end(), drafts.begin(), drafts.end());
        loose[b] = !drafts.empty();
      }
      if (r.tokens.size() > width) r.tokens.resize(width);
    }
    return verify_all(rows, loose);
  }
  // Width 1: a plain step (one token a row, no padding).
  std::vector<BatchRow> plain;
  for (const DraftRow& r : rows) plain.push_back(BatchRow{r.row, r.slot, r.tokens[0], r.pos});
  std::vector<float> logits;
  // One slot: the one-row path's call (decode over the slot in place), so a step without drafts costs
  // and computes what it does with speculation off; decode_batch runs only the steps that verify.
  const Clock::time_point start = Clock::now();
  Status s = slots_ == 1 ? engine_->prefill(plain[0].row, plain[0].slot, {plain[0].token}, plain[0].pos, &logits)
                         : engine_->decode(plain, &logits);
  costs_->record(rows.size(), 1, std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  if (!s.ok()) {
    for (size_t b = 0; b < rows.size(); ++b) active_[b]->ended = true, active_[b]->failure = s;
    return;
  }
  ++batch_steps_;
  ++batch_size_counts_[rows.size() - 1];
  const size_t vocab = static_cast<size_t>(engine_->vocab_size());
  for (size_t b = 0; b < rows.size(); ++b) {
    Job& job = *active_[b];
    table_->fed(job.slot, &plain[b].token, 1);
    std::vector<float> row(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab);
    deliver(job, row);
  }
}

std::vector<int64_t> Scheduler::drafts_of(Job& job, bool loose) {
  if (!job.drafter) return {};
  const int64_t pos = static_cast<int64_t>(job.request.prompt.size() + job.tokens.size() - 1);
  // A step gains at most its drafts + 1 tokens; drafts past max_new_tokens or the context are waste.
  const int64_t room = std::min({static_cast<int64_t>(engine_->max_row_tokens()) - 1,
                                 job.request.max_new_tokens - static_cast<int64_t>(job.tokens.size()) - 1,
                                 engine_->max_seq_len() - 1 - pos});
  if (room <= 0) return {};
  std::vector<int64_t> drafts = loose ? job.drafter->propose_loose() : job.drafter->propose();
  if (static_cast<int64_t>(drafts.size()) > room) drafts.resize(static_cast<size_t>(room));
  return drafts;
}

void Scheduler::verify_all(std::vector<DraftRow>& rows, const std::vector<bool>& loose) {
  std::vector<float> logits;
  size_t width = 0;
  for (const DraftRow& r : rows) width = std::max(width, r.tokens.size());
  const Clock::time_point start = Clock::now();
  Status s = engine_->verify(rows, &logits);
  costs_->record(rows.size(), width, std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  if (!s.ok()) {
    for (size_t b = 0; b < rows.size(); ++b) active_[b]->ended = true, active_[b]->failure = s;
    return;
  }
  ++batch_steps_;
  ++batch_size_counts_[rows.size() - 1];
  const size_t vocab = static_cast<size_t>(engine_->vocab_size());
  auto at = logits.begin();
  for (size_t b = 0; b < rows.size(); ++b) {
    Job& job = *active_[b];
    const std::vector<int64_t>& tokens = rows[b].tokens;
    // Each token is picked from the logits after the one before it, as one-token decode picks it (the
    // same picker: greedy, or a sample from the same generator); the next draft is verified only if the
    // pick was it. A sampled row thus keeps the target's distribution (with drafts that are certain,
    // speculative sampling's rule is "draw from p, keep the draft if the draw is it"), and draws the
    // same numbers as without drafts: the same seed, the same answer.
    size_t gained = 0;
    while (gained < tokens.size()) {
      std::vector<float> row(at + static_cast<std::ptrdiff_t>(gained * vocab),
                             at + static_cast<std::ptrdiff_t>((gained + 1) * vocab));
      deliver(job, row);
      ++gained;
      if (job.ended || gained == tokens.size() || job.tokens.back() != tokens[gained]) break;
    }
    at += static_cast<std::ptrdiff_t>(tokens.size() * vocab);
    // The row's last token and its accepted drafts hold their K/V in the slot now; the rejected drafts'
    // K/V lie past the next position (a ring keeps spare rows for them) and are written over.
    table_->fed(job.slot, tokens.data(), gained);
    const size_t drafted = tokens.size() - 1, accepted = gained - 1;
    if (job.drafter && !loose[b]) job.drafter->feedback(drafted, accepted);  // a row without drafter carried none
    job.drafted += drafted;
    job.accepted += accepted;
    drafted_ += drafted;
    accepted_ += accepted;
  }
}

void Scheduler::deliver(Job& job, std::vector<float>& logits) {
  if (job.request.keep_logits) job.logits.insert(job.logits.end(), logits.begin(), logits.end());
  auto token = job.picker.pick(logits);
  if (!token.ok()) {
    job.ended = true;
    job.failure = token.status();
    return;
  }
  job.tokens.push_back(token->token);
  if (job.drafter) job.drafter->extend(&token->token, 1);
  job.last_token = Clock::now();
  const auto& stop = job.request.stop_ids;
  if (static_cast<int64_t>(job.tokens.size()) >= job.request.max_new_tokens ||
      std::find(stop.begin(), stop.end(), token->token) != stop.end())
    job.ended = true;
  else
    job.picker.prepare();  // the next mask, filled while the next step runs
  std::lock_guard<std::mutex> q(mu_);
  job.caller.pending.push_back(std::move(token.value()));
  job.caller.ready.notify_all();
}

void Scheduler::leave_finished() {
  bool left = false;
  for (size_t i = 0; i < active_.size();) {
    Job& job = *active_[i];
    if (!job.ended) {
      ++i;
      continue;
    }
    release_slot(job.slot);
    pool_.end_use(job.request.adapter);
    active_.erase(active_.begin() + i);
    finish(job, job.failure);
    left = true;
  }
  if (left) pack();
}

void Scheduler::fail_active(const Status& status) {
  for (Job* job : active_) {
    if (table_) table_->release(job->slot);
    pool_.end_use(job->request.adapter);
    finish(*job, status);
  }
  active_.clear();
}

void Scheduler::finish(Job& job, const Status& status, const Generation* alone) {
  using seconds = std::chrono::duration<double>;
  job.ended = true;  // its other choices, waiting for its prompt, see it (end_orphans)
  if (!status.ok()) job.failure = status;
  Generation g;
  g.vocab = engine_ ? engine_->vocab_size() : alone ? alone->vocab : 0;
  g.rows = job.request.keep_logits ? static_cast<int64_t>(job.tokens.size()) : 0;
  g.logits = std::move(job.logits);
  g.tokens = job.tokens;
  g.drafted = job.drafted;
  g.accepted = job.accepted;
  if (alone != nullptr) {
    g.prefill_ms = alone->prefill_ms;
    g.decode_ms = alone->decode_ms;
    g.prefill_tokens_per_s = alone->prefill_tokens_per_s;
    g.decode_tokens_per_s = alone->decode_tokens_per_s;
  } else if (!job.tokens.empty()) {
    double prefill_s = seconds(job.first_token - job.admitted).count();
    double decode_s = seconds(job.last_token - job.first_token).count();
    g.prefill_ms = prefill_s * 1e3;
    g.decode_ms = decode_s * 1e3;
    if (prefill_s > 0) g.prefill_tokens_per_s = job.request.prompt.size() / prefill_s;
    if (job.tokens.size() > 1 && decode_s > 0) g.decode_tokens_per_s = (job.tokens.size() - 1) / decode_s;
  }
  std::lock_guard<std::mutex> q(mu_);
  Caller& caller = job.caller;
  if (!status.ok() && caller.status.ok()) caller.status = status;
  if (job.choice == 0) caller.result = std::move(g);
  --caller.open;
  caller.ready.notify_all();
}

}  // namespace lora_share
