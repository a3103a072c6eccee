#include "session.h"

#include <sys/stat.h>

#include <chrono>
#include <map>

#include "file_check.h"
#include "lora_data.h"
#include "manifest.h"
#include "shared_adapter.h"

namespace lora_share {

Adapter* Session::find(const std::string& name) const {
  if (name == kBaseName) return base.get();
  for (const auto& a : adapters)
    if (a->name() == name) return a.get();
  return nullptr;
}

std::string Session::names() const {
  std::string out;
  for (const auto& a : adapters) out += (out.empty() ? "" : ", ") + a->name();
  return out;
}

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
      .count();
}

Status load_stock_adapters(Session& session, const Options& options,
                           const std::vector<PteInfo>& infos) {
  session.arena = "module";
  for (size_t i = 0; i < options.ptes.size(); ++i) {
    auto adapter = load_stock_adapter(options.ptes[i], options.ptd, infos[i], *session.foundation);
    if (!adapter.ok()) return adapter.status();
    session.adapters.push_back(std::move(adapter.value()));
  }
  return Status();
}

// Opens each distinct program once (by the program_sha256 its adapters'
// records name), so that one arena can be sized to the largest of them, then
// loads each forward method over it (planned_arena.h says why sharing is
// correct) and binds every adapter's LoRA data to its program.
// --private-arenas gives each program its own arena instead.
Status load_shared_adapters(Session& session, const Options& options,
                            const std::vector<PteInfo>& infos) {
  std::map<std::string, size_t> by_sha;
  std::vector<size_t> program_of;
  std::vector<std::vector<size_t>> sizes;
  for (size_t i = 0; i < options.ptes.size(); ++i) {
    const Record& record = infos[i].record;
    // A program without a record (not written by lora-share) is its own.
    std::string key = record.program_sha256.empty() ? "file:" + options.ptes[i]
                                                    : record.program_sha256;
    auto known = by_sha.find(key);
    if (known == by_sha.end()) {
      auto program = std::make_unique<SharedProgram>();
      Status s = program->open(options.ptes[i], record.envelope.size());
      if (!s.ok()) return s;
      sizes.push_back(program->planned_sizes());
      known = by_sha.emplace(key, session.programs.size()).first;
      session.programs.push_back(std::move(program));
    }
    program_of.push_back(known->second);
  }
  session.arena = options.private_arenas ? "private" : "shared";
  for (size_t p = 0; p < session.programs.size(); ++p) {
    if (options.private_arenas || p == 0) {
      auto arena = PlannedArena::allocate(
          options.private_arenas ? sizes[p] : PlannedArena::largest(sizes));
      if (!arena.ok()) return arena.status();
      session.planned_bytes += arena.value()->total_bytes();
      session.arenas.push_back(std::move(arena.value()));
    }
    Status s = session.programs[p]->load_forward(*session.arenas.back(), *session.foundation,
                                                 session.xnnpack.load_options());
    if (!s.ok()) return s;
  }
  std::vector<bool> first(session.programs.size(), true);
  for (size_t i = 0; i < options.ptes.size(); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    SharedProgram* program = session.programs[program_of[i]].get();
    auto data = LoraData::open(options.ptes[i], infos[i], *session.foundation,
                               program->lora_shapes());
    if (!data.ok()) return data.status();
    // The first adapter of a program carries its load (packing the foundation).
    double ms = ms_since(t0) + (first[program_of[i]] ? program->load_ms() : 0.0);
    first[program_of[i]] = false;
    session.adapters.push_back(std::make_unique<SharedAdapter>(
        options.ptes[i], program, std::move(data.value()), ms));
  }
  SharedProgram* first_program = session.programs[program_of[0]].get();
  session.base = std::make_unique<SharedAdapter>(first_program->pte(), first_program, nullptr, 0.0,
                                                 kBaseName);
  return Status();
}

}  // namespace

StatusOr<std::unique_ptr<Session>> load_session(const Options& options) {
  auto t0 = std::chrono::steady_clock::now();
  auto session = std::make_unique<Session>();
  session->ptd = options.ptd;
  session->shared_ptd = options.shared_ptd;
  session->mode = options.stock ? "stock" : "shared";
  bool weight_cache = !(options.stock || options.no_weight_cache);
  // Workspace sharing stays at the backend's default on the stock path, which
  // is meant to measure ExecuTorch as shipped.
  Status s = session->xnnpack.configure(weight_cache,
                                        /*share_workspace=*/!options.stock);
  if (!s.ok()) return s;
  if (!options.packed_cache.empty()) {
    struct stat st;
    session->packed_cache_warm =
        stat(options.packed_cache.c_str(), &st) == 0 && st.st_size > 0;
    s = session->xnnpack.use_packed_cache(options.packed_cache);
    if (!s.ok()) return s;
  }
  session->xnnpack_state = session->xnnpack.read_state();

  // Our own checks first: a corrupt file or a mismatched pair is refused
  // before ExecuTorch reads anything from it.
  // Without --ptd every program must be self-contained; a lora-share adapter
  // never is, so it is refused here with the fix rather than failing to load.
  // (parse_flags refuses --shared-ptd without --ptd.)
  bool has_ptd = !options.ptd.empty();
  auto files = has_ptd ? check_data_files(options.ptd, options.shared_ptd)
                       : StatusOr<DataFiles>(DataFiles());
  if (!files.ok()) return files.status();
  if (has_ptd && !options.ignore_eos) {
    const Record& record = files->foundation.record;
    auto eos = read_eos_ids(options.ptd, record.present ? record.fingerprint : "");
    if (!eos.ok()) return eos.status();
    session->eos_ids = std::move(eos.value());
  }
  std::vector<PteInfo> infos;
  for (const std::string& pte : options.ptes) {
    auto pte_info = check_pte(pte, "--pte");
    if (!pte_info.ok()) return pte_info.status();
    if (!has_ptd && needs_data_file(pte_info.value()))
      return Status::usage("--pte " + pte + " is a lora-share adapter for "
                           "foundation " + pte_info->record.fingerprint +
                           ": give its foundation.ptd with --ptd");
    if (has_ptd) {
      s = check_pair(pte, pte_info.value(), files.value(),
                     /*verify=*/!options.no_verify);
      if (!s.ok()) return s;
    }
    infos.push_back(std::move(pte_info.value()));
  }
  // The stock path's Modules open foundation.ptd themselves; the runner
  // itself reads only hoisted LoRA tensors there, from adapters_shared.ptd.
  auto foundation = options.stock ? Foundation::open_shared(options.shared_ptd)
                    : has_ptd     ? Foundation::open(options.ptd, options.shared_ptd)
                                  : StatusOr<std::unique_ptr<Foundation>>(Foundation::none());
  if (!foundation.ok()) return foundation.status();
  session->foundation = std::move(foundation.value());
  s = options.stock ? load_stock_adapters(*session, options, infos)
                    : load_shared_adapters(*session, options, infos);
  if (!s.ok()) return s;
  if (!options.packed_cache.empty()) {
    s = session->xnnpack.save_packed_cache();
    if (!s.ok()) return s;
  }
  session->load_ms = std::chrono::duration<double, std::milli>(
                         std::chrono::steady_clock::now() - t0)
                         .count();
  session->after_load = read_memory_stats();
  return session;
}

}  // namespace lora_share
