// The shared loading path: each adapter program is loaded by hand (Program +
// Method) so that all of them resolve their external weights against the ONE
// foundation map opened in main, and so that their planned memory (the KV
// cache) is allocated here, zero-initialised and lazily backed by the kernel.
#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>

#include <chrono>
#include <cstdlib>
#include <set>

#include "adapter.h"
#include "forward_io.h"
#include "et_platform.h"
#include "file_check.h"
#include "flags.h"

namespace lora_share {
namespace {

using executorch::extension::MallocMemoryAllocator;
using executorch::extension::MmapDataLoader;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::LoadBackendOptionsMap;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::Program;
using executorch::runtime::Result;
using executorch::runtime::Span;

// Memory for one loaded method: its allocators and its planned buffers.
// calloc gives zeroed memory that the kernel only backs once touched, so a
// long max_seq_len costs address space, not RSS, until positions are used.
struct MethodMemory {
  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  MallocMemoryAllocator method_allocator;
  MallocMemoryAllocator temp_allocator;
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> buffers;
  std::vector<Span<uint8_t>> spans;
  std::unique_ptr<HierarchicalAllocator> planned;
  std::unique_ptr<MemoryManager> manager;

  Status allocate(const Program& program, const char* method_name) {
    auto meta = program.method_meta(method_name);
    if (!meta.ok())
      return Status::failure(std::string("the program has no method '") +
                             method_name + "'");
    for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
      int64_t size = meta->memory_planned_buffer_size(i).get();
      auto* p = static_cast<uint8_t*>(std::calloc(size > 0 ? size : 1, 1));
      if (p == nullptr)
        return Status::failure("out of memory allocating " +
                               std::to_string(size) + " bytes of planned memory");
      buffers.emplace_back(p);
      spans.emplace_back(p, static_cast<size_t>(size));
    }
    planned = std::make_unique<HierarchicalAllocator>(
        Span<Span<uint8_t>>(spans.data(), spans.size()));
    manager = std::make_unique<MemoryManager>(&method_allocator, planned.get(),
                                              &temp_allocator);
    return Status();
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - t0)
      .count();
}

class SharedAdapter final : public Adapter {
 public:
  Status load(const std::string& pte, const Foundation& foundation,
              const LoadBackendOptionsMap* backend_options);

  Status step(const std::vector<int64_t>& tokens, int64_t pos,
              std::vector<float>* logits) override;

 private:
  StatusOr<int64_t> run_constant_method(const char* method_name);
  Status explain_load_failure(Error error, const Foundation& foundation);

  // Declaration order is destruction order in reverse: the method goes
  // first, then its memory, then the program, then the file mapping.
  std::unique_ptr<MmapDataLoader> loader_;
  std::unique_ptr<Program> program_;
  std::unique_ptr<KeyRecordingDataMap> data_map_;
  MethodMemory memory_;
  std::unique_ptr<Method> forward_;
};

Status SharedAdapter::load(const std::string& pte, const Foundation& foundation,
                           const LoadBackendOptionsMap* backend_options) {
  auto t0 = std::chrono::steady_clock::now();
  name_ = adapter_name_of(pte);
  pte_path_ = pte;
  Status readable = check_readable_file(pte, "--pte");
  if (!readable.ok()) return readable;
  set_phase("loading " + pte + " against " +
            describe_data_files(foundation.path(), foundation.shared_path()) +
            " (do they come from the same export?)");

  Result<MmapDataLoader> loader =
      MmapDataLoader::from(pte.c_str(), MmapDataLoader::MlockConfig::NoMlock);
  if (!loader.ok()) return Status::failure("--pte " + pte + ": could not map the file");
  loader_ = std::make_unique<MmapDataLoader>(std::move(loader.get()));

  // InternalConsistency runs flatbuffers' verifier over the whole program.
  Result<Program> program =
      Program::load(loader_.get(), Program::Verification::InternalConsistency);
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

  Status mem = memory_.allocate(*program_, "forward");
  if (!mem.ok()) return Status::failure(pte + ": " + mem.message());
  // No foundation (no --ptd): the program's own named data is all there is.
  if (foundation.data_map() != nullptr)
    data_map_ = std::make_unique<KeyRecordingDataMap>(foundation.data_map());
  clear_last_runtime_error();
  Result<Method> method =
      program_->load_method("forward", memory_.manager.get(),
                            /*event_tracer=*/nullptr, data_map_.get(),
                            backend_options);
  if (!method.ok()) return explain_load_failure(method.error(), foundation);
  forward_ = std::make_unique<Method>(std::move(method.get()));
  load_ms_ = ms_since(t0);
  set_phase("running " + pte);
  return Status();
}

StatusOr<int64_t> SharedAdapter::run_constant_method(const char* method_name) {
  std::string what = pte_path_ + ": " + method_name + "()";
  MethodMemory memory;
  Status mem = memory.allocate(*program_, method_name);
  if (!mem.ok()) return Status::failure(pte_path_ + ": " + mem.message() +
                                        " (the export contract requires it)");
  Result<Method> method = program_->load_method(method_name, memory.manager.get());
  if (!method.ok())
    return Status::failure(what + " could not be loaded (" +
                           executorch::runtime::to_string(method.error()) + ")");
  Error err = method->execute();
  if (err != Error::Ok || method->outputs_size() != 1)
    return Status::failure(what + " failed to run");
  return int_from_output(method->get_output(0), what);
}

// Turns a failed forward load into the most useful message we can give.
Status SharedAdapter::explain_load_failure(Error error,
                                           const Foundation& foundation) {
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
    return Status::failure(missing_keys_message(
        pte_path_, foundation.path(), foundation.shared_path(), missing,
        /*built_for_foundation=*/false));
  std::string detail = last_runtime_error();
  std::string hint =
      error == Error::InvalidExternalData
          ? ": the foundation's tensors do not match what the adapter expects "
            "(different shapes or dtypes); was it exported against this "
            "foundation?"
          : "";
  return Status::failure("could not load " + pte_path_ +
                         (foundation.path().empty()
                              ? " without --ptd"
                              : " against " + describe_data_files(
                                                  foundation.path(),
                                                  foundation.shared_path())) +
                         " (" +
                         executorch::runtime::to_string(error) +
                         (detail.empty() ? "" : ": " + detail) + ")" + hint);
}

Status SharedAdapter::step(const std::vector<int64_t>& tokens, int64_t pos,
                           std::vector<float>* logits) {
  ForwardInputs in(tokens, &pos);
  std::string what = pte_path_ + ": forward";
  if (forward_->set_input(EValue(*in.tokens), 0) != Error::Ok ||
      forward_->set_input(EValue(*in.input_pos), 1) != Error::Ok)
    return Status::failure(what + " rejected its inputs (" + last_runtime_error() + ")");
  Error err = forward_->execute();
  if (err != Error::Ok)
    return Status::failure(what + " failed (" +
                           executorch::runtime::to_string(err) + ": " +
                           last_runtime_error() + ")");
  if (forward_->outputs_size() < 1)
    return Status::failure(what + " returned nothing");
  return logits_from_output(forward_->get_output(0), vocab_size_, what, logits);
}

}  // namespace

StatusOr<std::unique_ptr<Adapter>> load_shared_adapter(
    const std::string& pte, const Foundation& foundation,
    const LoadBackendOptionsMap* backend_options) {
  auto adapter = std::make_unique<SharedAdapter>();
  Status s = adapter->load(pte, foundation, backend_options);
  if (!s.ok()) return s;
  return std::unique_ptr<Adapter>(std::move(adapter));
}

}  // namespace lora_share
