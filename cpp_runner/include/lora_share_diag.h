/* lora_share_diag.h: what build/runner does beyond lora_share.h, for
 * benchmarks and diagnostics. An application does not need it; any
 * application may use it to do what the runner does:
 *
 *   - open with the loading variants a benchmark compares (ExecuTorch's stock
 *     Module per adapter, one planned-memory arena per program, the XNNPACK
 *     weight cache off) and load every adapter up front (ls_diag_open);
 *   - what loading did (ls_diag_loading_info), each adapter's shape and load
 *     time (ls_diag_adapter_info), the process's memory (ls_diag_memory_stats),
 *     how often XNNPACK re-planned its runtimes (ls_diag_xnnpack_reshapes),
 *     the program variants that skip absent LoRA slots (ls_diag_slot_variants);
 *   - a request's timings and logits rows, with the ids it stops at chosen by
 *     the caller (ls_diag_generate);
 *   - a script of requests through the batched decode step
 *     (ls_diag_batch_script).
 *
 * Not a stable API: it follows the runner's flags. Errors, threads and the
 * runtime's lock are as in lora_share.h.
 */
#ifndef LORA_SHARE_DIAG_H
#define LORA_SHARE_DIAG_H

#include "lora_share.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int stock;                 /* nonzero: each adapter is an executorch::extension::
                                Module(pte, ptd) of its own, with its own memory and
                                the weight cache off, as ExecuTorch's examples load
                                (runner --stock); no 'base' then */
  int private_arenas;        /* nonzero: each program its own planned memory
                                instead of one arena for all (--private-arenas) */
  int weight_cache;          /* default 1; 0: every program packs its own copy of
                                the foundation (--no-weight-cache) */
  int ignore_eos;            /* nonzero: read no EOS ids (the manifest.json beside
                                the .ptd is not read); --ignore-eos */
  int runner_messages;       /* nonzero: error messages name build/runner's flags
                                (--pte, --ptd, --no-verify, ...) rather than the
                                library's parameters */
  int threads;               /* ExecuTorch's threadpool, process-wide, set before
                                the first program loads: 0 (default) one thread
                                per core, else this many (--threads) */
  int huge_pages;            /* default 1; 0: leave the packed weights in 4 KiB
                                pages (--no-huge-pages) */
  const char* tokenizer_dir; /* the folder of the build's tokenizer and its
                                manifest.json (EOS ids, tokenizer, chat
                                template), checked against the foundation as
                                the .ptd's own folder is; NULL (default): the
                                .ptd's folder (--tokenizer) */
  int bind_tokenizer;        /* nonzero: bind the tokenizer (ls_runtime_tokenizer)
                                at open, before any adapter loads, so files that
                                do not go together are refused first
                                (LS_ERR_ARGUMENT); a folder without one is no
                                error (ls_runtime_tokenizer says so later) */
} ls_diag_options;

/* sizeof the public struct called `type_name` ("ls_options",
 * "ls_generate_options", "ls_token_info", "ls_runtime_stats", "ls_error"), 0 for another
 * name: lets a binding in another language check its layouts. */
LS_API size_t ls_diag_sizeof(const char* type_name);

/* The runtime's KV slot bookkeeping alone (runtime/batch/slot_table.h):
 * which slot a request takes and how many of its tokens the slot already
 * holds, without a program, for checking it against the Python reference
 * (lora_share/inference/batching.py's Slots). `ring` nonzero: a program with
 * ring slabs. ls_diag_slots_claim returns 0 and sets *slot and *kept, or 1
 * when every slot is busy; `adapter` is any key (equal keys: one adapter). */
typedef struct ls_diag_slots ls_diag_slots;
LS_API ls_diag_slots* ls_diag_slots_new(size_t slots, int ring);
LS_API void ls_diag_slots_free(ls_diag_slots* table);
LS_API int ls_diag_slots_claim(ls_diag_slots* table, uint64_t adapter, const int64_t* tokens, size_t n, size_t* slot,
                               size_t* kept);
LS_API void ls_diag_slots_fed(ls_diag_slots* table, size_t slot, const int64_t* tokens, size_t n);
LS_API void ls_diag_slots_release(ls_diag_slots* table, size_t slot);
/* Prefix hits so far, and the prompt tokens they skipped. */
LS_API void ls_diag_slots_hits(const ls_diag_slots* table, uint64_t* hits, uint64_t* tokens);

/* Speculative decoding's pieces alone, without a program (issue 60):
 * a request's drafter (runtime/batch/drafter.h: prompt lookup and its
 * prediction, the adaptive length), with the default options but
 * `max_drafts`; ls_diag_drafter_propose writes at most `room` drafts and
 * returns how many. ls_diag_accept_sampled: runtime/batch/drafts.h's
 * accept_sampled with a generator seeded by `seed` (draft_probs NULL: certain
 * drafts); writes the tokens gained (room for n) and returns how many. */
typedef struct ls_diag_drafter ls_diag_drafter;
LS_API ls_diag_drafter* ls_diag_drafter_new(const int64_t* prompt, size_t n_prompt, const int64_t* prediction,
                                            size_t n_prediction, size_t max_drafts);
LS_API void ls_diag_drafter_free(ls_diag_drafter* drafter);
LS_API void ls_diag_drafter_extend(ls_diag_drafter* drafter, const int64_t* tokens, size_t n);
LS_API size_t ls_diag_drafter_propose(ls_diag_drafter* drafter, int64_t* drafts, size_t room);
LS_API void ls_diag_drafter_feedback(ls_diag_drafter* drafter, size_t drafted, size_t accepted);
LS_API size_t ls_diag_accept_sampled(const int64_t* tokens, size_t n, const float* probs, int64_t vocab,
                                     const float* draft_probs, uint64_t seed, int64_t* gained);
/* The drafter's estimate of the chance that a draft is kept (Drafter::acceptance). */
LS_API double ls_diag_drafter_acceptance(const ls_diag_drafter* drafter);
/* The scheduler's width of a step that verifies drafts (runtime/batch/step_width.h): step costs of
 * 1..max_rows rows of 1..max_width tokens, ms[(r - 1) * max_width + w - 1] recorded for each shape
 * whose value is > 0 (0: never run), then best_width over `rows` rows, row i proposing drafts[i]
 * drafts, each kept with chance acceptance[i] when the one before it was. */
LS_API size_t ls_diag_best_width(const double* ms, size_t max_rows, size_t max_width, const size_t* drafts,
                                 const double* acceptance, size_t rows);

/* Defaults: the library's loading (shared program, one arena, weight cache
 * on), EOS ids read, the library's wording. The packed-weights file is
 * ls_options' (packed_cache, packed_cache_dir), as for ls_open. */
LS_API void ls_diag_options_init(ls_diag_options* options);

/* The whole message of the last error a call on this thread reported:
 * ls_error.message keeps at most 1023 bytes of it. Valid until the thread's
 * next failing call. */
LS_API const char* ls_diag_last_message(void);

/* For a command-line program, first thing in main: ExecuTorch's log lines go
 * to stderr when `verbose` (they are kept for error messages otherwise), and
 * an ExecuTorch abort or a crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL) becomes one
 * "error: ..." line on stderr and exit code 1; SIGPIPE is ignored. A library
 * must not install these for its host: ls_open does not. */
LS_API void ls_diag_init_process(int verbose);

/* Opens `ptd` (NULL or "": programs that carry every weight themselves) and
 * loads every `ptes[i]`, in order, named by its file stem. `options` (may be
 * NULL): shared_ptd, verify and the packed-weights file as for ls_open; a
 * budget is refused with diag->stock. Files given wrongly (an adapter for a
 * foundation without `ptd`, a manifest.json of another build, a
 * packed_cache_dir that cannot be written) are
 * LS_ERR_ARGUMENT; a file that cannot be loaded is LS_ERR_LOAD. */
LS_API ls_runtime* ls_diag_open(const char* ptd, const char* const* ptes, size_t n_ptes, const ls_options* options,
                                const ls_diag_options* diag, ls_error* error);

typedef struct {
  const char* mode;               /* "shared" or "stock" (static strings) */
  const char* arena;              /* "shared" (one for every program), "private" (one per
                                     program) or "module" (stock: each Module its own) */
  int weight_cache;               /* XNNPACK's weight cache, as the backend reports it */
  int64_t workspace_sharing_mode; /* as the backend reports it; -1: unread */
  int packed_cache_warm;          /* a valid packed-weights file was there before
                                     this runtime loaded (it maps it) */
  const char* packed_cache;       /* the packed-weights file in use, valid until
                                  ls_close; "" when the weights are packed in memory
                                  (cache off, stock, or no program loaded yet) */
  uint64_t planned_bytes;         /* planned memory the runtime allocated (arenas) */
  int threads;                    /* threads ExecuTorch's threadpool runs (--threads) */
} ls_diag_loading;

LS_API ls_status ls_diag_loading_info(ls_runtime* runtime, ls_diag_loading* info, ls_error* error);

typedef struct {
  const char* name; /* valid until ls_close */
  const char* pte;  /* the file it is loaded from; valid until ls_close */
  int64_t vocab_size;
  int64_t max_seq_len;
  int64_t prefill_chunk; /* most tokens one forward call takes */
  double load_ms;        /* its most recent load; 0 when not resident */
} ls_diag_adapter;

/* `adapter` NULL: the foundation alone ('base'). */
LS_API ls_status ls_diag_adapter_info(ls_runtime* runtime, const ls_adapter* adapter, ls_diag_adapter* info,
                                      ls_error* error);

/* The process's memory as the kernel accounts it (/proc/self/smaps_rollup
 * and VmHWM); a field it cannot read is -1. huge_kb: anonymous memory in
 * 2 MiB pages (AnonHugePages). */
typedef struct {
  int64_t rss_kb, pss_kb, anon_kb, file_kb, shmem_kb, peak_rss_kb, huge_kb;
} ls_diag_memory;

LS_API void ls_diag_memory_stats(ls_diag_memory* stats);

/* Calls to XNNPACK's xnn_reshape_runtime since the library loaded, process-
 * wide: `run` passed to XNNPACK (a runtime's first call, or an input changed
 * shape), `skipped` answered at once (no input changed shape: every decoded
 * token). LORA_SHARE_XNNPACK_RESHAPE=every-call runs them all. */
typedef struct {
  uint64_t run, skipped;
} ls_diag_reshapes;

LS_API void ls_diag_xnnpack_reshapes(ls_diag_reshapes* counts);

/* The program variants that skip the envelope slots a call leaves alone (a
 * slot no adapter of the call, or no row of a batched step, has LoRA on),
 * summed over the loaded programs: variant methods made, not made for want
 * of room in the memory budget, not made because a load failed (the call ran
 * the whole program: correct, not faster), and variants kept now. */
typedef struct {
  uint64_t made, refused, failed, resident;
} ls_diag_variants;

LS_API ls_status ls_diag_slot_variants(ls_runtime* runtime, ls_diag_variants* variants, ls_error* error);

/* The loops the decode attention kernels run (lora_share::attend, rope_attend):
 * "avx512", "avx2" or "portable" (a static string), picked for the CPU when
 * first used; LORA_SHARE_ATTEND_ISA=avx512|avx2|portable forces one it can run. */
LS_API const char* ls_diag_attend_isa(void);

typedef struct {
  float* logits;           /* NULL (default), or room for max_new_tokens x
                              vocab_size floats: row i is the logits token i
                              was picked from */
  const int64_t* stop_ids; /* with stop_ids_given: the ids generation stops
                              after, instead of the build's EOS ids */
  size_t n_stop_ids;
  int stop_ids_given;
  const char* prompt_label; /* names the prompt in request errors
                               ("--tokens"); NULL (default): "prompt" */
} ls_diag_generate_options;

typedef struct {
  size_t tokens;       /* generated */
  int64_t logits_rows; /* rows written to logits (0 without logits) */
  double prefill_ms, decode_ms;
  double prefill_tokens_per_s, decode_tokens_per_s; /* -1: nothing was timed */
} ls_diag_generation;

LS_API void ls_diag_generate_options_init(ls_diag_generate_options* options);

/* ls_generate (NULL adapter: 'base'), with `diag` (may be NULL: defaults)
 * and the request's figures in `out` (may be NULL). */
LS_API ls_status ls_diag_generate(ls_runtime* runtime, ls_adapter* adapter, const int64_t* prompt, size_t n,
                                  const ls_generate_options* options, const ls_diag_generate_options* diag,
                                  ls_token_callback on_token, void* user_data, ls_diag_generation* out,
                                  ls_error* error);

/* One request of a batch script (ls_diag_batch_script). */
typedef struct {
  ls_adapter* adapter; /* NULL: the foundation alone ('base') */
  const int64_t* prompt;
  size_t n_prompt;
  size_t slot;            /* its KV slot, < ls_options.parallel */
  int64_t max_new_tokens; /* greedy tokens; no stop ids */
  int64_t joins;          /* the decode step before which it arrives */
  int64_t* tokens;        /* out: room for max_new_tokens */
  float* logits;          /* out: NULL, or room for max_new_tokens x
                             vocab_size floats (row i: token i's logits) */
  size_t max_batch;       /* out: the most rows of a decode step it was in */
  /* Drafts (speculative decoding): NULL, or its answer as guessed; at each
     step it verifies the next tokens of it after as many as it has, at most
     max_drafts, and keeps those greedy decode would have picked. */
  const int64_t* prediction;
  size_t n_prediction;
  int64_t max_drafts;
  int64_t drafted;  /* out: drafts verified */
  int64_t accepted; /* out: drafts accepted */
  int64_t steps;    /* out: decode steps it was in */
} ls_diag_batch_request;

/* Runs `requests` through the batched engine (issue 47) of a runtime opened
 * with ls_options.parallel > 1, on a build with decode_batch: requests join
 * at their step, feed their prompt on their slot chunk by chunk, then
 * decode greedily, one decode_batch step over every live request (each its
 * own adapter, position and slot; with a prediction, its last token and its
 * drafts), and leave when done. Every adapter must fit the budget at once.
 * Usage errors (LS_ERR_ARGUMENT): no decode_batch, a slot out of range or
 * shared by two live requests, more live requests than rows, drafts on a
 * program exported before them. */
LS_API ls_status ls_diag_batch_script(ls_runtime* runtime, ls_diag_batch_request* requests, size_t n, ls_error* error);

/* The milliseconds of each of `steps` batched steps (ms: room for steps) of
 * `rows` rows on `adapter` (NULL: base), each on its own KV slot with
 * `prompt` fed, each carrying `tokens` tokens (its last one and tokens - 1
 * drafts; 1: a plain decode step), at the same positions step after step: the
 * cost of verifying drafts against decoding one token. */
LS_API ls_status ls_diag_time_steps(ls_runtime* runtime, ls_adapter* adapter, const int64_t* prompt, size_t n_prompt,
                                    size_t rows, size_t tokens, size_t steps, double* ms, ls_error* error);

#ifdef __cplusplus
}
#endif

#endif /* LORA_SHARE_DIAG_H */
