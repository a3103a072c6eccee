#include "adapter_pool.h"

#include <malloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include "file_stem.h"
#include "huge_pages.h"
#include "manifest.h"

namespace lora_share {
namespace {

uint64_t file_size(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::string mib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", bytes / (1024.0 * 1024.0));
  return text;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t total(const std::vector<size_t>& sizes) {
  uint64_t sum = 0;
  for (size_t s : sizes) sum += s;
  return sum;
}

}  // namespace

uint64_t adapter_cost_bytes(uint64_t lora_bytes, uint64_t overhead_bytes) {
  // An adapter is its mapped LoRA tensors and a few small objects: bench-scale
  // measures its PSS against 1.05 x its bytes + 0.5 MiB.
  return lora_bytes + lora_bytes / 20 + overhead_bytes;
}

uint64_t program_cost_bytes(uint64_t program_bytes, int methods) {
  // Each method's state and XNNPACK's runtimes and operators: 4 MiB is what one
  // loaded adapter cost before adapters were data (docs/decoding.md); the
  // decode method added ~4 MiB of PSS after load at SmolLM2-135M.
  return program_bytes + program_bytes / 5 + static_cast<uint64_t>(methods) * (uint64_t{4} << 20);
}

std::string AdapterPool::tokenizer_folder() const {
  std::string folder = options_.tokenizer_dir;
  if (folder.empty()) {
    const size_t slash = options_.ptd.find_last_of('/');
    folder = slash == std::string::npos ? "." : slash == 0 ? "/" : options_.ptd.substr(0, slash);
  }
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  return folder;
}

Status AdapterPool::open_foundation(const Manifest* known) {
  // The library runs one method at a time per runtime: one XNNPACK workspace
  // for the process and the weight cache, so every adapter shares one packed
  // foundation. The stock path measures ExecuTorch as shipped: the
  // backend's default workspaces, no weight cache.
  // Before any program loads: each XNNPACK runtime keeps the pool it was made with.
  Status s = set_threads(options_.threads);
  if (!s.ok()) return s;
  s = xnnpack_.configure(options_.weight_cache && !options_.stock,
                         /*share_workspace=*/!options_.stock);
  if (!s.ok()) return s;
  // A folder the caller names must take the file: refused now, not at the first load.
  if (options_.packed_cache && !options_.packed_cache_dir.empty()) {
    s = check_packed_cache_folder(options_.packed_cache_dir);
    if (!s.ok()) return s;
  }
  xnnpack_state_ = xnnpack_.read_state();
  // Our own checks first: a corrupt file or a mismatched pair is refused
  // before ExecuTorch reads anything from it. Without a .ptd (the runner's
  // self-contained programs) every program must carry its weights (inspect).
  bool has_ptd = !options_.ptd.empty();
  if (has_ptd) {
    auto files = check_data_files(options_.ptd, options_.shared_ptd);
    if (!files.ok()) return files.status();
    files_ = std::move(files.value());
  }
  if (has_ptd && (options_.read_eos || options_.check_tokenizer)) {
    // The tokenizer folder's manifest.json, read once: the EOS ids now, the
    // tokenizer from it when a text call first asks (text_api.cpp).
    const std::string folder = tokenizer_folder();
    const std::string path = (folder == "." ? std::string() : folder + "/") + "manifest.json";
    if (known != nullptr && options_.tokenizer_dir.empty()) {
      tokenizer_manifest_ = *known;
    } else if (std::ifstream(path)) {
      auto manifest = parse_manifest(path);
      if (!manifest.ok()) return manifest.status();
      tokenizer_manifest_ = std::move(manifest.value());
    }
    const std::string fingerprint = foundation_fingerprint();
    // A manifest of another build is a usage error (the files given do not
    // go together); the C API reports it as a load error.
    if (tokenizer_manifest_ && tokenizer_manifest_->tokenizer && options_.check_tokenizer) {
      s = check_tokenizer_foundation(*tokenizer_manifest_, options_.ptd, fingerprint);
      if (!s.ok()) return s;
    }
    if (tokenizer_manifest_ && options_.read_eos) {
      auto eos = eos_ids_of(*tokenizer_manifest_, options_.ptd, fingerprint);
      if (!eos.ok()) return eos.status();
      eos_ids_ = std::move(eos.value());
    }
  }
  // The stock path's Modules open foundation.ptd themselves; the pool reads
  // only hoisted LoRA tensors there, from adapters_shared.ptd.
  auto foundation = options_.stock ? Foundation::open_shared(options_.shared_ptd)
                    : has_ptd      ? Foundation::open(options_.ptd, options_.shared_ptd)
                                   : StatusOr<std::unique_ptr<Foundation>>(Foundation::none());
  if (!foundation.ok()) return foundation.status();
  foundation_ = std::move(foundation.value());
  // The runtime's own state (ExecuTorch and XNNPACK allocations, the shared
  // workspace) comes with the foundation: 3.4 to 8 MiB measured beyond the
  // file at the default config's shape, about 5 MiB at SmolLM-135M's.
  constexpr uint64_t kRuntimeStateBytes = uint64_t{8} << 20;
  foundation_bytes_ = (has_ptd ? file_size(options_.ptd) : 0) +
                      (options_.shared_ptd.empty() ? 0 : file_size(options_.shared_ptd)) + kRuntimeStateBytes;
  return Status();
}

StatusOr<std::unique_ptr<AdapterPool>> AdapterPool::open(const PoolOptions& options) {
  auto pool = std::unique_ptr<AdapterPool>(new AdapterPool());
  pool->options_ = options;
  Status s = pool->open_foundation();
  if (!s.ok()) return s;
  if (options.budget_bytes != 0 && pool->foundation_bytes_ > options.budget_bytes)
    return Status::usage("the memory budget (" + mib(options.budget_bytes) + ") is below the foundation alone (" +
                         mib(pool->foundation_bytes_) + " for " + options.ptd + ")");
  return pool;
}

StatusOr<std::unique_ptr<AdapterPool>> AdapterPool::open_dir(const std::string& dir, PoolOptions options) {
  auto manifest = read_manifest(dir);
  if (!manifest.ok()) return manifest.status();
  options.ptd = dir + "/" + manifest->foundation_file;
  options.shared_ptd = manifest->shared_file.empty() ? "" : dir + "/" + manifest->shared_file;
  auto pool = std::unique_ptr<AdapterPool>(new AdapterPool());
  pool->options_ = options;
  Status s = pool->open_foundation(&manifest.value());
  if (!s.ok()) return s;
  for (const ManifestAdapter& a : manifest->adapters) {
    if (a.name == kBaseName)
      return Status::failure(dir +
                             "/manifest.json lists an adapter named 'base', the name of the "
                             "foundation alone: rename it in the build config and rebuild");
    if (pool->find(a.name) >= 0)
      return Status::failure(dir + "/manifest.json lists the adapter '" + a.name +
                             "' twice: rebuild the folder with lora-share build");
    auto entry = pool->inspect(a.name, dir + "/" + a.file);
    if (!entry.ok()) return entry.status();
    pool->entries_.push_back(std::move(entry.value()));
  }
  s = pool->size_arena();
  if (!s.ok()) return s;
  return pool;
}

StatusOr<std::unique_ptr<AdapterPool>> AdapterPool::open_files(const std::vector<std::string>& ptes,
                                                               const PoolOptions& options) {
  auto pool = std::unique_ptr<AdapterPool>(new AdapterPool());
  pool->options_ = options;
  Status s = pool->open_foundation();
  if (!s.ok()) return s;
  for (const std::string& pte : ptes) {
    std::string name = file_stem(pte);
    s = pool->check_new_name(name, pte);
    if (!s.ok()) return s;
    auto entry = pool->inspect(name, pte);
    if (!entry.ok()) return entry.status();
    pool->entries_.push_back(std::move(entry.value()));
  }
  s = pool->size_arena();
  if (!s.ok()) return s;
  return pool;
}

Status AdapterPool::size_arena() {
  // One arena for every program, sized to the largest of them (planned_arena.h
  // says why sharing is correct); private arenas come with their programs.
  if (!options_.stock && !options_.private_arenas) {
    std::vector<std::vector<size_t>> sizes;
    for (const ProgramEntry& p : programs_) sizes.push_back(p.planned_sizes);
    auto arena = PlannedArena::allocate(PlannedArena::largest(sizes));
    if (!arena.ok()) return arena.status();
    arena_ = std::move(arena.value());
  }
  for (const Entry& e : entries_) {
    Status s = check_budget_holds(e);
    if (!s.ok()) return s;
  }
  return Status();
}

Status AdapterPool::load_all() {
  for (size_t i = 0; i < entries_.size(); ++i) {
    auto adapter = acquire(i);
    if (!adapter.ok()) return adapter.status();
  }
  return Status();
}

StatusOr<AdapterPool::Entry> AdapterPool::inspect(const std::string& name, const std::string& pte) {
  // Messages name the runner's flags; the C API words them for the library.
  auto info = check_pte(pte, "--pte");
  if (!info.ok()) return info.status();
  if (options_.ptd.empty()) {
    // A lora-share adapter never carries its foundation: refused here with
    // the fix rather than failing to load.
    if (needs_data_file(info.value()))
      return Status::usage("--pte " + pte + " is a lora-share adapter for foundation " + info->record.fingerprint +
                           ": give its foundation.ptd with --ptd");
  } else {
    Status s = check_pair(pte, info.value(), files_, options_.verify);
    if (!s.ok()) return s;
  }
  Entry entry;
  entry.name = name;
  entry.pte = pte;
  if (!options_.stock) {  // stock adapters carry their program in their Module
    auto program = program_for(pte, info.value());
    if (!program.ok()) return program.status();
    entry.program = program.value();
  }
  uint64_t own = 0;
  for (const LoraKeys& keys : info->record.lora)
    for (const std::string* key : {&keys.a, &keys.b}) {
      auto range = info->own_ranges.find(*key);
      if (range != info->own_ranges.end()) own += range->second.second;
    }
  entry.cost = adapter_cost_bytes(own, options_.adapter_overhead_bytes);
  entry.info = std::move(info.value());
  return entry;
}

StatusOr<size_t> AdapterPool::program_for(const std::string& pte, const PteInfo& info) {
  // A program without a record (not written by lora-share) is its own.
  std::string sha = info.record.program_sha256.empty() ? "file:" + pte : info.record.program_sha256;
  for (size_t i = 0; i < programs_.size(); ++i)
    if (programs_[i].sha256 == sha) {
      if (programs_[i].slot_patches.empty()) programs_[i].slot_patches = info.record.slot_patches;
      return i;
    }
  ProgramEntry p;
  p.slot_patches = info.record.slot_patches;
  p.sha256 = sha;
  p.pte = pte;
  p.lora_slots = info.record.envelope.size();
  p.program = std::make_unique<SharedProgram>();
  Status s = p.program->open(pte, p.lora_slots, options_.parallel, options_.speculation);
  if (!s.ok()) return s;
  p.planned_sizes = p.program->planned_sizes();
  p.vocab_size = p.program->vocab_size();
  p.max_seq_len = p.program->max_seq_len();
  p.prefill_chunk = p.program->prefill_chunk();
  uint64_t data = 0;
  for (const auto& [key, range] : info.own_ranges) data += range.second;
  uint64_t size = file_size(pte);
  p.cost = program_cost_bytes(size > data ? size - data : 0, 1 + p.program->has_decode() + p.program->has_batch());
  p.method_cost = program_cost_bytes(size > data ? size - data : 0, 1);
  programs_.push_back(std::move(p));
  return programs_.size() - 1;
}

Status AdapterPool::load_program(size_t index) {
  ProgramEntry& p = programs_[index];
  if (p.loaded) return Status();
  if (!p.program) {
    p.program = std::make_unique<SharedProgram>();
    Status s = p.program->open(p.pte, p.lora_slots, options_.parallel, options_.speculation);
    if (!s.ok()) return s;
  }
  PlannedArena* arena = arena_.get();
  if (options_.private_arenas) {
    if (!p.own_arena) {
      auto own = PlannedArena::allocate(p.planned_sizes);
      if (!own.ok()) return own.status();
      p.own_arena = std::move(own.value());
    }
    arena = p.own_arena.get();
  }
  Status s = resolve_packed_cache(p);
  if (!s.ok()) return s;
  if (packed_ && packed_->state() == PackedCache::State::kCold) {
    s = write_packed_cache(p, *arena);
    if (!s.ok()) return s;
  }
  if (!p.loaded) {
    s = p.program->load_methods(*arena, *foundation_, xnnpack_.load_options());
    if (!s.ok()) return s;
    p.loaded = true;
  }
  // Its calls skip the envelope slots they leave alone, in variants made on
  // first use while the budget has room for them (program_variants.h).
  p.program->set_slot_patches(p.slot_patches);
  p.program->set_variant_budget(
      [this](uint64_t bytes) {
        return options_.budget_bytes == 0 || accounted_bytes() + bytes <= options_.budget_bytes;
      },
      p.method_cost);
  // Loading packed the foundation (the first program) or this program's own
  // weights: every token reads them, so they go into 2 MiB pages now.
  if (options_.huge_pages) collapse_resident_memory(options_.threads);
  return Status();
}

Status AdapterPool::resolve_packed_cache(const ProgramEntry& p) {
  if (packed_resolved_) return Status();
  packed_resolved_ = true;
  // Without the weight cache there is nothing to keep; without a fingerprint
  // or a program record (files not written by lora-share) nothing to key it by.
  std::string fingerprint = foundation_fingerprint();
  if (!options_.packed_cache || options_.stock || !options_.weight_cache || fingerprint.empty() ||
      p.sha256.rfind("file:", 0) == 0)
    return Status();
  packed_ = PackedCache::locate(packed_cache_folders(options_.packed_cache_dir, options_.ptd),
                                packed_cache_key(fingerprint, p.sha256));
  Status s = xnnpack_.use_packed_cache(packed_->path());
  if (s.ok()) return s;
  packed_->abandon(s.message());
  return xnnpack_.use_packed_cache("");
}

Status AdapterPool::write_packed_cache(ProgramEntry& p, PlannedArena& arena) {
  Status s = p.program->load_methods(arena, *foundation_, xnnpack_.load_options());
  if (!s.ok()) {
    packed_->abandon("");
    xnnpack_.use_packed_cache("");
    return s;
  }
  // XNNPACK wrote its index as each method finished loading; saving again
  // only makes sure of it.
  s = xnnpack_.save_packed_cache();
  if (s.ok()) s = packed_->publish();
  if (!s.ok()) {
    // What was loaded works (packed into the temporary file, which goes).
    packed_->abandon("not kept (" + s.message() + ")");
    p.loaded = true;
    return Status();
  }
  // Unloading the program releases XNNPACK's writer of the file (its
  // exclusive lock), then it loads from the published file as every later
  // start will, sharing it with other processes.
  p.program = std::make_unique<SharedProgram>();
  s = p.program->open(p.pte, p.lora_slots, options_.parallel, options_.speculation);
  if (!s.ok()) return s;
  packed_->open_published();
  return xnnpack_.use_packed_cache(packed_->path());
}

Status AdapterPool::check_budget_holds(const Entry& entry) const {
  if (options_.budget_bytes == 0) return Status();
  // The arena this adapter would run in: the current one, grown if needed.
  const ProgramEntry& program = programs_[entry.program];
  uint64_t arena = total(PlannedArena::largest({arena_sizes(), program.planned_sizes}));
  uint64_t needed = foundation_bytes_ + program.cost + arena + entry.cost;
  if (needed <= options_.budget_bytes) return Status();
  return Status::usage("the memory budget (" + mib(options_.budget_bytes) + ") cannot hold adapter '" + entry.name +
                       "': the foundation (" + mib(foundation_bytes_) + ") + its program (" + mib(program.cost) +
                       ") + the planned-memory arena (" + mib(arena) + ") + the adapter (" + mib(entry.cost) +
                       ") need " + mib(needed) + " (" + std::to_string(needed) + " bytes): raise the budget");
}

Status AdapterPool::check_new_name(const std::string& name, const std::string& pte) const {
  if (name == kBaseName)
    return Status::usage(pte +
                         ": the name 'base' (the file stem) is reserved for the foundation "
                         "alone: rename the file");
  if (find(name) >= 0)
    return Status::usage("an adapter named '" + name + "' is already loaded (the name is the file stem): rename " +
                         pte);
  return Status();
}

StatusOr<size_t> AdapterPool::add(const std::string& pte) {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].pte == pte && !entries_[i].removed) return i;
  std::string name = file_stem(pte);
  Status s = check_new_name(name, pte);
  if (!s.ok()) return s;
  auto entry = inspect(name, pte);
  if (!entry.ok()) return entry.status();
  s = check_budget_holds(entry.value());
  if (!s.ok()) return s;
  entries_.push_back(std::move(entry.value()));
  return entries_.size() - 1;
}

int64_t AdapterPool::find(const std::string& name) const {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].name == name && !entries_[i].removed) return static_cast<int64_t>(i);
  for (const auto& [index, mix] : mixes_)
    if (mix.name == name && !mix.removed) return static_cast<int64_t>(index);
  return -1;
}

int64_t AdapterPool::live_at(size_t nth) const {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (!entries_[i].removed && nth-- == 0) return static_cast<int64_t>(i);
  return -1;
}

Status AdapterPool::pin(size_t index) {
  if (index == kBase) return Status();
  if (entry(index).removed)
    return Status::usage((is_mix(index) ? "mix '" : "adapter '") + entry(index).name + "' was " +
                         (is_mix(index) ? "released" : "removed"));
  std::lock_guard<std::mutex> lock(pins_lock_);
  pins_[index]++;
  return Status();
}

void AdapterPool::unpin(size_t index) {
  if (index == kBase) return;
  std::lock_guard<std::mutex> lock(pins_lock_);
  auto it = pins_.find(index);
  if (it == pins_.end()) return;
  if (--it->second == 0) {
    pins_.erase(it);
    unpinned_.notify_all();
  }
}

bool AdapterPool::pinned(size_t index) const {
  std::lock_guard<std::mutex> lock(pins_lock_);
  return pins_.count(index) != 0;
}

void AdapterPool::retire(size_t index) { entries_[index].removed = true; }

void AdapterPool::wait_unpinned(size_t index) const {
  std::unique_lock<std::mutex> lock(pins_lock_);
  unpinned_.wait(lock, [&] { return pins_.count(index) == 0; });
}

void AdapterPool::drop(size_t index) {
  if (entries_[index].adapter) evict(index);
}

std::vector<size_t> AdapterPool::arena_sizes() const {
  std::vector<size_t> sizes;
  if (!arena_) return sizes;
  auto spans = arena_->spans(arena_->size());
  for (size_t i = 0; i < spans.size(); ++i) sizes.push_back(spans[i].size());
  return sizes;
}

uint64_t AdapterPool::arena_bytes() const {
  uint64_t sum = arena_ ? arena_->total_bytes() : 0;
  for (const ProgramEntry& p : programs_)
    if (p.own_arena) sum += p.own_arena->total_bytes();
  return sum;
}

uint64_t AdapterPool::accounted_bytes() const {
  uint64_t sum = foundation_bytes_ + arena_bytes();
  for (const ProgramEntry& p : programs_)
    if (p.loaded) sum += p.cost + p.program->variant_bytes();
  for (const Entry& e : entries_)
    if (e.adapter) sum += e.cost;
  for (const auto& [index, mix] : mixes_)
    if (mix.adapter) sum += mix.cost;
  return sum;
}

void AdapterPool::evict(size_t index) {
  entry(index).adapter.reset();  // unmaps its tensors (frees a mix's)
  counters_.evictions++;
  // Hand freed heap pages back to the kernel now, so that the process's PSS
  // follows the accounting.
  malloc_trim(0);
}

uint64_t AdapterPool::incoming_bytes(size_t index) const {
  if (index == kBase) {
    auto program = program_of(kBase);
    if (base_ || !program.ok()) return 0;
    return programs_[program.value()].loaded ? 0 : programs_[program.value()].cost;
  }
  const Entry& e = entry(index);
  if (e.adapter) return 0;
  if (options_.stock) return e.cost;
  return e.cost + (programs_[e.program].loaded ? 0 : programs_[e.program].cost);
}

void AdapterPool::begin_use(size_t index) {
  if (index != kBase) uses_[index]++;
}

void AdapterPool::end_use(size_t index) {
  auto it = uses_.find(index);
  if (it != uses_.end() && --it->second == 0) uses_.erase(it);
}

AdapterPool::Room AdapterPool::room_for(size_t index) const {
  uint64_t incoming = incoming_bytes(index);
  if (options_.budget_bytes == 0 || incoming == 0) return Room::kReady;
  // What no eviction frees, and what only the end of running requests does.
  uint64_t fixed = accounted_bytes(), used = 0;
  // Variants are dropped before any adapter is (make_room).
  for (const ProgramEntry& p : programs_)
    if (p.loaded) fixed -= p.program->variant_bytes();
  auto visit = [&](size_t i, const Entry& e) {
    if (!e.adapter) return;
    fixed -= e.cost;
    if (in_use(i)) used += e.cost;
  };
  for (size_t i = 0; i < entries_.size(); ++i) visit(i, entries_[i]);
  for (const auto& [i, mix] : mixes_) visit(i, mix);
  if (fixed + used + incoming <= options_.budget_bytes) return Room::kReady;
  return fixed + incoming <= options_.budget_bytes ? Room::kWait : Room::kNever;
}

Status AdapterPool::make_room(uint64_t incoming, size_t keep, const std::string& what) {
  if (options_.budget_bytes == 0) return Status();
  // Variants go first: they only make calls faster, and are made again on use.
  if (accounted_bytes() + incoming > options_.budget_bytes)
    for (ProgramEntry& p : programs_)
      if (p.loaded) p.program->drop_variants();
  while (accounted_bytes() + incoming > options_.budget_bytes) {
    size_t lru = kBase;  // none yet
    uint64_t oldest = 0;
    for_each_entry([&](size_t i, const Entry& e) {
      if (e.adapter && i != keep && !in_use(i) && (lru == kBase || e.last_used < oldest)) {
        lru = i;
        oldest = e.last_used;
      }
    });
    if (lru == kBase) {
      // Every resident adapter left is running a request: loading now would
      // overshoot the budget.
      std::string running;
      for_each_entry([&](size_t i, const Entry& e) {
        if (e.adapter && in_use(i)) running += (running.empty() ? "" : ", ") + e.name;
      });
      return Status::usage("the memory budget (" + mib(options_.budget_bytes) + ") cannot hold " + what + " (" +
                           mib(incoming) + ") now: " + mib(accounted_bytes()) + " are accounted" +
                           (running.empty() ? "" : ", adapters running requests included (" + running + ")") +
                           ": retry when they have finished, or raise the budget");
    }
    evict(lru);
  }
  return Status();
}

Status AdapterPool::grow_arena(const std::vector<size_t>& sizes) {
  for_each_entry([&](size_t i, const Entry& e) {
    if (e.adapter) evict(i);
  });
  base_.reset();
  // Their forward methods point into the old arena: open them again on use.
  ++programs_generation_;
  for (ProgramEntry& p : programs_) {
    p.program.reset();
    p.loaded = false;
  }
  std::vector<size_t> want = PlannedArena::largest({arena_sizes(), sizes});
  arena_.reset();
  auto arena = PlannedArena::allocate(want);
  if (!arena.ok()) return arena.status();
  arena_ = std::move(arena.value());
  return Status();
}

Status AdapterPool::ensure_arena(const ProgramEntry& program) {
  if (options_.private_arenas || (arena_ && arena_->holds(program.planned_sizes))) return Status();
  return grow_arena(program.planned_sizes);
}

StatusOr<Adapter*> AdapterPool::acquire(size_t index) {
  if (index == kBase) return acquire_base();
  Entry& entry = this->entry(index);
  entry.last_used = ++clock_;
  if (entry.adapter) {
    counters_.hits++;
    return entry.adapter.get();
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string what = (entry.terms.empty() ? "adapter '" : "mix '") + entry.name + "'";
  if (options_.stock) {
    Status room = make_room(entry.cost, index, what);
    if (!room.ok()) return room;
    auto adapter = load_adapter_per_module(entry.pte, options_.ptd, entry.info, *foundation_);
    if (!adapter.ok()) return adapter.status();
    entry.adapter = std::move(adapter.value());
  } else {
    ProgramEntry& program = programs_[entry.program];
    Status s = ensure_arena(program);
    if (!s.ok()) return s;
    s = make_room(entry.cost + (program.loaded ? 0 : program.cost), index, what);
    if (!s.ok()) return s;
    s = load_program(entry.program);
    if (!s.ok()) return s;
    auto data = entry.terms.empty()
                    ? LoraData::open(entry.pte, entry.info, *foundation_, program.program->lora_shapes())
                    : compose(entry, *program.program);
    if (!data.ok()) return data.status();
    entry.adapter = std::make_unique<SharedAdapter>(entry.pte, program.program.get(), std::move(data.value()),
                                                    ms_since(t0), entry.terms.empty() ? "" : entry.name);
  }
  double ms = ms_since(t0);
  counters_.loads++;
  counters_.last_load_ms = ms;
  counters_.total_load_ms += ms;
  return entry.adapter.get();
}

StatusOr<size_t> AdapterPool::program_of(size_t index) const {
  if (index != kBase) return entry(index).program;
  if (options_.stock)
    return Status::usage(
        "the foundation alone ('base') runs through the program an adapter "
        "carries, which stock loading (a Module per adapter) does not load");
  if (entries_.empty())
    return Status::usage(
        "the foundation alone ('base') runs through the program an adapter "
        "carries: load at least one adapter .pte first");
  return entries_.front().program;
}

StatusOr<Adapter*> AdapterPool::acquire_base() {
  auto index = program_of(kBase);
  if (!index.ok()) return index.status();
  if (base_) {
    counters_.hits++;
    return static_cast<Adapter*>(base_.get());
  }
  ProgramEntry& program = programs_[index.value()];
  Status s = ensure_arena(program);
  if (!s.ok()) return s;
  // No adapter bytes: only the program, if it is not loaded yet.
  s = make_room(program.loaded ? 0 : program.cost, kBase, "the program of 'base'");
  if (!s.ok()) return s;
  s = load_program(index.value());
  if (!s.ok()) return s;
  base_ = std::make_unique<SharedAdapter>(program.pte, program.program.get(), nullptr, 0.0, kBaseName);
  return static_cast<Adapter*>(base_.get());
}

StatusOr<Generation> AdapterPool::generate(size_t index, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                           const Picking& picking, const std::vector<int64_t>& stop_ids,
                                           bool keep_logits, const TokenCallback& on_token,
                                           const std::string& prompt_label) {
  // Checked before loading: a bad request must not evict anything.
  Status s = check(index, prompt, max_new_tokens, prompt_label);
  if (!s.ok()) return s;
  s = pin(index);
  if (!s.ok()) return s;
  struct Unpin {
    AdapterPool* pool;
    size_t index;
    ~Unpin() { pool->unpin(index); }
  } unpin_at_end{this, index};
  auto adapter = acquire(index);
  if (!adapter.ok()) return adapter.status();
  begin_use(index);
  // The positions whose K/V rows the request writes: its prompt, then each
  // token a choice is given but the last (choices start at the prompt's end).
  std::vector<int64_t> delivered;  // per choice
  auto g = lora_share::generate(
      *adapter.value(), prompt, max_new_tokens, picking, keep_logits,
      [&](const TokenInfo& token) {
        if (delivered.size() <= token.choice) delivered.resize(token.choice + 1, 0);
        ++delivered[token.choice];
        return !on_token || on_token(token);
      },
      stop_ids);
  end_use(index);
  if (g.ok()) counters_.prompt_fed += g->prompt_fed;
  // Nothing of it stays for the next request, which starts at position 0 and
  // reads rows past its own, masked (kv_rows.h).
  const int64_t longest = delivered.empty() ? 0 : *std::max_element(delivered.begin(), delivered.end());
  adapter.value()->clear_rows(static_cast<int64_t>(prompt.size()) + longest);
  return g;
}

StatusOr<AdapterPool::Limits> AdapterPool::limits(size_t index) const {
  if (options_.stock && index != kBase) {
    // Stock adapters are never evicted (no budget): the Module is the shape.
    const Adapter* a = entry(index).adapter.get();
    if (a == nullptr) return Status::failure("adapter '" + entry(index).name + "' is not loaded");
    return Limits{a->vocab_size(), a->max_seq_len(), a->prefill_chunk()};
  }
  auto program_index = program_of(index);
  if (!program_index.ok()) return program_index.status();
  const ProgramEntry& p = programs_[program_index.value()];
  return Limits{p.vocab_size, p.max_seq_len, p.prefill_chunk};
}

Status AdapterPool::check(size_t index, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                          const std::string& prompt_label) const {
  auto l = limits(index);
  if (!l.ok()) return l.status();
  return check_request(prompt, max_new_tokens, l->vocab_size, l->max_seq_len, prompt_label);
}

StatusOr<AdapterInfo> AdapterPool::info(size_t index) const {
  auto l = limits(index);
  if (!l.ok()) return l.status();
  AdapterInfo info;
  info.vocab_size = l->vocab_size;
  info.max_seq_len = l->max_seq_len;
  info.prefill_chunk = l->prefill_chunk;
  if (index == kBase) {
    info.name = kBaseName;
    info.pte = programs_[program_of(kBase).value()].pte;
  } else {
    const Entry& e = entry(index);
    info.name = e.name;
    info.pte = e.pte;
    info.load_ms = e.adapter ? e.adapter->load_ms() : 0.0;
  }
  return info;
}

LoadingInfo AdapterPool::loading() const {
  LoadingInfo l;
  l.mode = options_.stock ? "stock" : "shared";
  l.arena = options_.stock ? "module" : options_.private_arenas ? "private" : "shared";
  l.xnnpack = xnnpack_state_;
  l.packed_cache_warm = packed_ && packed_->found_warm();
  l.packed_cache = packed_ ? packed_->path() : "";
  l.planned_bytes = arena_bytes();
  return l;
}

PoolStats AdapterPool::stats() const {
  PoolStats s = counters_;
  s.known = 0;
  for (const Entry& e : entries_) s.known += e.removed ? 0 : 1;
  s.budget_bytes = options_.budget_bytes;
  s.foundation_bytes = foundation_bytes_;
  // Every known program, loaded or not: what a budget must hold to serve any adapter.
  for (const ProgramEntry& p : programs_) s.program_bytes += p.cost;
  // The KV buffer (arena buffer 0) holds `parallel` slots of the largest program's cache.
  for (const ProgramEntry& p : programs_)
    if (!p.planned_sizes.empty())
      s.slot_bytes = std::max<uint64_t>(s.slot_bytes, p.planned_sizes[0] / std::max<size_t>(options_.parallel, 1));
  s.arena_bytes = arena_bytes();
  for (const Entry& e : entries_) {
    if (e.adapter) {
      s.resident++;
      s.resident_adapter_bytes += e.cost;
    }
    if (!e.removed) s.largest_adapter_bytes = std::max(s.largest_adapter_bytes, e.cost);
  }
  // A resident mix is memory the budget counts, not one more adapter known.
  for (const auto& [index, mix] : mixes_)
    if (mix.adapter) s.resident_adapter_bytes += mix.cost;
  return s;
}

VariantStats AdapterPool::variant_stats() const {
  VariantStats sum;
  for (const ProgramEntry& p : programs_) {
    if (!p.loaded || !p.program) continue;
    VariantStats v = p.program->variant_stats();
    sum.made += v.made;
    sum.refused += v.refused;
    sum.failed += v.failed;
    sum.resident += v.resident;
    if (!v.last_error.empty()) sum.last_error = v.last_error;
  }
  return sum;
}

}  // namespace lora_share
