#include "session.h"

#include <sys/stat.h>

#include <chrono>

#include "file_check.h"

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
  for (const std::string& pte : options.ptes) {
    auto adapter =
        options.stock
            ? load_stock_adapter(pte, options.ptd, options.shared_ptd)
            : load_shared_adapter(pte, *session->foundation,
                                  session->xnnpack.load_options());
    if (!adapter.ok()) return adapter.status();
    session->adapters.push_back(std::move(adapter.value()));
  }
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
