#include "program_mode.h"

#include <cstdio>
#include <memory>
#include <vector>

#include "file_stem.h"
#include "lora_share.h"
#include "npy_reader.h"
#include "npy_writer.h"

namespace lora_share {
namespace {

Status from_error(ls_status code, const ls_error& error) {
  return code == LS_ERR_REQUEST || code == LS_ERR_ARGUMENT ? Status::usage(error.message)
                                                           : Status::failure(error.message);
}

constexpr size_t kMaxOutputs = 256;

}  // namespace

Status run_program_mode(const Options& options) {
  ls_error error;
  ls_options open_options;
  ls_options_init(&open_options);
  std::unique_ptr<ls_runtime, void (*)(ls_runtime*)> runtime(ls_open(options.ptd.c_str(), &open_options, &error),
                                                             ls_close);
  if (!runtime) return Status::failure(error.message);
  ls_program* chosen = nullptr;
  for (const std::string& pte : options.ptes) {
    ls_program* program = ls_load_program(runtime.get(), pte.c_str(), &error);
    if (program == nullptr) return Status::failure(error.message);
    if (chosen == nullptr && (options.adapter.empty() || options.adapter == file_stem(pte))) chosen = program;
  }
  std::vector<NpyArray> arrays;
  for (const std::string& path : options.inputs) {
    auto array = read_npy(path, "--input");
    if (!array.ok()) return array.status();
    arrays.push_back(std::move(array.value()));
  }
  std::vector<ls_tensor> inputs;
  for (NpyArray& a : arrays)
    inputs.push_back(
        ls_tensor{a.dtype, static_cast<int32_t>(a.shape.size()), a.shape.data(), a.data.data(), a.data.size()});
  std::vector<ls_tensor> outputs(kMaxOutputs);
  size_t n = 0;
  ls_status s = ls_run_program(chosen, inputs.data(), inputs.size(), outputs.data(), outputs.size(), &n, &error);
  if (s != LS_OK) return from_error(s, error);
  std::vector<NpyTensor> tensors;
  for (size_t i = 0; i < n; ++i) {
    const ls_tensor& t = outputs[i];
    NpyTensor v{npy_descr(t.dtype), std::vector<int64_t>(t.sizes, t.sizes + t.ndim), t.data, t.nbytes};
    if (v.descr.empty())
      return Status::failure("output " + std::to_string(i) + ": ExecuTorch dtype " + std::to_string(t.dtype) +
                             " has no .npy equivalent the runner writes");
    std::string shape;
    for (int64_t d : v.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    std::printf("output %zu: %s[%s]\n", i, v.descr.c_str(), shape.c_str());
    tensors.push_back(std::move(v));
  }
  if (!options.output.empty()) {
    Status w = write_tensors(options.output, tensors, "--output");
    if (!w.ok()) return w;
  }
  ls_runtime_stats stats;
  if (ls_stats(runtime.get(), &stats, nullptr) == LS_OK && stats.process_pss_bytes >= 0)
    std::fprintf(stderr, "%zu program(s) loaded against %s; process PSS %.1f MiB\n", options.ptes.size(),
                 options.ptd.c_str(), stats.process_pss_bytes / 1048576.0);
  return Status();
}

}  // namespace lora_share
