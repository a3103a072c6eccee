#include "report.h"

#include <sys/stat.h>

#include <algorithm>

#include "json_writer.h"

namespace lora_share {
namespace {

int64_t file_bytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

void write_memory(JsonWriter& j, const ls_diag_memory& m) {
  j.begin_object()
      .key("rss_kb")
      .value(m.rss_kb)
      .key("pss_kb")
      .value(m.pss_kb)
      .key("anon_kb")
      .value(m.anon_kb)
      .key("file_kb")
      .value(m.file_kb)
      .key("shmem_kb")
      .value(m.shmem_kb)
      .key("peak_rss_kb")
      .value(m.peak_rss_kb)
      .key("huge_kb")
      .value(m.huge_kb)
      .end_object();
}

void write_generation(JsonWriter& j, const AdapterView& adapter, const std::vector<int64_t>& prompt, const Reply& g,
                      const std::optional<std::string>& text) {
  j.key("adapter").value(adapter.name).key("tokens").value(g.tokens);
  if (text) j.key("text").value(*text);
  j.key("prompt_tokens")
      .value(static_cast<int64_t>(prompt.size()))
      .key("prefill_ms")
      .value(g.prefill_ms)
      .key("decode_ms")
      .value(g.decode_ms)
      .key("prefill_tokens_per_s")
      .value(g.prefill_tokens_per_s)
      .key("decode_tokens_per_s")
      .value(g.decode_tokens_per_s);
}

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
  JsonWriter j;
  j.begin_object();
  write_generation(j, adapter, prompt, g, text);
  j.key("load_ms").value(runtime.load_ms);
  j.key("vocab_size").value(adapter.vocab_size);
  j.key("max_seq_len").value(adapter.max_seq_len);
  j.key("prefill_chunk").value(adapter.prefill_chunk);
  j.key("loading")
      .begin_object()
      .key("mode")
      .value(loading.mode)
      .key("weight_cache")
      .value(loading.weight_cache != 0)
      .key("workspace_sharing_mode")
      .value(loading.workspace_sharing_mode)
      .key("packed_cache_warm")
      .value(loading.packed_cache_warm != 0)
      .key("packed_cache")
      .value(loading.packed_cache)
      .key("arena")
      .value(loading.arena)
      .key("planned_bytes")
      .value(static_cast<int64_t>(loading.planned_bytes))
      .key("threads")
      .value(static_cast<int64_t>(loading.threads))
      .end_object();
  ls_diag_reshapes reshapes;
  ls_diag_xnnpack_reshapes(&reshapes);
  j.key("xnnpack_reshapes")
      .begin_object()
      .key("run")
      .value(static_cast<int64_t>(reshapes.run))
      .key("skipped")
      .value(static_cast<int64_t>(reshapes.skipped))
      .end_object();
  j.key("ptd").value(runtime.ptd);
  j.key("shared_ptd");
  if (runtime.shared_ptd.empty())
    j.null();
  else
    j.value(runtime.shared_ptd);
  j.key("adapters").begin_array();
  for (const AdapterView& a : runtime.adapters) {
    j.begin_object()
        .key("name")
        .value(a.name)
        .key("pte")
        .value(a.pte)
        .key("pte_bytes")
        .value(file_bytes(a.pte))
        .key("load_ms")
        .value(a.load_ms)
        .end_object();
  }
  j.end_array();
  j.key("memory").begin_object();
  j.key("after_load");
  write_memory(j, runtime.after_load);
  j.key("end");
  write_memory(j, end);
  j.end_object();
  j.end_object();
  return j.str();
}

std::string serve_answer_json(const AdapterView& adapter, const std::vector<int64_t>& prompt, const Reply& g,
                              const std::optional<std::string>& text) {
  JsonWriter j;
  j.begin_object();
  write_generation(j, adapter, prompt, g, text);
  j.end_object();
  return j.str();
}

std::string error_json(const std::string& message) {
  JsonWriter j;
  j.begin_object().key("error").value(message).end_object();
  return j.str();
}

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
