#include "adapter_on_foundation.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include "et_platform.h"
#include "file_check.h"
#include "file_stem.h"
#include "forward_io.h"
#include "kv_rows.h"

namespace lora_share {
namespace {

using executorch::extension::MmapDataLoader;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::LoadBackendOptionsMap;
using executorch::runtime::Method;
using executorch::runtime::Program;
using executorch::runtime::Result;
using executorch::runtime::Span;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StatusOr<std::vector<size_t>> planned_buffer_sizes(const Program& program, const char* method_name) {
  auto meta = program.method_meta(method_name);
  if (!meta.ok()) return Status::failure(std::string("the program has no method '") + method_name + "'");
  std::vector<size_t> sizes;
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    int64_t size = meta->memory_planned_buffer_size(i).get();
    sizes.push_back(size > 0 ? static_cast<size_t>(size) : 0);
  }
  return sizes;
}

MethodMemory::MethodMemory(Span<Span<uint8_t>> planned_buffers)
    : planned(planned_buffers), manager(&method_allocator, &planned, &temp_allocator) {}

Status SharedProgram::open(const std::string& pte, size_t lora_slots, size_t kv_slots, bool drafts) {
  auto t0 = std::chrono::steady_clock::now();
  pte_path_ = pte;
  Status readable = check_readable_file(pte, "--pte");
  if (!readable.ok()) return readable;
  set_phase("opening " + pte);

  Result<MmapDataLoader> loader = MmapDataLoader::from(pte.c_str(), MmapDataLoader::MlockConfig::NoMlock);
  if (!loader.ok()) return Status::failure("--pte " + pte + ": could not map the file");
  loader_ = std::make_unique<MmapDataLoader>(std::move(loader.get()));

  // InternalConsistency runs flatbuffers' verifier over the whole program.
  Result<Program> program = Program::load(loader_.get(), Program::Verification::InternalConsistency);
  if (!program.ok())
    return Status::failure("--pte " + pte +
                           ": not an ExecuTorch program (.pte) this runtime "
                           "can read (" +
                           executorch::runtime::to_string(program.error()) + ")");
  program_ = std::make_unique<Program>(std::move(program.get()));

  auto vocab = run_constant_method("get_vocab_size");
  if (!vocab.ok()) return vocab.status();
  auto max_seq_len = run_constant_method("get_max_seq_len");
  if (!max_seq_len.ok()) return max_seq_len.status();
  vocab_size_ = vocab.value();
  max_seq_len_ = max_seq_len.value();
  if (!program_->method_meta("get_prefill_chunk").ok()) return pre_chunk_program(pte);
  auto chunk = run_constant_method("get_prefill_chunk");
  if (!chunk.ok()) return chunk.status();
  prefill_chunk_ = chunk.value();
  auto sizes = planned_buffer_sizes(*program_, "forward");
  if (!sizes.ok()) return Status::failure(pte + ": " + sizes.status().message());
  // Programs exported before decode existed have forward alone.
  has_decode_ = program_->method_meta("decode").ok();
  // decode_batch (EXPORTER_REVISION 11) for a runtime with several slots, or
  // with one slot that verifies drafts in it: its activations are planned for
  // its most rows x tokens, which one slot never fills, so without drafts (its
  // tokens [rows, 1] before revision 14, or speculation off) one slot leaves it.
  auto batch = program_->method_meta("decode_batch");
  file_has_batch_ = batch.ok();
  bool batch_drafts = false;
  if (file_has_batch_) {
    auto tokens = batch->input_tensor_meta(0);
    batch_drafts = tokens.ok() && tokens->sizes().size() == 2 && tokens->sizes()[1] > 1;
  }
  has_batch_ = file_has_batch_ && (kv_slots > 1 || (drafts && batch_drafts));
  for (auto [method, wanted] : {std::pair<const char*, bool>{"decode", has_decode_}, {"decode_batch", has_batch_}}) {
    if (!wanted) continue;
    auto more = planned_buffer_sizes(*program_, method);
    if (!more.ok()) return Status::failure(pte + ": " + more.status().message());
    if (more->size() > sizes->size()) sizes->resize(more->size(), 0);
    for (size_t i = 0; i < more->size(); ++i) (*sizes)[i] = std::max((*sizes)[i], (*more)[i]);
  }
  auto forward = program_->method_meta("forward");
  if (!forward.ok()) return Status::failure(pte + ": the program has no method 'forward'");
  auto shapes = read_lora_shapes(forward.get(), lora_slots, pte);
  if (!shapes.ok()) return shapes.status();
  lora_shapes_ = std::move(shapes.value());
  zeros_.assign(zero_floats_needed(lora_shapes_), 0.0f);
  // The positions a ring holds (forward_io.h): only programs whose sliding layers keep rings have
  // get_ring_size, or (exporter revision 13 and earlier, no spare slots) get_sliding_window alone.
  int64_t ring = 0;
  for (const char* method : {"get_ring_size", "get_sliding_window"}) {
    if (!program_->method_meta(method).ok()) continue;
    auto size = run_constant_method(method);
    if (!size.ok()) return size.status();
    ring = size.value();
    break;
  }
  auto layout = read_kv_layout(forward.get(), max_seq_len_, ring, 2 * lora_slots, pte);
  if (!layout.ok()) return layout.status();
  kv_.layout = layout.value();
  kv_.pool_slots = std::max<size_t>(kv_slots, 1);
  planned_sizes_ = {kv_.pool_slots * kv_.layout.bytes()};
  planned_sizes_.insert(planned_sizes_.end(), sizes->begin(), sizes->end());
  load_ms_ += ms_since(t0);
  return Status();
}

Status SharedProgram::load_methods(PlannedArena& arena, const Foundation& foundation,
                                   const LoadBackendOptionsMap* backend_options) {
  auto t0 = std::chrono::steady_clock::now();
  set_phase("loading " + pte_path_ + " against " + describe_data_files(foundation.path(), foundation.shared_path()) +
            " (do they come from the same export?)");
  if (!arena.holds(planned_sizes_)) return Status::failure(pte_path_ + ": its planned memory does not fit the arena");
  memory_ = std::make_unique<MethodMemory>(arena.spans(planned_sizes_.size() - 1, /*first=*/1));
  decode_memory_ = std::make_unique<MethodMemory>(arena.spans(planned_sizes_.size() - 1, /*first=*/1));
  batch_memory_ = std::make_unique<MethodMemory>(arena.spans(planned_sizes_.size() - 1, /*first=*/1));
  kv_.data = reinterpret_cast<uint8_t*>(arena.buffer(0).data());
  // No foundation (no --ptd): the program's own named data is all there is.
  if (foundation.data_map() != nullptr) data_map_ = std::make_unique<KeyRecordingDataMap>(foundation.data_map());
  variants_.clear();
  variant_context_ = {loader_.get(), &arena, planned_sizes_.size() - 1, data_map_.get(), backend_options};
  clear_last_runtime_error();
  Result<Method> method = program_->load_method("forward", &memory_->manager,
                                                /*event_tracer=*/nullptr, data_map_.get(), backend_options);
  if (!method.ok()) return explain_load_failure(method.error(), foundation);
  forward_ = std::make_unique<Method>(std::move(method.get()));
  if (has_decode_) {
    // Its weights are forward's (the same foundation keys): XNNPACK's weight
    // cache packs each once for both methods.
    Result<Method> decode = program_->load_method("decode", &decode_memory_->manager,
                                                  /*event_tracer=*/nullptr, data_map_.get(), backend_options);
    if (!decode.ok()) return explain_load_failure(decode.error(), foundation);
    decode_ = std::make_unique<Method>(std::move(decode.get()));
  }
  if (has_batch_) {
    Result<Method> batch = program_->load_method("decode_batch", &batch_memory_->manager,
                                                 /*event_tracer=*/nullptr, data_map_.get(), backend_options);
    if (!batch.ok()) return explain_load_failure(batch.error(), foundation);
    batch_ = std::make_unique<Method>(std::move(batch.get()));
  }
  load_ms_ += ms_since(t0);
  set_phase("running " + pte_path_);
  return Status();
}

StatusOr<int64_t> SharedProgram::run_constant_method(const char* method_name) {
  std::string what = pte_path_ + ": " + method_name + "()";
  // A constant method's planned memory is its own, for this one call.
  auto sizes = planned_buffer_sizes(*program_, method_name);
  if (!sizes.ok())
    return Status::failure(pte_path_ + ": " + sizes.status().message() + " (the export contract requires it)");
  auto arena = PlannedArena::allocate(sizes.value());
  if (!arena.ok()) return arena.status();
  MethodMemory memory(arena.value()->spans(sizes->size()));
  Result<Method> method = program_->load_method(method_name, &memory.manager);
  if (!method.ok())
    return Status::failure(what + " could not be loaded (" + executorch::runtime::to_string(method.error()) + ")");
  Error err = method->execute();
  if (err != Error::Ok || method->outputs_size() != 1) return Status::failure(what + " failed to run");
  return int_from_output(method->get_output(0), what);
}

// Turns a failed forward load into the most useful message we can give.
Status SharedProgram::explain_load_failure(Error error, const Foundation& foundation) {
  // Keys found in the adapter's own data are not missing: the runtime looks
  // every key up in the foundation first and falls back to the .pte.
  std::set<std::string> own_keys;
  if (auto own = program_->get_named_data_map(); own.ok()) {
    uint32_t n = own.get()->get_num_keys().get();
    for (uint32_t i = 0; i < n; ++i) {
      auto key = own.get()->get_key(i);
      if (key.ok()) own_keys.insert(key.get());
    }
  }
  std::vector<std::string> missing;
  if (data_map_)
    for (const std::string& key : data_map_->missing_keys())
      if (!own_keys.count(key)) missing.push_back(key);

  // check_pair finds the keys a program needs before loading; this is for a
  // lookup it does not model. No records here to tell hoisted tensors from
  // other foundations, so both are named.
  if (!missing.empty())
    return Status::failure(missing_keys_message(pte_path_, foundation.path(), foundation.shared_path(), missing,
                                                /*built_for_foundation=*/false));
  std::string detail = last_runtime_error();
  std::string hint = error == Error::InvalidExternalData
                         ? ": the foundation's tensors do not match what the adapter expects "
                           "(different shapes or dtypes); was it exported against this "
                           "foundation?"
                         : "";
  return Status::failure(
      "could not load " + pte_path_ +
      (foundation.path().empty() ? " without --ptd"
                                 : " against " + describe_data_files(foundation.path(), foundation.shared_path())) +
      " (" + executorch::runtime::to_string(error) + (detail.empty() ? "" : ": " + detail) + ")" + hint);
}

Status SharedProgram::step(const std::vector<executorch::extension::TensorPtr>& lora, const SlotMask& absent,
                           const std::vector<int64_t>& tokens, int64_t pos, std::vector<float>* logits,
                           const std::string& adapter_pte) {
  return step_in(kv_, lora, absent, tokens, pos, logits, adapter_pte);
}

Status SharedProgram::step_in(const KvCache& cache, const std::vector<executorch::extension::TensorPtr>& lora,
                              const SlotMask& absent, const std::vector<int64_t>& tokens, int64_t pos,
                              std::vector<float>* logits, const std::string& what) {
  bool one = tokens.size() == 1 && decode_;
  Method& method = pick(one ? MethodKind::kDecode : MethodKind::kForward, absent);
  std::string call = what + (one ? ": decode" : ": forward");
  return run_forward(
      [this, &method, &call](const std::vector<EValue>& inputs) { return execute(method, inputs, call); }, cache, lora,
      tokens, pos, vocab_size_, call, logits);
}

StatusOr<std::vector<EValue>> SharedProgram::run_batch(const std::vector<EValue>& inputs, const SlotMask& absent) {
  if (!batch_) return Status::failure(pte_path_ + ": decode_batch is not loaded");
  return execute(pick(MethodKind::kBatch, absent), inputs, pte_path_ + ": decode_batch");
}

Method& SharedProgram::pick(MethodKind kind, const SlotMask& absent) {
  Method& whole = kind == MethodKind::kBatch ? *batch_ : kind == MethodKind::kDecode ? *decode_ : *forward_;
  Method* variant = variants_.method(kind, variants_.skippable(absent), variant_context_);
  return variant != nullptr ? *variant : whole;
}

executorch::runtime::MethodMeta SharedProgram::batch_meta() const {
  return program_->method_meta("decode_batch").get();
}

SharedAdapter::SharedAdapter(const std::string& pte, SharedProgram* program, std::unique_ptr<LoraData> data,
                             double load_ms, const std::string& name)
    : program_(program), data_(std::move(data)) {
  name_ = name.empty() ? file_stem(pte) : name;
  pte_path_ = pte;
  vocab_size_ = program->vocab_size();
  max_seq_len_ = program->max_seq_len();
  prefill_chunk_ = program->prefill_chunk();
  ring_cache_ = program->kv().layout.ring > 0;
  load_ms_ = load_ms;
  lora_ = lora_input_tensors(data_.get(), program->lora_shapes(), program->zeros());
  absent_ = absent_slots(data_.get(), program->lora_shapes().size());
}

Status SharedAdapter::step(const std::vector<int64_t>& tokens, int64_t pos, std::vector<float>* logits) {
  return program_->step(lora_, absent_, tokens, pos, logits, pte_path_);
}

void SharedAdapter::clear_rows(int64_t positions) {
  if (program_->kv().data != nullptr) lora_share::clear_rows(program_->kv(), 0, positions);
}

StatusOr<std::vector<EValue>> SharedProgram::execute(Method& method, const std::vector<EValue>& inputs,
                                                     const std::string& what) {
  if (method.set_inputs(executorch::aten::ArrayRef<EValue>(inputs.data(), inputs.size())) != Error::Ok)
    return Status::failure(what + " rejected its inputs (" + last_runtime_error() + ")");
  Error err = method.execute();
  if (err != Error::Ok)
    return Status::failure(what + " failed (" + executorch::runtime::to_string(err) + ": " + last_runtime_error() +
                           ")");
  std::vector<EValue> outputs(method.outputs_size());
  if (method.get_outputs(outputs.data(), outputs.size()) != Error::Ok)
    return Status::failure(what + ": its outputs could not be read");
  return outputs;
}

}  // namespace lora_share
