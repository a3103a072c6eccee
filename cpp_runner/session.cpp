#include "session.h"

#include <sys/stat.h>

#include <chrono>

#include "file_check.h"
#include "shared_adapter.h"

namespace lora_share {

Adapter* Session::find(const std::string& name) const {
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

Status load_stock_adapters(Session& session, const Options& options) {
  session.arena = "module";
  for (const std::string& pte : options.ptes) {
    auto adapter = load_stock_adapter(pte, options.ptd, options.shared_ptd);
    if (!adapter.ok()) return adapter.status();
    session.adapters.push_back(std::move(adapter.value()));
  }
  return Status();
}

// Opens every program first, so that one arena can be sized to the largest
// of them, then loads each forward method over it (planned_arena.h says why
// sharing is correct). --private-arenas gives each program its own instead.
Status load_shared_adapters(Session& session, const Options& options) {
  std::vector<std::unique_ptr<SharedAdapter>> programs;
  std::vector<std::vector<size_t>> sizes;
  for (const std::string& pte : options.ptes) {
    auto program = std::make_unique<SharedAdapter>();
    Status s = program->open(pte);
    if (!s.ok()) return s;
    sizes.push_back(program->planned_sizes());
    programs.push_back(std::move(program));
  }
  session.arena = options.private_arenas ? "private" : "shared";
  for (size_t i = 0; i < programs.size(); ++i) {
    if (options.private_arenas || i == 0) {
      auto arena = PlannedArena::allocate(
          options.private_arenas ? sizes[i] : PlannedArena::largest(sizes));
      if (!arena.ok()) return arena.status();
      session.planned_bytes += arena.value()->total_bytes();
      session.arenas.push_back(std::move(arena.value()));
    }
    Status s = programs[i]->load_forward(*session.arenas.back(), *session.foundation,
                                         session.xnnpack.load_options());
    if (!s.ok()) return s;
    session.adapters.push_back(std::move(programs[i]));
  }
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
  for (const std::string& pte : options.ptes) {
    auto pte_info = check_pte(pte, "--pte");
    if (!pte_info.ok()) return pte_info.status();
    if (!has_ptd && pte_info->record.present)
      return Status::usage("--pte " + pte + " is a lora-share adapter for "
                           "foundation " + pte_info->record.fingerprint +
                           ": give its foundation.ptd with --ptd");
    if (has_ptd) {
      s = check_pair(pte, pte_info.value(), files.value(),
                     /*verify=*/!options.no_verify);
      if (!s.ok()) return s;
    }
  }
  if (!options.stock) {
    auto foundation =
        has_ptd ? Foundation::open(options.ptd, options.shared_ptd)
                : StatusOr<std::unique_ptr<Foundation>>(Foundation::none());
    if (!foundation.ok()) return foundation.status();
    session->foundation = std::move(foundation.value());
  }
  s = options.stock ? load_stock_adapters(*session, options)
                    : load_shared_adapters(*session, options);
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
