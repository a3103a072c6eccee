// The stock loading path, kept for comparison: one
// executorch::extension::Module per adapter, each opening the foundation
// itself, as ExecuTorch's LLM runner does. AdapterPool turns the XNNPACK weight
// cache off for this path, so every adapter packs its own copy of the
// foundation's delegated weights. The KV cache is the adapter's own vector
// (forward_io.h); the Module keeps forward's planned memory to itself. Its
// LoRA inputs are its own mapped tensors (lora_data.h), as on the shared path.
// It runs forward alone, decode included: without the weight cache a decode
// method would pack the foundation a second time.
#include <executorch/extension/module/module.h>

#include <chrono>

#include "adapter.h"
#include "et_platform.h"
#include "file_stem.h"
#include "forward_io.h"
#include "kv_rows.h"
#include "lora_data.h"

namespace lora_share {
namespace {

using executorch::extension::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

class StockAdapter final : public Adapter {
 public:
  // `ptd` "" = a self-contained program.
  Status load(const std::string& pte, const std::string& ptd, const PteInfo& info, const Foundation& files);
  Status step(const std::vector<int64_t>& tokens, int64_t pos, std::vector<float>* logits) override;
  void clear_rows(int64_t positions) override { lora_share::clear_rows(kv_, 0, positions); }

 private:
  StatusOr<int64_t> run_constant_method(const char* method_name);
  Status allocate_kv_cache();
  StatusOr<std::vector<EValue>> execute_forward(const std::vector<EValue>& inputs);

  std::unique_ptr<Module> module_;
  std::vector<uint8_t> kv_storage_;
  KvCache kv_;  // over kv_storage_
  std::unique_ptr<LoraData> lora_data_;
  std::vector<float> zeros_;
  std::vector<executorch::extension::TensorPtr> lora_;  // over lora_data_ and zeros_
};

Status StockAdapter::load(const std::string& pte, const std::string& ptd, const PteInfo& info,
                          const Foundation& files) {
  auto t0 = std::chrono::steady_clock::now();
  name_ = file_stem(pte);
  pte_path_ = pte;
  Status readable = check_readable_file(pte, "--pte");
  if (!readable.ok()) return readable;
  // The program reads nothing from adapters_shared.ptd (LoRA tensors are
  // inputs, read below), so the Module opens foundation.ptd alone.
  std::vector<std::string> data_files;
  if (!ptd.empty()) data_files.push_back(ptd);
  std::string against = describe_data_files(ptd, "");
  set_phase("loading " + pte + " against " + against + " (do they come from the same export?)");
  // MmapUseMlockIgnoreErrors is the LLM runner's default load mode.
  // No --ptd: a self-contained program, opened as Module(pte). Each Module
  // maps the file itself (this path shares nothing between adapters, as
  // stock ExecuTorch does not).
  module_ = data_files.empty() ? std::make_unique<Module>(pte, Module::LoadMode::MmapUseMlockIgnoreErrors)
                               : std::make_unique<Module>(pte, data_files, Module::LoadMode::MmapUseMlockIgnoreErrors);
  clear_last_runtime_error();
  Error err = module_->load_method("forward");
  if (err != Error::Ok) {
    std::string detail = last_runtime_error();
    return Status::failure("could not load " + pte + " against " + against + " (" +
                           executorch::runtime::to_string(err) + (detail.empty() ? "" : ": " + detail) + ")");
  }
  auto vocab = run_constant_method("get_vocab_size");
  if (!vocab.ok()) return vocab.status();
  auto max_seq_len = run_constant_method("get_max_seq_len");
  if (!max_seq_len.ok()) return max_seq_len.status();
  vocab_size_ = vocab.value();
  max_seq_len_ = max_seq_len.value();
  auto methods = module_->method_names();
  if (!methods.ok() || !methods->count("get_prefill_chunk")) return pre_chunk_program(pte);
  auto chunk = run_constant_method("get_prefill_chunk");
  if (!chunk.ok()) return chunk.status();
  prefill_chunk_ = chunk.value();
  auto meta = module_->method_meta("forward");
  if (!meta.ok()) return Status::failure(pte + ": the program has no method 'forward'");
  auto shapes = read_lora_shapes(meta.get(), info.record.envelope.size(), pte);
  if (!shapes.ok()) return shapes.status();
  auto data = LoraData::open(pte, info, files, shapes.value());
  if (!data.ok()) return data.status();
  lora_data_ = std::move(data.value());
  zeros_.assign(zero_floats_needed(shapes.value()), 0.0f);
  lora_ = lora_input_tensors(lora_data_.get(), shapes.value(), zeros_.data());
  Status kv = allocate_kv_cache();
  if (!kv.ok()) return kv;
  load_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  set_phase("running " + pte);
  return Status();
}

StatusOr<int64_t> StockAdapter::run_constant_method(const char* method_name) {
  std::string what = pte_path_ + ": " + method_name + "()";
  auto out = module_->execute(method_name);
  if (!out.ok() || out->size() != 1)
    return Status::failure(what +
                           " failed to run (the export contract "
                           "requires it)");
  return int_from_output(out.get()[0], what);
}

// A zeroed cache laid out as forward's meta declares.
Status StockAdapter::allocate_kv_cache() {
  auto meta = module_->method_meta("forward");
  if (!meta.ok()) return Status::failure(pte_path_ + ": the program has no method 'forward'");
  // The positions a ring holds (forward_io.h): get_ring_size, or (exporter revision 13 and earlier)
  // get_sliding_window; only programs whose sliding layers keep rings have them.
  int64_t ring = 0;
  auto methods = module_->method_names();
  for (const char* method : {"get_ring_size", "get_sliding_window"}) {
    if (!methods.ok() || !methods->count(method)) continue;
    auto size = run_constant_method(method);
    if (!size.ok()) return size.status();
    ring = size.value();
    break;
  }
  auto layout = read_kv_layout(meta.get(), max_seq_len_, ring, lora_.size(), pte_path_);
  if (!layout.ok()) return layout.status();
  kv_.layout = layout.value();
  ring_cache_ = ring > 0;
  kv_storage_.assign(kv_.layout.bytes(), 0);
  kv_.data = kv_storage_.data();
  return Status();
}

Status StockAdapter::step(const std::vector<int64_t>& tokens, int64_t pos, std::vector<float>* logits) {
  return run_forward([this](const std::vector<EValue>& inputs) { return execute_forward(inputs); }, kv_, lora_, tokens,
                     pos, vocab_size_, pte_path_ + ": forward", logits);
}

StatusOr<std::vector<EValue>> StockAdapter::execute_forward(const std::vector<EValue>& inputs) {
  auto out = module_->execute("forward", inputs);
  if (!out.ok())
    return Status::failure(pte_path_ + ": forward failed (" + executorch::runtime::to_string(out.error()) + ": " +
                           last_runtime_error() + ")");
  return std::move(out.get());
}

}  // namespace

StatusOr<std::unique_ptr<Adapter>> load_adapter_per_module(const std::string& pte, const std::string& ptd,
                                                           const PteInfo& info, const Foundation& files) {
  if (!ptd.empty()) {
    Status readable = check_readable_file(ptd, "--ptd");
    if (!readable.ok()) return readable;
  }
  auto adapter = std::make_unique<StockAdapter>();
  Status s = adapter->load(pte, ptd, info, files);
  if (!s.ok()) return s;
  return std::unique_ptr<Adapter>(std::move(adapter));
}

}  // namespace lora_share
