// The library's runtime: one foundation, mapped and packed once, and the
// adapters it knows, of which those that fit a memory budget are resident.
//
// Adapters are registered (from a deployment folder's manifest.json, or one
// by one) and checked against the foundation when registered; a request
// loads its adapter on first use and, when the budget is full, first evicts
// the least recently used resident adapters. Every program runs in one
// planned-memory arena sized to the largest (planned_arena.h says why that is
// correct: requests run one at a time, each from position 0).
//
// Every adapter of a deployment carries the same program: the pool loads each
// distinct program once (by the sha256 its adapters' records name) and binds
// an adapter to it by mapping its LoRA tensors (lora_data.h); loading or
// evicting an adapter is mapping or unmapping its data.
//
// Budget accounting (lora_share.h, MEMORY BUDGET, is the contract):
// foundation = its file sizes + 8 MiB of runtime state, plus each loaded
// program (1.2 x its file without adapter data + 4 MiB); arena = its
// allocated bytes; an adapter = 1.05 x its own LoRA bytes + an overhead
// (512 KiB unless set). Eviction happens before a load, and a load that
// would need the bytes of adapters requests are running on is refused (a
// scheduler waits for them instead), so the accounted total never exceeds
// the budget.
//
// It is the one loading path: the C API's runtimes and build/runner's
// (lora_share_diag.h) use it; the runner's variants (stock Modules, private
// arenas, no weight cache, no packed-weights file, no .ptd) are PoolOptions.
//
// Packed weights (packed_cache.h): the first program loaded decides the
// packed-weights file, by the foundation's fingerprint and its own sha256.
// A valid file is mapped (warm). Without one (cold), the program loads once
// with XNNPACK writing a temporary file, which is then put in place and the
// program loaded again from it as a warm start would: every method it loads
// (forward, decode, ...) and every later program use that one file.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "adapter_on_foundation.h"
#include "file_check.h"
#include "foundation.h"
#include "generate.h"
#include "manifest.h"
#include "packed_cache.h"
#include "planned_arena.h"
#include "status.h"
#include "xnnpack_options.h"

namespace lora_share {

struct PoolOptions {
  std::string ptd;
  std::string shared_ptd;                                 // "" = none
  bool verify = true;                                     // refuse adapters built for another foundation
  uint64_t budget_bytes = 0;                              // 0 = no budget
  uint64_t adapter_overhead_bytes = uint64_t{512} << 10;  // see adapter_cost_bytes
  // The loading variants benchmarks compare (lora_share_diag.h):
  bool stock = false;            // each adapter a Module of its own (adapter_per_module.cpp)
  bool private_arenas = false;   // each program its own planned memory
  bool weight_cache = true;      // XNNPACK's process-wide weight cache
  bool huge_pages = true;        // packed weights in 2 MiB pages once loaded (huge_pages.h)
  int threads = 0;               // ExecuTorch's threadpool: 0 = one per core (set_threads)
  bool packed_cache = true;      // packed weights kept in a file between starts (packed_cache.h)
  std::string packed_cache_dir;  // "" = beside the .ptd, else the user's cache folder
  bool read_eos = true;          // false: no EOS ids, manifest.json unread
  // The folder of the build's tokenizer and its manifest.json: "" = the
  // .ptd's folder (ls_diag_options.tokenizer_dir, the runner's --tokenizer).
  std::string tokenizer_dir;
  // Refuse, at open, a tokenizer folder whose manifest is not the
  // foundation's (the binding rule: tokenizer/binding.h) before the EOS ids
  // are read from it (ls_diag_options.bind_tokenizer).
  bool check_tokenizer = false;
  // KV slots (ls_options.parallel): requests batched at once (issue 47). > 1
  // sizes the arena's KV buffer for that many slots and loads decode_batch
  // (batch/batch_engine.h runs it), so the budget counts every slot; 1: one
  // cache, and decode_batch only to verify drafts (`speculation`).
  size_t parallel = 1;
  // ls_options.speculation: requests may verify drafts in decode_batch (a
  // runtime of one slot loads it for them when it takes drafts); every_draft:
  // every draft found, not as many as pay for the step (step_width.h).
  bool speculation = true;
  bool every_draft = false;
};

// What loading did, for the runner's report.
struct LoadingInfo {
  const char* mode = "shared";   // "shared" or "stock"
  const char* arena = "shared";  // "shared", "private" or "module" (stock)
  XnnpackState xnnpack;
  bool packed_cache_warm = false;  // a valid packed-weights file was there before this process
  std::string packed_cache;        // the packed-weights file in use ("" = packed in memory)
  uint64_t planned_bytes = 0;
};

// An adapter's program shape and last load, for the runner's report.
struct AdapterInfo {
  std::string name, pte;
  int64_t vocab_size = 0, max_seq_len = 0, prefill_chunk = 0;
  double load_ms = 0;  // 0 when not resident
};

struct PoolStats {
  uint32_t known = 0, resident = 0;
  uint64_t loads = 0, evictions = 0, hits = 0;
  double last_load_ms = 0, total_load_ms = 0;
  uint64_t budget_bytes = 0, foundation_bytes = 0, program_bytes = 0, arena_bytes = 0;
  uint64_t resident_adapter_bytes = 0, largest_adapter_bytes = 0;
  uint64_t slot_bytes = 0;  // one KV slot's bytes (the arena's KV buffer holds `parallel`)
  uint64_t prompt_fed = 0;  // prompt tokens generate() ran through the model
};

// The accounted resident cost of an adapter whose own LoRA tensors are
// `lora_bytes`: 1.05 x those + `overhead_bytes`.
uint64_t adapter_cost_bytes(uint64_t lora_bytes, uint64_t overhead_bytes);

// The accounted cost of a loaded program whose file, without any adapter's
// data, is `program_bytes`, running `methods` methods (forward, and decode and
// decode_batch when it runs them): 1.2 x those bytes + 4 MiB per method (method
// and XNNPACK state).
uint64_t program_cost_bytes(uint64_t program_bytes, int methods);

class AdapterPool {
 public:
  // The index that stands for the foundation alone ("base"): the program of
  // the first registered adapter, every LoRA input a zero rank-1 pair.
  static constexpr size_t kBase = static_cast<size_t>(-1);

  // The foundation alone; adapters come with add().
  static StatusOr<std::unique_ptr<AdapterPool>> open(const PoolOptions& options);
  // A deployment folder: registers (and checks) every adapter manifest.json
  // lists and sizes the arena to the largest of them. Loads none.
  static StatusOr<std::unique_ptr<AdapterPool>> open_dir(const std::string& dir, PoolOptions options);
  // The runner's way: `options.ptd` ("" = programs that carry every weight),
  // then registers every `ptes` (named by file stem) and sizes the arena;
  // load_all() then loads them.
  static StatusOr<std::unique_ptr<AdapterPool>> open_files(const std::vector<std::string>& ptes,
                                                           const PoolOptions& options);
  // Makes every registered adapter resident, in order.
  Status load_all();

  // Registers `pte` (checking it against the foundation) if it is new, and
  // returns its index; a path already registered returns the known index.
  StatusOr<size_t> add(const std::string& pte);
  // The index of the adapter (or live mix) called `name`, or -1 ("base" is
  // kBase, not found here; nor is a removed adapter).
  int64_t find(const std::string& name) const;
  const std::string& name(size_t index) const { return entry(index).name; }
  const std::string& pte(size_t index) const { return entry(index).pte; }
  bool resident(size_t index) const { return index == kBase ? base_ != nullptr : entry(index).adapter != nullptr; }
  // Every index ever registered, removed ones included (indices stay stable);
  // mixes are not counted: they are indexed apart.
  size_t size() const { return entries_.size(); }
  // The `nth` adapter not removed (registration order), or -1 past the end.
  int64_t live_at(size_t nth) const;

  // PINS AND REMOVAL. A request in flight on adapter `index` (queued or
  // running) pins it: removing it waits until its pins are gone, so the
  // request finishes on what it started with. pin() and retire() run
  // under the runtime's lock, like every other call; unpin() and
  // wait_unpinned() may run without it (they take the pins' own lock), so a
  // remover waiting for a request never blocks the request it waits for.
  //
  // A usage error naming the adapter if it was removed; else one pin more.
  Status pin(size_t index);
  void unpin(size_t index);
  bool pinned(size_t index) const;
  // Removal, step 1: new requests no longer find it (find, pin, add of the
  // same path) and its name is free again.
  void retire(size_t index);
  bool removed(size_t index) const { return index != kBase && entry(index).removed; }
  // Step 2: blocks until no request pins adapter `index`.
  void wait_unpinned(size_t index) const;
  // Step 3: unloads it (its program stays, for the others and 'base').
  void drop(size_t index);

  // IN USE AND THE BUDGET. A request running on adapter `index` (generate's,
  // a scheduler's admitted row) uses it: eviction skips it. A queued request
  // only pins its adapter: evicted meanwhile, it loads again when the request
  // is admitted. So the adapters in use are what a load cannot evict, and a
  // load that would need their bytes is refused (acquire: a budget error)
  // rather than overshooting the budget. Under the runtime's lock.
  void begin_use(size_t index);
  void end_use(size_t index);
  // What making `index` resident (kBase: its program) asks of the budget now.
  // kReady: resident, or it fits once adapters no request uses are evicted;
  // kWait: it fits once the requests using adapters now have ended; kNever:
  // not even then (acquire's error says why).
  enum class Room { kReady, kWait, kNever };
  Room room_for(size_t index) const;

  // A mix of registered adapters (`terms`: index, scale; lora_share.h,
  // ls_adapter_mix, has the rules): an index usable wherever an adapter's is,
  // named "a*0.5+b*1.1". The same terms while that mix is held give the same
  // index and one more hold. Checked now (finite scales, one program, summed
  // ranks within the envelope, the budget); composed on first use, evicted and
  // composed again like an adapter is loaded.
  StatusOr<size_t> mix(const std::vector<std::pair<size_t, double>>& terms);
  // Drops one hold of mix `index`. The last one retires it (find no longer
  // finds it, pin refuses it) and returns true: then, as for a removal,
  // wait_unpinned and drop_mix, which forgets it. A usage error for an index
  // that is no mix.
  StatusOr<bool> release_mix(size_t index);
  void drop_mix(size_t index);
  bool is_mix(size_t index) const { return mixes_.count(index) != 0; }

  // Makes adapter `index` resident (loading it, evicting others if the
  // budget needs it) and marks it most recently used; kBase: the foundation
  // alone over its program.
  StatusOr<Adapter*> acquire(size_t index);
  // The program entry `index` (an adapter's, or kBase's) runs.
  StatusOr<size_t> program_of(size_t index) const;
  // Bumped whenever every program is unloaded (the arena grew): programs,
  // and what points into them, from before are gone.
  uint64_t programs_generation() const { return programs_generation_; }

  // check_request for adapter `index`, without loading it: the request's
  // ids against its vocabulary, prompt + new tokens against its context.
  // `prompt_label` names the prompt in messages.
  Status check(size_t index, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
               const std::string& prompt_label = "prompt") const;

  // check, then generate, for adapter `index`, stopping after one of
  // `stop_ids` (eos_ids(), or none, or the caller's). Usage errors are the
  // request's; failures are loading's or running's.
  StatusOr<Generation> generate(size_t index, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                const Picking& picking, const std::vector<int64_t>& stop_ids, bool keep_logits,
                                const TokenCallback& on_token, const std::string& prompt_label = "prompt");

  // Adapter `index` (kBase: the foundation alone).
  StatusOr<AdapterInfo> info(size_t index) const;
  LoadingInfo loading() const;

  // The foundation file ("" for the runner's self-contained programs) and
  // the fingerprint its record names ("" without one).
  const std::string& ptd() const { return options_.ptd; }
  std::string foundation_fingerprint() const {
    return files_.foundation.record.present ? files_.foundation.record.fingerprint : "";
  }

  // KV slots: requests the runtime batches at once (PoolOptions.parallel).
  size_t parallel() const { return options_.parallel; }
  bool speculation() const { return options_.speculation; }
  bool every_draft() const { return options_.every_draft; }
  bool stock() const { return options_.stock; }  // a Module per adapter: no shared program to batch

  // The build's end-of-sequence ids (manifest.h, eos_ids_of); may be none.
  const std::vector<int64_t>& eos_ids() const { return eos_ids_; }

  // The folder of the build's tokenizer (PoolOptions.tokenizer_dir, or the
  // .ptd's), and its manifest.json as read at open (null: not read, with
  // read_eos off, or no file there).
  std::string tokenizer_folder() const;
  const Manifest* tokenizer_manifest() const { return tokenizer_manifest_ ? &*tokenizer_manifest_ : nullptr; }

  PoolStats stats() const;
  // The loaded programs' variants that skip absent LoRA slots, summed.
  VariantStats variant_stats() const;

  // The foundation every program of the pool reads, and XNNPACK's load
  // options: for programs of PT2 archives (program_forward.h) beside the adapters.
  const Foundation& foundation() const { return *foundation_; }
  const executorch::runtime::LoadBackendOptionsMap* backend_options() const { return xnnpack_.load_options(); }

 private:
  // One distinct program: opened (its sizes known) when its first adapter is
  // registered, its forward loaded into the arena on first use.
  struct ProgramEntry {
    std::string sha256, pte;  // pte: the adapter file it is loaded from
    size_t lora_slots = 0;
    uint64_t cost = 0;                  // accounted bytes while loaded
    std::vector<size_t> planned_sizes;  // its arena buffers: KV cache, then forward's planned buffers
    int64_t vocab_size = 0, max_seq_len = 0, prefill_chunk = 0;
    // With private_arenas: its own planned memory (else the pool's arena_).
    // Before `program`, which points into it, so that it goes after.
    std::unique_ptr<PlannedArena> own_arena;
    std::unique_ptr<SharedProgram> program;  // null = to be opened again (after the arena grew)
    bool loaded = false;
    // The table of every slot's rewrites (the first adapter record that has
    // one), handed to the program when it loads: its calls skip the slots
    // they leave alone (program_variants.h).
    std::vector<SlotPatch> slot_patches;
    uint64_t method_cost = 0;  // accounted bytes of each variant method
  };
  struct Entry {
    std::string name, pte;
    PteInfo info;                      // its checked record and where its tensors are
    size_t program = 0;                // index into programs_
    uint64_t cost = 0;                 // accounted bytes when resident
    std::unique_ptr<Adapter> adapter;  // null = not resident
    uint64_t last_used = 0;
    bool removed = false;  // retire()d (a mix: its last hold released): kept so that indices (and handles) stay valid
    // A mix's terms (registered adapters' indices, scales); empty for an adapter.
    std::vector<std::pair<size_t, double>> terms;
    uint32_t holds = 0;  // a mix's: mix() calls less release_mix() calls
  };
  // Mixes are indexed from here on, apart from registered adapters and kBase.
  static constexpr size_t kFirstMix = size_t{1} << 62;
  Entry& entry(size_t index) { return index >= kFirstMix ? mixes_.at(index) : entries_[index]; }
  const Entry& entry(size_t index) const { return index >= kFirstMix ? mixes_.at(index) : entries_[index]; }
  // Every entry, registered adapters then mixes, for what visits them all.
  template <typename F>
  void for_each_entry(F&& visit) {
    for (size_t i = 0; i < entries_.size(); ++i) visit(i, entries_[i]);
    for (auto& [index, mix] : mixes_) visit(index, mix);
  }
  // Maps each term's LoRA data and composes the mix's (LoraData::compose).
  StatusOr<std::unique_ptr<LoraData>> compose(const Entry& mix, const SharedProgram& program);

  // An adapter's program shape.
  struct Limits {
    int64_t vocab_size = 0, max_seq_len = 0, prefill_chunk = 0;
  };

  AdapterPool() = default;
  // `known`: the deployment's manifest.json when open_dir has read it.
  Status open_foundation(const Manifest* known = nullptr);
  // After registering a folder's or the runner's adapters: the shared arena
  // sized to the largest program (none with stock or private_arenas), then
  // every adapter checked against the budget.
  Status size_arena();
  // A usage error if `name` (of `pte`) is 'base' or already registered.
  Status check_new_name(const std::string& name, const std::string& pte) const;
  StatusOr<Limits> limits(size_t index) const;
  // The arena `program` runs in, grown if it cannot hold it (not with private_arenas).
  Status ensure_arena(const ProgramEntry& program);
  // check_pte + check_pair, then finds (or opens, to read its sizes) the
  // program the adapter's record names.
  StatusOr<Entry> inspect(const std::string& name, const std::string& pte);
  StatusOr<size_t> program_for(const std::string& pte, const PteInfo& info);
  // Opens (if needed) and loads program `index` into the arena.
  Status load_program(size_t index);
  // Chooses the packed-weights file for program `p` (once, for the first
  // program loaded) and sets XNNPACK's load options to it.
  Status resolve_packed_cache(const ProgramEntry& p);
  // Cold: loads `p` once to write the packed-weights file, publishes it and
  // unloads `p` again, so that it loads from the published file.
  Status write_packed_cache(ProgramEntry& p, PlannedArena& arena);
  // Makes the program of the first registered adapter loaded and returns
  // the foundation-alone adapter over it.
  StatusOr<Adapter*> acquire_base();
  Status check_budget_holds(const Entry& entry) const;
  // Evicts LRU adapters no request uses (nor `keep`) until `incoming` more
  // bytes fit; a budget error naming what holds the rest if they do not.
  Status make_room(uint64_t incoming, size_t keep, const std::string& what);
  // The bytes making `index` resident adds (its own, and its program's if
  // that is not loaded), and the name it goes by in messages.
  uint64_t incoming_bytes(size_t index) const;
  bool in_use(size_t index) const { return uses_.count(index) != 0; }
  void evict(size_t index);
  // A larger arena for `sizes`: every resident adapter is evicted and every
  // program unloaded first.
  Status grow_arena(const std::vector<size_t>& sizes);
  uint64_t accounted_bytes() const;
  uint64_t arena_bytes() const;             // every arena allocated
  std::vector<size_t> arena_sizes() const;  // empty without an arena

  // Declaration order is destruction order in reverse: adapters (in
  // entries_) go before their programs, programs before the arena and the
  // foundation they use.
  PoolOptions options_;
  XnnpackSettings xnnpack_;
  DataFiles files_;
  uint64_t foundation_bytes_ = 0;
  XnnpackState xnnpack_state_;  // as configured, before loading
  // The packed-weights file, chosen when the first program loads (null before,
  // and without a weight cache, a fingerprint or options.packed_cache).
  std::unique_ptr<PackedCache> packed_;
  bool packed_resolved_ = false;
  std::unique_ptr<Foundation> foundation_;
  std::unique_ptr<PlannedArena> arena_;
  std::vector<ProgramEntry> programs_;
  std::vector<Entry> entries_;
  std::map<size_t, Entry> mixes_;  // by index, from kFirstMix
  size_t next_mix_ = kFirstMix;
  std::unique_ptr<SharedAdapter> base_;  // over programs_[entries_[0].program], once used
  std::vector<int64_t> eos_ids_;
  std::optional<Manifest> tokenizer_manifest_;
  uint64_t clock_ = 0;
  uint64_t programs_generation_ = 0;
  PoolStats counters_;
  // Pins by entry index, under their own lock (not the runtime's: see PINS).
  mutable std::mutex pins_lock_;
  mutable std::condition_variable unpinned_;
  std::map<size_t, int> pins_;
  std::map<size_t, int> uses_;  // running requests by entry index, under the runtime's lock
};

}  // namespace lora_share
