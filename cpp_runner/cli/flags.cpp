#include "flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "file_stem.h"
#include "flag_table.h"
#include "lora_share.h"

namespace lora_share {
namespace {

using flags::parse_int64;

Status bad_value(const char* flag, const std::string& value, const char* expected) {
  return Status::usage(std::string("--") + flag + " '" + value + "': expected " + expected);
}

// The table. Order here is the order of --help.
std::vector<flags::Flag> table(Options& o) {
  return {
      {"pte", "PATH", "(required)", "adapter program (.pte); repeat to load several adapters at once",
       [&o](const std::string& v) {
         o.ptes.push_back(v);
         return Status();
       }},
      {"ptd", "PATH", "(none: self-contained .pte)",
       "shared foundation data file (.ptd), mapped once for every adapter; "
       "omit it only for programs with every weight inside",
       [&o](const std::string& v) {
         o.ptd = v;
         return Status();
       }},
      {"shared-ptd", "PATH", "(none)",
       "adapter tensors several adapters share (adapters_shared.ptd, written "
       "when the build config sets dedup.shared_adapter_tensors: hoist); "
       "mapped once, like --ptd",
       [&o](const std::string& v) {
         o.shared_ptd = v;
         return Status();
       }},
      {"tokens", "IDS", "(this or --prompt, unless --serve)",
       "prompt token ids, comma-separated, e.g. 1,17,42; generation stops "
       "after the build's end-of-sequence id (its manifest.json beside --ptd) "
       "unless --ignore-eos",
       [&o](const std::string& v) {
         auto ids = parse_token_list(v, "--tokens");
         if (!ids.ok()) return ids.status();
         o.tokens = std::move(ids.value());
         o.tokens_given = true;
         return Status();
       }},
      {"prompt", "TEXT", "(this or --tokens, unless --serve)",
       "prompt text, encoded with the build's tokenizer (BOS added where the "
       "model has one); the reply is printed as text while it is generated "
       "and stops at the model's end-of-sequence token",
       [&o](const std::string& v) {
         if (o.chat) return Status::usage("--chat and --prompt are two ways to give the prompt: pick one");
         o.prompt = v;
         o.prompt_given = true;
         return Status();
       }},
      {"chat", "TEXT", "(instead of --prompt)",
       "like --prompt, with TEXT as one user message in the build's chat "
       "template (manifest.json tokenizer.chat_format), as lora-share run --chat",
       [&o](const std::string& v) {
         if (o.prompt_given) return Status::usage("--chat and --prompt are two ways to give the prompt: pick one");
         o.prompt = v;
         o.prompt_given = true;
         o.chat = true;
         return Status();
       }},
      {"tokenizer", "DIR", "(the --ptd's folder)",
       "folder with the build's manifest.json and tokenizer.json, checked to "
       "belong to the --ptd; for --prompt and --serve",
       [&o](const std::string& v) {
         o.tokenizer_dir = v;
         return Status();
       }},
      {"max-new-tokens", "N", "16", "number of tokens to generate (>= 1)",
       [&o](const std::string& v) {
         int64_t n = 0;
         if (!parse_int64(v, &n) || n < 1) return bad_value("max-new-tokens", v, "an integer >= 1");
         o.max_new_tokens = n;
         return Status();
       }},
      {"temperature", "F", "0",
       "sampling temperature; 0 = greedy (the only mode that matches Python "
       "token for token)",
       [&o](const std::string& v) {
         double f = 0;
         if (!flags::parse_double(v, &f) || f < 0) return bad_value("temperature", v, "a finite number >= 0");
         o.temperature = f;
         return Status();
       }},
      {"seed", "N", "0", "random seed for sampling (reset for every request)",
       [&o](const std::string& v) {
         int64_t n = 0;
         if (!parse_int64(v, &n) || n < 0) return bad_value("seed", v, "an integer >= 0");
         o.seed = static_cast<uint64_t>(n);
         return Status();
       }},
      {"adapter", "NAME", "(first --pte)",
       "which loaded adapter answers: the .pte file stem, or 'base' for the "
       "foundation alone (no LoRA; through the program the --pte files carry)",
       [&o](const std::string& v) {
         o.adapter = v;
         return Status();
       }},
      {"ignore-eos", nullptr, "off",
       "generate max-new-tokens tokens even past the build's end-of-sequence "
       "ids (--tokens, --prompt and --serve)",
       [&o](const std::string&) {
         o.ignore_eos = true;
         return Status();
       }},
      {"serve", nullptr, "off",
       "read requests from stdin, one per line, either 'adapter<TAB>ids' or "
       "JSON {\"adapter\": ..., \"prompt\": text | \"messages\": [{\"role\", "
       "\"content\"}] (the build's chat template) | \"tokens\": [ids], "
       "\"max_new_tokens\", \"temperature\", \"seed\" (optional)}; answer one "
       "JSON line each (with \"text\" when the build has a tokenizer); "
       "each stops after an end-of-sequence id unless --ignore-eos; the "
       "adapter 'base' is the foundation alone; EOF ends. Requests run one at a time and each starts "
       "at position 0: nothing of an earlier request (KV cache included) is "
       "kept or read",
       [&o](const std::string&) {
         o.serve = true;
         return Status();
       }},
      {"input", "NPY", "(none)",
       "a program built from PT2 archives: one .npy per forward input, in "
       "order (repeat the flag); runs the --adapter's program (default: the "
       "first --pte) once on them",
       [&o](const std::string& v) {
         o.inputs.push_back(v);
         return Status();
       }},
      {"output", "PATH", "(none: shapes only)", "with --input: forward's output as .npy (several outputs: .npz)",
       [&o](const std::string& v) {
         o.output = v;
         return Status();
       }},
      {"dump-logits", "PATH", "(none)", "write the logits rows as .npy float32 [max_new_tokens, vocab]",
       [&o](const std::string& v) {
         o.dump_logits = v;
         return Status();
       }},
      {"json", nullptr, "off", "print one JSON object (tokens, timings, memory) instead of plain ids",
       [&o](const std::string&) {
         o.json = true;
         return Status();
       }},
      {"packed-cache", "DIR", "(the --ptd's folder's .packed/, else ~/.cache/lora-share/packed)",
       "folder of the packed-weights file: XNNPACK's packed weights are written "
       "there on the first start and mapped on later ones, skipping the repacking "
       "(a stale or damaged file is noted and written again)",
       [&o](const std::string& v) {
         o.packed_cache = v;
         return Status();
       }},
      {"no-packed-cache", nullptr, "off",
       "pack the weights in memory at every start: no packed-weights file read or written",
       [&o](const std::string&) {
         o.no_packed_cache = true;
         return Status();
       }},
      {"no-speculation", nullptr, "off",
       "no request verifies drafts: the one-row path alone (speculative decoding is on by default: the same "
       "answers, faster on text the answer copies, for decode_batch's memory: about 21 MiB more PSS on the "
       "SmolLM2-135M demo)",
       [&o](const std::string&) {
         o.no_speculation = true;
         return Status();
       }},
      {"every-draft", nullptr, "off",
       "each step verifies every draft found, not as many as pay for the step's width on this machine "
       "(docs/batching.md): the same answers, with draft counts no timing moves (tests, comparisons)",
       [&o](const std::string&) {
         o.every_draft = true;
         return Status();
       }},
      {"no-weight-cache", nullptr, "off",
       "turn XNNPACK's shared weight cache off (each adapter packs its own "
       "copy of the foundation; for benchmarks)",
       [&o](const std::string&) {
         o.no_weight_cache = true;
         return Status();
       }},
      {"no-huge-pages", nullptr, "off",
       "leave the packed weights in 4 KiB pages instead of collapsing them into "
       "2 MiB pages after loading (Linux; for benchmarks)",
       [&o](const std::string&) {
         o.no_huge_pages = true;
         return Status();
       }},
      {"stock", nullptr, "off",
       "load each adapter through executorch::extension::Module(pte, {ptd, "
       "shared-ptd}) with the weight cache off, as ExecuTorch's examples do "
       "(for benchmarks)",
       [&o](const std::string&) {
         o.stock = true;
         return Status();
       }},
      {"private-arenas", nullptr, "off",
       "give each adapter program its own planned memory (KV cache and "
       "activations) instead of one arena for all, sized to the largest "
       "(for benchmarks)",
       [&o](const std::string&) {
         o.private_arenas = true;
         return Status();
       }},
      {"threads", "N", "0",
       "threads ExecuTorch runs each program's ops on, for the whole process; 0 = "
       "one per core. On a host whose cores other work keeps busy, 1 decodes "
       "faster: every op split across threads waits for all of them",
       [&o](const std::string& v) {
         int64_t n = 0;
         if (!parse_int64(v, &n) || n < 0 || n > 1024) return bad_value("threads", v, "an integer from 0 to 1024");
         o.threads = static_cast<int>(n);
         return Status();
       }},
      {"no-verify", nullptr, "off",
       "load adapters even if their recorded foundation fingerprint differs "
       "from the --ptd's (the files are still checked for corruption)",
       [&o](const std::string&) {
         o.no_verify = true;
         return Status();
       }},
      {"verbose", nullptr, "off", "pass ExecuTorch's own log lines to stderr",
       [&o](const std::string&) {
         o.verbose = true;
         return Status();
       }},
      {"help", nullptr, "", "show this help and exit",
       [&o](const std::string&) {
         o.help = true;
         return Status();
       }},
  };
}

// --input: a program's forward on tensors; none of the generation flags apply.
Status check_program_mode(const Options& o) {
  if (o.inputs.empty()) return Status::usage("--output needs --input: the tensors forward runs on");
  if (o.ptd.empty())
    return Status::usage(
        "--input needs the deployment's foundation.ptd (--ptd): the tensors its "
        "programs share are there");
  if (o.serve || o.tokens_given || o.prompt_given || !o.dump_logits.empty() || o.stock)
    return Status::usage(
        "--input runs a program's forward on tensors: drop --serve, --tokens, "
        "--prompt, --dump-logits and --stock");
  std::set<std::string> names;
  for (const std::string& pte : o.ptes)
    if (!names.insert(file_stem(pte)).second)
      return Status::usage("--pte: two programs are named '" + file_stem(pte) +
                           "' (the name is the file stem); rename one");
  if (!o.adapter.empty() && !names.count(o.adapter))
    return Status::usage("--adapter '" + o.adapter + "': no such program among the --pte files");
  return Status();
}

// Combinations that would silently do something other than asked.
Status check_combinations(const Options& o) {
  if (o.help) return Status();
  if (o.ptes.empty()) return Status::usage("--pte: give at least one adapter program (.pte)");
  if (!o.inputs.empty() || !o.output.empty()) return check_program_mode(o);
  if (o.serve) {
    if (o.tokens_given || o.prompt_given)
      return Status::usage(std::string(o.tokens_given ? "--tokens" : "--prompt") +
                           " is not used with --serve: each request line "
                           "carries its own prompt");
    if (!o.adapter.empty())
      return Status::usage(
          "--adapter is not used with --serve: each request "
          "line names its adapter");
    if (!o.dump_logits.empty()) return Status::usage("--dump-logits is not supported with --serve");
  } else if (o.tokens_given == o.prompt_given) {
    return Status::usage(o.tokens_given ? "--tokens and --prompt are mutually exclusive: "
                                          "give the prompt one way"
                                        : "give the prompt as --tokens IDS (e.g. 1,17,42) "
                                          "or --prompt TEXT (or use --serve)");
  }
  if (!o.tokenizer_dir.empty() && o.tokens_given)
    return Status::usage(
        "--tokenizer is read only with --prompt or --serve, "
        "not with --tokens");
  if (o.prompt_given && o.ptd.empty())
    return Status::usage(
        "--prompt needs the build's foundation.ptd (--ptd): "
        "its tokenizer is checked against it");
  // Adapters are picked by file stem, so two files with one stem would make
  // one unreachable. Checked here so a typo fails before minutes of loading.
  std::set<std::string> names;
  std::string listed;
  for (const std::string& pte : o.ptes) {
    std::string name = file_stem(pte);
    if (name == LS_BASE_NAME)
      return Status::usage("--pte " + pte + ": the name '" + std::string(LS_BASE_NAME) +
                           "' (the file stem) is reserved for the foundation "
                           "alone (--adapter base): rename the file");
    if (!names.insert(name).second)
      return Status::usage("--pte: two adapters are named '" + name + "' (the name is the file stem); rename one");
    listed += (listed.empty() ? "" : ", ") + name;
  }
  if (!o.adapter.empty() && o.adapter != LS_BASE_NAME && !names.count(o.adapter))
    return Status::usage("--adapter '" + o.adapter + "': no such adapter (loaded: " + listed +
                         "; 'base' is the foundation alone)");
  // The shared file holds LoRA tensors only: a program that reads it also
  // reads foundation weights, so it is useless without --ptd.
  if (!o.shared_ptd.empty() && o.ptd.empty())
    return Status::usage(
        "--shared-ptd is read beside the foundation: give "
        "the build's foundation.ptd with --ptd too");
  if (!o.packed_cache.empty() && o.no_packed_cache)
    return Status::usage(
        "--packed-cache names the packed-weights file's folder, "
        "--no-packed-cache turns the file off: give one of them");
  if (o.every_draft && o.no_speculation)
    return Status::usage("--every-draft verifies every draft, --no-speculation verifies none: give one of them");
  if (!o.packed_cache.empty() && (o.no_weight_cache || o.stock))
    return Status::usage(
        "--packed-cache needs the weight cache, which "
        "--no-weight-cache/--stock turn off");
  if (o.private_arenas && o.stock)
    return Status::usage(
        "--private-arenas is for the runner's own loading "
        "path; with --stock each Module has its own memory");
  return Status();
}

}  // namespace

StatusOr<std::vector<int64_t>> parse_token_list(const std::string& text, const std::string& what) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    int64_t id = 0;
    if (!parse_int64(item, &id))
      return Status::usage(what + " '" + text +
                           "': expected comma-separated integer token ids, "
                           "e.g. 1,17,42");
    ids.push_back(id);
  }
  if (ids.empty()) return Status::usage(what + ": give at least one token id, e.g. 1,17,42");
  return ids;
}

StatusOr<Options> parse_flags(int argc, char** argv) {
  Options options;
  Status s = flags::parse(table(options), argc, argv);
  if (!s.ok()) return s;
  s = check_combinations(options);
  if (!s.ok()) return s;
  return options;
}

std::string usage_text(const char* program_name) {
  std::ostringstream out;
  out << "usage: " << program_name
      << " --pte A.pte [--pte B.pte ...] [--ptd foundation.ptd "
         "[--shared-ptd adapters_shared.ptd]] (--tokens IDS | --prompt TEXT | "
         "--serve) "
         "[flags]\n\n"
         "Loads every adapter program against one shared, memory-mapped "
         "foundation and generates tokens.\nRequests run one at a time and "
         "each starts at position 0 (a prompt longer than the program's "
         "prefill chunk is fed in several calls): nothing of an earlier "
         "request, KV cache included, is kept or read.\n\nflags:\n";
  Options defaults;
  out << flags::help(table(defaults), 26);
  out << "\nexit codes: 0 ok, 1 load/run error, 2 usage error\n";
  return out.str();
}

}  // namespace lora_share
