#include "program_forward.h"

#include <executorch/extension/tensor/tensor_ptr.h>

namespace lora_share {

using executorch::aten::ScalarType;
using executorch::extension::MmapDataLoader;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::LoadBackendOptionsMap;
using executorch::runtime::Method;
using executorch::runtime::Program;
using executorch::runtime::Result;

namespace {

struct DtypeInfo {
  ScalarType type;
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {ScalarType::Byte, "uint8", 1},        {ScalarType::Char, "int8", 1},      {ScalarType::Short, "int16", 2},
    {ScalarType::Int, "int32", 4},         {ScalarType::Long, "int64", 8},     {ScalarType::Half, "float16", 2},
    {ScalarType::Float, "float32", 4},     {ScalarType::Double, "float64", 8}, {ScalarType::Bool, "bool", 1},
    {ScalarType::BFloat16, "bfloat16", 2},
};

const DtypeInfo* find_dtype(int32_t dtype) {
  for (const DtypeInfo& d : kDtypes)
    if (static_cast<int32_t>(d.type) == dtype) return &d;
  return nullptr;
}

std::string describe(int32_t dtype, const std::vector<int64_t>& sizes) {
  std::string s = dtype_name(dtype) + "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

}  // namespace

std::string dtype_name(int32_t dtype) {
  const DtypeInfo* d = find_dtype(dtype);
  return d ? d->name : "dtype " + std::to_string(dtype);
}

size_t dtype_size(int32_t dtype) {
  const DtypeInfo* d = find_dtype(dtype);
  return d ? d->size : 0;
}

ForwardProgram::~ForwardProgram() = default;

std::string ForwardProgram::describe_input(size_t i) const { return describe(inputs_[i].dtype, inputs_[i].sizes); }

StatusOr<std::unique_ptr<ForwardProgram>> ForwardProgram::load(const std::string& pte, const Foundation& foundation,
                                                               const LoadBackendOptionsMap* backend_options) {
  Status readable = check_readable_file(pte, "--pte");
  if (!readable.ok()) return readable;
  std::unique_ptr<ForwardProgram> p(new ForwardProgram());
  p->pte_ = pte;
  Result<MmapDataLoader> loader = MmapDataLoader::from(pte.c_str(), MmapDataLoader::MlockConfig::NoMlock);
  if (!loader.ok()) return Status::failure("--pte " + pte + ": could not map the file");
  p->loader_ = std::make_unique<MmapDataLoader>(std::move(loader.get()));
  Result<Program> program = Program::load(p->loader_.get());
  if (!program.ok()) return Status::failure("--pte " + pte + ": not an ExecuTorch program (.pte)");
  p->program_ = std::make_unique<Program>(std::move(program.get()));
  auto meta = p->program_->method_meta("forward");
  if (!meta.ok()) return Status::failure("--pte " + pte + ": the program has no method 'forward'");
  for (size_t i = 0; i < meta->num_inputs(); ++i) {
    auto t = meta->input_tensor_meta(i);
    if (!t.ok())
      return Status::failure("--pte " + pte + ": forward's input " + std::to_string(i) +
                             " is not a tensor; lora-share runs programs of tensors in, tensors out");
    TensorView v;
    v.dtype = static_cast<int32_t>(t->scalar_type());
    v.sizes.assign(t->sizes().begin(), t->sizes().end());
    v.nbytes = t->nbytes();
    p->inputs_.push_back(std::move(v));
  }
  auto sizes = planned_buffer_sizes(*p->program_, "forward");
  if (!sizes.ok()) return Status::failure(pte + ": " + sizes.status().message());
  auto arena = PlannedArena::allocate(sizes.value());
  if (!arena.ok()) return arena.status();
  p->arena_ = std::move(arena.value());
  p->memory_ = std::make_unique<MethodMemory>(p->arena_->spans(sizes->size()));
  if (foundation.data_map() != nullptr) p->data_map_ = std::make_unique<KeyRecordingDataMap>(foundation.data_map());
  Result<Method> method = p->program_->load_method("forward", &p->memory_->manager,
                                                   /*event_tracer=*/nullptr, p->data_map_.get(), backend_options);
  if (!method.ok()) {
    std::string missing;
    if (p->data_map_)
      for (const std::string& key : p->data_map_->missing_keys())
        missing += (missing.empty() ? "" : ", ") + key.substr(0, 16) + "...";
    return Status::failure("could not load " + pte + " with " + foundation.path() + ": " +
                           (missing.empty() ? executorch::runtime::to_string(method.error())
                                            : "the .ptd has no data for key(s) " + missing +
                                                  " that the .pte needs: pass the foundation.ptd of its build"));
  }
  p->method_ = std::make_unique<Method>(std::move(method.get()));
  return p;
}

StatusOr<std::vector<TensorView>> ForwardProgram::run(const std::vector<TensorView>& inputs) {
  if (inputs.size() != inputs_.size()) {
    std::string want;
    for (size_t i = 0; i < inputs_.size(); ++i) want += (i ? ", " : "") + describe_input(i);
    return Status::usage(pte_ + ": forward takes " + std::to_string(inputs_.size()) + " input(s) (" + want + "), got " +
                         std::to_string(inputs.size()));
  }
  std::vector<executorch::extension::TensorPtr> held;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorView& in = inputs[i];
    const TensorView& want = inputs_[i];
    bool fits = in.dtype == want.dtype && in.sizes.size() == want.sizes.size() && in.data != nullptr;
    size_t elements = 1;
    for (size_t d = 0; fits && d < in.sizes.size(); ++d) {
      fits = in.sizes[d] >= 0 && in.sizes[d] <= want.sizes[d];
      elements *= static_cast<size_t>(in.sizes[d]);
    }
    if (!fits || elements * dtype_size(in.dtype) != in.nbytes)
      return Status::usage("input " + std::to_string(i) + ": forward takes " + describe_input(i) + ", got " +
                           describe(in.dtype, in.sizes) + (in.data == nullptr ? " without data" : ""));
    std::vector<executorch::aten::SizesType> sizes(in.sizes.begin(), in.sizes.end());
    held.push_back(
        executorch::extension::make_tensor_ptr(std::move(sizes), in.data, static_cast<ScalarType>(in.dtype)));
    Error e = method_->set_input(EValue(*held.back()), i);
    if (e != Error::Ok)
      return Status::usage("input " + std::to_string(i) + " (" + describe(in.dtype, in.sizes) +
                           "): the program does not take it (" + executorch::runtime::to_string(e) + ")");
  }
  Error e = method_->execute();
  if (e != Error::Ok) return Status::failure(pte_ + ": forward failed (" + executorch::runtime::to_string(e) + ")");
  std::vector<TensorView> outputs;
  for (size_t i = 0; i < method_->outputs_size(); ++i) {
    const EValue& out = method_->get_output(i);
    if (!out.isTensor()) return Status::failure(pte_ + ": forward's output " + std::to_string(i) + " is not a tensor");
    const auto& t = out.toTensor();
    TensorView v;
    v.dtype = static_cast<int32_t>(t.scalar_type());
    v.sizes.assign(t.sizes().begin(), t.sizes().end());
    v.data = t.mutable_data_ptr();
    v.nbytes = t.nbytes();
    outputs.push_back(std::move(v));
  }
  return outputs;
}

}  // namespace lora_share
