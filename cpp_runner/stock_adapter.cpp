// The stock loading path, kept for comparison: one
// executorch::extension::Module per adapter, each opening the foundation
// itself, as ExecuTorch's LLM runner does. main() turns the XNNPACK weight
// cache off for this path, so every adapter packs its own copy of the
// foundation's delegated weights.
#include <executorch/extension/module/module.h>

#include <chrono>

#include "adapter.h"
#include "forward_io.h"
#include "et_platform.h"
#include "file_stem.h"

namespace lora_share {
namespace {

using executorch::extension::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

class StockAdapter final : public Adapter {
 public:
  // `ptd` "" = a self-contained program; `shared_ptd` "" = none.
  Status load(const std::string& pte, const std::string& ptd,
              const std::string& shared_ptd);
  Status step(const std::vector<int64_t>& tokens, int64_t pos,
              std::vector<float>* logits) override;

 private:
  StatusOr<int64_t> run_constant_method(const char* method_name);
  std::unique_ptr<Module> module_;
};

Status StockAdapter::load(const std::string& pte, const std::string& ptd,
                          const std::string& shared_ptd) {
  auto t0 = std::chrono::steady_clock::now();
  name_ = file_stem(pte);
  pte_path_ = pte;
  Status readable = check_readable_file(pte, "--pte");
  if (!readable.ok()) return readable;
  std::vector<std::string> data_files;
  for (const std::string& f : {ptd, shared_ptd})
    if (!f.empty()) data_files.push_back(f);
  std::string against = describe_data_files(ptd, shared_ptd);
  set_phase("loading " + pte + " against " + against +
            " (do they come from the same export?)");
  // MmapUseMlockIgnoreErrors is the LLM runner's default load mode.
  // No --ptd: a self-contained program, opened as Module(pte). With several
  // files, Module merges their maps itself (per adapter: this path shares
  // nothing between adapters, as stock ExecuTorch does not).
  module_ = data_files.empty()
                ? std::make_unique<Module>(
                      pte, Module::LoadMode::MmapUseMlockIgnoreErrors)
                : std::make_unique<Module>(
                      pte, data_files,
                      Module::LoadMode::MmapUseMlockIgnoreErrors);
  clear_last_runtime_error();
  Error err = module_->load_method("forward");
  if (err != Error::Ok) {
    std::string detail = last_runtime_error();
    return Status::failure("could not load " + pte + " against " + against + " (" +
                           executorch::runtime::to_string(err) +
                           (detail.empty() ? "" : ": " + detail) + ")");
  }
  auto vocab = run_constant_method("get_vocab_size");
  if (!vocab.ok()) return vocab.status();
  auto max_seq_len = run_constant_method("get_max_seq_len");
  if (!max_seq_len.ok()) return max_seq_len.status();
  vocab_size_ = vocab.value();
  max_seq_len_ = max_seq_len.value();
  auto methods = module_->method_names();
  if (!methods.ok() || !methods->count("get_prefill_chunk"))
    return pre_chunk_program(pte);
  auto chunk = run_constant_method("get_prefill_chunk");
  if (!chunk.ok()) return chunk.status();
  prefill_chunk_ = chunk.value();
  load_ms_ = std::chrono::duration<double, std::milli>(
                 std::chrono::steady_clock::now() - t0)
                 .count();
  set_phase("running " + pte);
  return Status();
}

StatusOr<int64_t> StockAdapter::run_constant_method(const char* method_name) {
  std::string what = pte_path_ + ": " + method_name + "()";
  auto out = module_->execute(method_name);
  if (!out.ok() || out->size() != 1)
    return Status::failure(what + " failed to run (the export contract "
                           "requires it)");
  return int_from_output(out.get()[0], what);
}

Status StockAdapter::step(const std::vector<int64_t>& tokens, int64_t pos,
                          std::vector<float>* logits) {
  ForwardInputs in(tokens, pos);
  std::string what = pte_path_ + ": forward";
  auto out = module_->execute(
      "forward", std::vector<EValue>{EValue(*in.tokens), EValue(*in.cache_positions)});
  if (!out.ok())
    return Status::failure(what + " failed (" +
                           executorch::runtime::to_string(out.error()) + ": " +
                           last_runtime_error() + ")");
  if (out->empty()) return Status::failure(what + " returned nothing");
  return logits_from_output(out.get()[0], vocab_size_, what, logits);
}

}  // namespace

StatusOr<std::unique_ptr<Adapter>> load_stock_adapter(
    const std::string& pte, const std::string& ptd,
    const std::string& shared_ptd) {
  const std::pair<std::string, const char*> files[] = {
      {ptd, "--ptd"}, {shared_ptd, "--shared-ptd"}};
  for (const auto& [path, flag] : files) {
    if (path.empty()) continue;
    Status readable = check_readable_file(path, flag);
    if (!readable.ok()) return readable;
  }
  auto adapter = std::make_unique<StockAdapter>();
  Status s = adapter->load(pte, ptd, shared_ptd);
  if (!s.ok()) return s;
  return std::unique_ptr<Adapter>(std::move(adapter));
}

}  // namespace lora_share
