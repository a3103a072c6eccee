#include "report.h"

#include <sys/stat.h>

#include <algorithm>

#include <nlohmann/json.hpp>

namespace lora_share {
namespace {

using json = nlohmann::ordered_json;  // keys in the order written

int64_t file_bytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

json memory_json(const ls_diag_memory& m) {
  return {{"rss_kb", m.rss_kb},     {"pss_kb", m.pss_kb},           {"anon_kb", m.anon_kb}, {"file_kb", m.file_kb},
          {"shmem_kb", m.shmem_kb}, {"peak_rss_kb", m.peak_rss_kb}, {"huge_kb", m.huge_kb}};
}

json optional_number(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json generation_json(const AdapterView& adapter, const std::vector<int64_t>& prompt, const Reply& g,
                     const std::optional<std::string>& text) {
  json j = {{"adapter", adapter.name}, {"tokens", g.tokens}};
  if (text) j["text"] = *text;
  j["prompt_tokens"] = prompt.size();
  j["prefill_ms"] = g.prefill_ms;
  j["decode_ms"] = g.decode_ms;
  j["prefill_tokens_per_s"] = optional_number(g.prefill_tokens_per_s);
  j["decode_tokens_per_s"] = optional_number(g.decode_tokens_per_s);
  return j;
}

// Invalid UTF-8 cannot come from the tokenizer's decode; replace, never throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

double mib(int64_t kb) { return kb / 1024.0; }

// Tokens per second, or "-" when there was nothing to time (e.g. no decode
// step with --max-new-tokens 1).
std::string rate(const std::optional<double>& per_s) {
  if (!per_s) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f", *per_s);
  return buf;
}

}  // namespace

std::string run_json(const RunnerRuntime& runtime, const AdapterView& adapter, const std::vector<int64_t>& prompt,
                     const Reply& g, const ls_diag_memory& end, const std::optional<std::string>& text) {
  const ls_diag_loading& loading = runtime.loading;
  json j = generation_json(adapter, prompt, g, text);
  j["load_ms"] = runtime.load_ms;
  j["vocab_size"] = adapter.vocab_size;
  j["max_seq_len"] = adapter.max_seq_len;
  j["prefill_chunk"] = adapter.prefill_chunk;
  j["loading"] = {{"mode", loading.mode},
                  {"weight_cache", loading.weight_cache != 0},
                  {"workspace_sharing_mode", loading.workspace_sharing_mode},
                  {"packed_cache_warm", loading.packed_cache_warm != 0},
                  {"packed_cache", loading.packed_cache},
                  {"arena", loading.arena},
                  {"planned_bytes", loading.planned_bytes},
                  {"threads", loading.threads}};
  ls_diag_reshapes reshapes;
  ls_diag_xnnpack_reshapes(&reshapes);
  j["xnnpack_reshapes"] = {{"run", reshapes.run}, {"skipped", reshapes.skipped}};
  ls_diag_variants variants = runtime.variants();
  j["slot_variants"] = {{"made", variants.made},
                        {"refused", variants.refused},
                        {"failed", variants.failed},
                        {"resident", variants.resident}};
  j["ptd"] = runtime.ptd;
  j["shared_ptd"] = runtime.shared_ptd.empty() ? json(nullptr) : json(runtime.shared_ptd);
  json adapters = json::array();
  for (const AdapterView& a : runtime.adapters)
    adapters.push_back({{"name", a.name}, {"pte", a.pte}, {"pte_bytes", file_bytes(a.pte)}, {"load_ms", a.load_ms}});
  j["adapters"] = adapters;
  j["memory"] = {{"after_load", memory_json(runtime.after_load)}, {"end", memory_json(end)}};
  return dump(j);
}

std::string serve_answer_json(const AdapterView& adapter, const std::vector<int64_t>& prompt, const Reply& g,
                              const std::optional<std::string>& text) {
  return dump(generation_json(adapter, prompt, g, text));
}

std::string error_json(const std::string& message) { return dump(json{{"error", message}}); }

void print_summary(std::FILE* out, const RunnerRuntime& runtime, const AdapterView& adapter,
                   const std::vector<int64_t>& prompt, const Reply& g, const ls_diag_memory& end) {
  const ls_diag_loading& loading = runtime.loading;
  std::string shared = runtime.shared_ptd.empty() ? "" : ", shared adapter tensors from " + runtime.shared_ptd;
  std::fprintf(out,
               "%s: %zu adapter(s) loaded (%s arena, %s%s%s) in %.1f ms; "
               "adapter '%s' generated %zu tokens\n",
               loading.mode, runtime.adapters.size(), loading.arena,
               loading.weight_cache ? "weight cache on" : "weight cache off",
               loading.packed_cache_warm ? ", packed cache warm" : "", shared.c_str(), runtime.load_ms,
               adapter.name.c_str(), g.tokens.size());
  int64_t chunk = std::max<int64_t>(adapter.prefill_chunk, 1);
  int64_t calls = (static_cast<int64_t>(prompt.size()) + chunk - 1) / chunk;
  std::fprintf(out,
               "prefill: %zu tokens in %lld call(s) of at most %lld, %.2f ms "
               "(%s tok/s); decode: %zu tokens in %.2f ms (%s tok/s)\n",
               prompt.size(), static_cast<long long>(calls), static_cast<long long>(chunk), g.prefill_ms,
               rate(g.prefill_tokens_per_s).c_str(), g.tokens.size() - 1, g.decode_ms,
               rate(g.decode_tokens_per_s).c_str());
  std::fprintf(out,
               "memory: PSS %.1f MiB (anon %.1f, file %.1f), RSS %.1f MiB "
               "after load; PSS %.1f MiB, RSS %.1f MiB at end\n",
               mib(runtime.after_load.pss_kb), mib(runtime.after_load.anon_kb), mib(runtime.after_load.file_kb),
               mib(runtime.after_load.rss_kb), mib(end.pss_kb), mib(end.rss_kb));
}

}  // namespace lora_share
