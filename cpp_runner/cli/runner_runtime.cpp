#include "runner_runtime.h"

#include <chrono>

#include "file_stem.h"

namespace lora_share {
namespace {

StatusOr<AdapterView> view_of(ls_runtime* runtime, ls_adapter* handle) {
  ls_diag_adapter info;
  ls_error error;
  ls_status code = ls_diag_adapter_info(runtime, handle, &info, &error);
  if (code != LS_OK) return status_of(code, error);
  return AdapterView{handle, info.name, info.pte, info.vocab_size, info.max_seq_len, info.prefill_chunk, info.load_ms};
}

// The C callback over the request's on_token; `user_data` is the Reply's
// collector below.
struct Collector {
  Reply* reply;
  const std::function<void(int64_t)>* on_token;
};

int collect(int64_t token, void* user_data) {
  auto* c = static_cast<Collector*>(user_data);
  c->reply->tokens.push_back(token);
  if (*c->on_token) (*c->on_token)(token);
  return 0;
}

}  // namespace

Status status_of(ls_status code, const ls_error& error) {
  bool usage = code == LS_ERR_ARGUMENT || code == LS_ERR_NOT_FOUND || code == LS_ERR_REQUEST || code == LS_ERR_BUDGET;
  // The whole message: ls_error keeps its first 1023 bytes.
  std::string message = ls_diag_last_message();
  if (message.rfind(error.message, 0) != 0) message = error.message;
  return usage ? Status::usage(message) : Status::failure(message);
}

StatusOr<std::unique_ptr<RunnerRuntime>> RunnerRuntime::load(const Options& options) {
  ls_options lib;
  ls_options_init(&lib);
  lib.shared_ptd = options.shared_ptd.empty() ? nullptr : options.shared_ptd.c_str();
  lib.verify = options.no_verify ? 0 : 1;
  lib.packed_cache = options.no_packed_cache ? 0 : 1;
  lib.speculation = options.no_speculation ? LS_SPECULATION_OFF
                    : options.every_draft  ? LS_SPECULATION_EVERY_DRAFT
                                           : LS_SPECULATION_ON;
  lib.packed_cache_dir = options.packed_cache.empty() ? nullptr : options.packed_cache.c_str();
  ls_diag_options diag;
  ls_diag_options_init(&diag);
  diag.stock = options.stock;
  diag.private_arenas = options.private_arenas;
  diag.weight_cache = !options.no_weight_cache;
  diag.huge_pages = !options.no_huge_pages;
  // Text needs the EOS ids even past which it generates (they are never
  // text); with ids alone, --ignore-eos reads no manifest.json at all.
  const bool text = options.prompt_given || options.serve;
  diag.ignore_eos = options.ignore_eos && !text;
  diag.tokenizer_dir = options.tokenizer_dir.empty() ? nullptr : options.tokenizer_dir.c_str();
  diag.bind_tokenizer = text ? 1 : 0;
  diag.runner_messages = 1;
  diag.threads = options.threads;
  std::vector<const char*> ptes;
  for (const std::string& pte : options.ptes) ptes.push_back(pte.c_str());

  auto t0 = std::chrono::steady_clock::now();
  ls_error error;
  ls_runtime* handle =
      ls_diag_open(options.ptd.empty() ? nullptr : options.ptd.c_str(), ptes.data(), ptes.size(), &lib, &diag, &error);
  if (handle == nullptr) return status_of(error.code, error);
  std::unique_ptr<RunnerRuntime> rt(new RunnerRuntime(handle));
  rt->load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ls_diag_memory_stats(&rt->after_load);
  rt->ptd = options.ptd;
  rt->shared_ptd = options.shared_ptd;
  ls_status code = ls_diag_loading_info(handle, &rt->loading, &error);
  if (code != LS_OK) return status_of(code, error);
  for (const std::string& pte : options.ptes) {
    ls_adapter* adapter = ls_adapter_by_name(handle, file_stem(pte).c_str(), &error);
    if (adapter == nullptr) return status_of(error.code, error);
    auto view = view_of(handle, adapter);
    if (!view.ok()) return view.status();
    rt->adapters.push_back(std::move(view.value()));
  }
  if (!options.stock) {
    auto base = view_of(handle, nullptr);
    if (!base.ok()) return base.status();
    rt->base = std::move(base.value());
  }
  return rt;
}

RunnerRuntime::~RunnerRuntime() { ls_close(runtime_); }

ls_generate_options flag_options(const Options& options) {
  ls_generate_options g;
  ls_generate_options_init(&g);
  g.max_new_tokens = options.max_new_tokens;
  g.temperature = options.temperature;
  g.seed = options.seed;
  g.ignore_eos = options.ignore_eos ? 1 : 0;
  return g;
}

ls_diag_variants RunnerRuntime::variants() const {
  ls_diag_variants v{};
  ls_error error;
  ls_diag_slot_variants(runtime_, &v, &error);  // the runner's own thread: never busy
  return v;
}

const AdapterView* RunnerRuntime::find(const std::string& name) const {
  if (name == LS_BASE_NAME) return base ? &*base : nullptr;
  for (const AdapterView& a : adapters)
    if (a.name == name) return &a;
  return nullptr;
}

std::string RunnerRuntime::names() const {
  std::string out;
  for (const AdapterView& a : adapters) out += (out.empty() ? "" : ", ") + a.name;
  return out;
}

StatusOr<Reply> RunnerRuntime::generate(const AdapterView& adapter, const GenerateRequest& request,
                                        const std::function<void(int64_t)>& on_token) const {
  const ls_generate_options& options = request.options;
  Reply reply;
  reply.vocab = adapter.vocab_size;
  ls_diag_generate_options diag;
  ls_diag_generate_options_init(&diag);
  if (request.keep_logits) {
    reply.logits.resize(static_cast<size_t>(options.max_new_tokens) * adapter.vocab_size);
    diag.logits = reply.logits.data();
  }
  // ignore_eos: no id stops it (the build's EOS ids otherwise).
  if (options.ignore_eos) diag.stop_ids_given = 1;
  diag.prompt_label = request.prompt_label.c_str();
  Collector collector{&reply, &on_token};
  ls_diag_generation figures;
  ls_error error;
  ls_status code = ls_diag_generate(runtime_, adapter.handle, request.prompt.data(), request.prompt.size(), &options,
                                    &diag, collect, &collector, &figures, &error);
  if (code != LS_OK) return status_of(code, error);
  reply.rows = figures.logits_rows;
  reply.logits.resize(static_cast<size_t>(reply.rows) * adapter.vocab_size);
  reply.prefill_ms = figures.prefill_ms;
  reply.decode_ms = figures.decode_ms;
  if (figures.prefill_tokens_per_s >= 0) reply.prefill_tokens_per_s = figures.prefill_tokens_per_s;
  if (figures.decode_tokens_per_s >= 0) reply.decode_tokens_per_s = figures.decode_tokens_per_s;
  return reply;
}

}  // namespace lora_share
