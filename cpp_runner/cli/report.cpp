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

void write_memory(JsonWriter& j, const MemoryStats& m) {
  j.begin_object()
      .key("rss_kb").value(m.rss_kb)
      .key("pss_kb").value(m.pss_kb)
      .key("anon_kb").value(m.anon_kb)
      .key("file_kb").value(m.file_kb)
      .key("shmem_kb").value(m.shmem_kb)
      .key("peak_rss_kb").value(m.peak_rss_kb)
      .end_object();
}

void write_generation(JsonWriter& j, const Adapter& adapter,
                      const std::vector<int64_t>& prompt, const Generation& g,
                      const std::optional<std::string>& text) {
  j.key("adapter").value(adapter.name()).key("tokens").value(g.tokens);
  if (text) j.key("text").value(*text);
  j.key("prompt_tokens").value(static_cast<int64_t>(prompt.size()))
      .key("prefill_ms").value(g.prefill_ms)
      .key("decode_ms").value(g.decode_ms)
      .key("prefill_tokens_per_s").value(g.prefill_tokens_per_s)
      .key("decode_tokens_per_s").value(g.decode_tokens_per_s);
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

std::string run_json(const Session& session, const Adapter& adapter,
                     const std::vector<int64_t>& prompt, const Generation& g,
                     const MemoryStats& end, const std::optional<std::string>& text) {
  JsonWriter j;
  j.begin_object();
  write_generation(j, adapter, prompt, g, text);
  j.key("load_ms").value(session.load_ms);
  j.key("vocab_size").value(adapter.vocab_size());
  j.key("max_seq_len").value(adapter.max_seq_len());
  j.key("prefill_chunk").value(adapter.prefill_chunk());
  j.key("loading").begin_object()
      .key("mode").value(session.mode)
      .key("weight_cache").value(session.xnnpack_state.weight_cache)
      .key("workspace_sharing_mode")
      .value(static_cast<int64_t>(session.xnnpack_state.workspace_sharing_mode))
      .key("packed_cache_warm").value(session.packed_cache_warm)
      .key("arena").value(session.arena)
      .key("planned_bytes").value(static_cast<int64_t>(session.planned_bytes))
      .end_object();
  j.key("ptd").value(session.ptd);
  j.key("shared_ptd");
  if (session.shared_ptd.empty()) j.null();
  else j.value(session.shared_ptd);
  j.key("adapters").begin_array();
  for (const auto& a : session.adapters) {
    j.begin_object()
        .key("name").value(a->name())
        .key("pte").value(a->pte_path())
        .key("pte_bytes").value(file_bytes(a->pte_path()))
        .key("load_ms").value(a->load_ms())
        .end_object();
  }
  j.end_array();
  j.key("memory").begin_object();
  j.key("after_load");
  write_memory(j, session.after_load);
  j.key("end");
  write_memory(j, end);
  j.end_object();
  j.end_object();
  return j.str();
}

std::string serve_answer_json(const Adapter& adapter,
                              const std::vector<int64_t>& prompt,
                              const Generation& g,
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

void print_summary(std::FILE* out, const Session& session, const Adapter& adapter,
                   const std::vector<int64_t>& prompt, const Generation& g,
                   const MemoryStats& end) {
  std::string shared = session.shared_ptd.empty()
                           ? ""
                           : ", shared adapter tensors from " + session.shared_ptd;
  std::fprintf(out,
               "%s: %zu adapter(s) loaded (%s arena, %s%s%s) in %.1f ms; "
               "adapter '%s' generated %zu tokens\n",
               session.mode.c_str(), session.adapters.size(), session.arena.c_str(),
               session.xnnpack_state.weight_cache ? "weight cache on"
                                                  : "weight cache off",
               session.packed_cache_warm ? ", packed cache warm" : "",
               shared.c_str(), session.load_ms, adapter.name().c_str(),
               g.tokens.size());
  int64_t chunk = std::max<int64_t>(adapter.prefill_chunk(), 1);
  int64_t calls = (static_cast<int64_t>(prompt.size()) + chunk - 1) / chunk;
  std::fprintf(out, "prefill: %zu tokens in %lld call(s) of at most %lld, %.2f ms "
                    "(%s tok/s); decode: %zu tokens in %.2f ms (%s tok/s)\n",
               prompt.size(), static_cast<long long>(calls),
               static_cast<long long>(chunk), g.prefill_ms,
               rate(g.prefill_tokens_per_s).c_str(), g.tokens.size() - 1,
               g.decode_ms, rate(g.decode_tokens_per_s).c_str());
  std::fprintf(out, "memory: PSS %.1f MiB (anon %.1f, file %.1f), RSS %.1f MiB "
                    "after load; PSS %.1f MiB, RSS %.1f MiB at end\n",
               mib(session.after_load.pss_kb), mib(session.after_load.anon_kb),
               mib(session.after_load.file_kb), mib(session.after_load.rss_kb),
               mib(end.pss_kb), mib(end.rss_kb));
}

}  // namespace lora_share
