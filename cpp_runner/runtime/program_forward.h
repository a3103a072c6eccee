// A program built from a PT2 archive (lora-share build with `programs:`):
// any exported model's forward, loaded by hand (Program + Method) against the
// ONE foundation map every program of the process resolves its shared tensors
// against (foundation.h), so that a further program costs its own tensors and
// its planned memory, not another copy of what the programs share (XNNPACK's
// weight cache packs a shared tensor once: the same key, the same mapped
// bytes). Inputs are copied into the method's planned input memory; outputs
// stay in its planned memory until the next call.
#pragma once

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "adapter_on_foundation.h"
#include "foundation.h"
#include "planned_arena.h"
#include "status.h"

namespace lora_share {

// A tensor by ExecuTorch ScalarType code, its sizes and its data (row-major).
struct TensorView {
  int32_t dtype = 0;
  std::vector<int64_t> sizes;
  void* data = nullptr;
  size_t nbytes = 0;
};

class ForwardProgram {
 public:
  // Maps `pte`, loads its forward against `foundation` in planned memory of
  // its own.
  static StatusOr<std::unique_ptr<ForwardProgram>> load(
      const std::string& pte, const Foundation& foundation,
      const executorch::runtime::LoadBackendOptionsMap* backend_options);
  ~ForwardProgram();

  // forward on `inputs` (checked against its inputs: count, dtype, rank, and
  // sizes at most the planned ones); the outputs point into the program's
  // memory, valid until the next run. Usage errors name the input.
  StatusOr<std::vector<TensorView>> run(const std::vector<TensorView>& inputs);

  const std::string& pte() const { return pte_; }
  size_t num_inputs() const { return inputs_.size(); }
  // "float32[1, 8, 32]": what input `i` takes, for messages.
  std::string describe_input(size_t i) const;

 private:
  ForwardProgram() = default;
  std::string pte_;
  std::vector<TensorView> inputs_;  // forward's input metadata (no data)
  // Declaration order matters: each points into the ones before it.
  std::unique_ptr<executorch::extension::MmapDataLoader> loader_;
  std::unique_ptr<executorch::runtime::Program> program_;
  std::unique_ptr<PlannedArena> arena_;
  std::unique_ptr<MethodMemory> memory_;
  std::unique_ptr<KeyRecordingDataMap> data_map_;
  std::unique_ptr<executorch::runtime::Method> method_;
};

// "float32", "int64", ... for an ExecuTorch ScalarType code ("dtype N" for others).
std::string dtype_name(int32_t dtype);
// Bytes per element of an ExecuTorch ScalarType code (0: not a type the runtimes exchange).
size_t dtype_size(int32_t dtype);

}  // namespace lora_share
