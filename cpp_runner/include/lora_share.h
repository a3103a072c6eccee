/* lora_share.h: the lora-share runtime as a C library.
 *
 * One runtime maps and packs a foundation (foundation.ptd) once and serves
 * any number of LoRA adapter programs (.pte) built against it:
 *
 *   ls_error err;
 *   ls_options opts;
 *   ls_options_init(&opts);
 *   ls_runtime* rt = ls_open("out/x/foundation.ptd", &opts, &err);
 *   ls_adapter* a = ls_load_adapter(rt, "out/x/support_bot.pte", &err);
 *   ls_generate_options g;
 *   ls_generate_options_init(&g);
 *   ls_generate(rt, a, prompt_ids, n, &g, on_token, user_data, &err);
 *   ls_close(rt);
 *
 * or, for a deployment folder written by `lora-share build` and a memory
 * budget, ls_open_dir(): every adapter its manifest.json lists is known, the
 * ones requests use are loaded on demand, and the least recently used are
 * evicted so the resident ones fit the budget.
 *
 * ERRORS. Every function that can fail takes an `ls_error*` the caller owns
 * (it may be NULL when the caller does not want the details) and returns an
 * ls_status (or NULL for handles). Nothing aborts or throws on bad input, a
 * bad file or a failed run: each is a code and a one-line message.
 *
 * THREADS. Different runtimes may be used from different threads at once.
 * ls_generate (and ls_generate_named / _text / _chat, which go through it)
 * may also be called from several threads on ONE runtime at once. With
 * ls_options.parallel = N > 1 the runtime has N KV slots and one scheduler
 * thread that owns its program: a call enqueues its request and blocks on its
 * own queue of tokens; the scheduler runs every queued request in one batch
 * (each decode step one row per request, each row with its own adapter, or
 * none, its own position and slot; a joining request's prompt is fed one
 * chunk per step between the others' steps). Each call's on_token callback
 * runs on the caller's own thread, so a slow callback slows only its own
 * request; a callback returning nonzero ends its request at the next step.
 * More than N calls at once wait for a free slot; a call on an adapter of
 * another program (another envelope) than the batch's waits until the batch
 * is empty (a deployment's adapters share one program). A slot keeps its tokens and
 * KV after a request: a later request on the same adapter whose prompt begins
 * with them continues from there (ls_runtime_stats.prefix_hits; a call with
 * ls_generate_options.cache_prompt = 0 does not). Nothing else of a request
 * outlives it: the KV rows past what a slot keeps are zeroed before the next
 * request reads them, and a slot whose KV holds inf or NaN after its request
 * is zeroed and never continued (ls_runtime_stats.slots_cleared), so what
 * one request computes, however absurd its adapter, cannot change another's
 * answer. An adapter a running request uses stays resident (the budget's
 * LRU eviction skips it) until the request ends; a request that needs room
 * those hold waits (MEMORY BUDGET). Loading an adapter whose program needs
 * more planned memory than the runtime's arena holds (another envelope)
 * re-plans that memory: requests running in the scheduler then end with
 * LS_ERR_RUN ("run it again"); load such adapters before serving.
 * With parallel = 1 (the default) calls run one at a time, each from
 * position 0 (no prefix is kept; the KV rows a request wrote are zeroed when
 * it ends): with speculation on (the default; SPECULATION) in the scheduler,
 * a call waiting there with the runtime's lock released as above, so that
 * its drafts are verified in decode_batch; with ls_options.speculation = 0
 * under the runtime's lock, on the one-row path (forward, then decode).
 * Every other call on a runtime (loading, stats, programs) takes that lock
 * too; a callback (on_token, on_text) must not call back into the runtime it
 * was called from: that returns LS_ERR_BUSY.
 * The XNNPACK settings the runtime needs (weight cache on, one workspace) are
 * process-wide, as are ExecuTorch's operator registrations.
 *
 * MEMORY BUDGET (ls_options.budget_bytes, 0 = unlimited). The budget covers
 * the memory the runtime controls, accounted as:
 *   foundation   the size of foundation.ptd (plus adapters_shared.ptd): its
 *                weights, packed by XNNPACK once, or mapped; plus 8 MiB for
 *                the runtime's own state (ExecuTorch and XNNPACK allocations,
 *                the shared workspace);
 *   programs     per distinct program loaded (every adapter of a deployment
 *                carries the same one, named by its sha256 in the adapter's
 *                record): 1.2 x its .pte size without adapter data + 4 MiB
 *                per method it runs (forward, and decode when it has one,
 *                and decode_batch with parallel > 1 or with one slot that
 *                speculates: each method's state and XNNPACK runtimes);
 *   arena        the planned memory (KV cache and activations) every program
 *                shares, sized to the largest program: its allocated bytes.
 *                Its KV cache is `parallel` slots, each a whole context
 *                (slot_bytes in ls_runtime_stats is one slot's), so a budget
 *                holds parallel x slot_bytes of KV;
 *   adapters     per resident adapter, 1.05 x its own LoRA bytes (the tensors
 *                its .pte holds, not those in adapters_shared.ptd) + an
 *                overhead (adapter_overhead_bytes, default 512 KiB): an upper
 *                bound of the process PSS one more resident adapter costs (its
 *                mapped LoRA tensors bound as the program's inputs);
 *                `lora-share bench-budget` and `bench-scale` measure it.
 * With the packed-weights file (PACKED WEIGHTS) the packed foundation is
 * that file's pages, mapped and shared with every process that maps it,
 * instead of memory of the runtime's own: the same accounted bytes, and a
 * process PSS no higher than packing in memory.
 * It does not cover the process's code, libraries or the caller's memory.
 * Before an adapter is loaded, the least recently used resident adapters are
 * evicted until its cost fits; an adapter a running request uses is never
 * evicted. Loads are admitted against the budget as a whole, so the
 * accounted total never exceeds it, concurrent requests included: with
 * parallel > 1, a request whose adapter fits only once running requests end
 * waits for them (first in line; the adapter of one of them is then
 * evicted), and one that cannot fit even then is LS_ERR_BUDGET; an
 * ls_load_adapter whose room running requests hold registers the adapter,
 * which loads at its first request. A budget below foundation + the adapter's
 * program + arena + the largest adapter is refused (LS_ERR_BUDGET) when the
 * runtime opens, or when ls_load_adapter registers such an adapter. A
 * program stays loaded once used (evicting an adapter unmaps its tensors
 * only), so switching adapters never repacks the foundation.
 *
 * PACKED WEIGHTS (ls_options.packed_cache, on by default). XNNPACK repacks
 * every foundation weight into its own layout when a program loads, most of
 * a start. The first start writes the packed weights to a file and every
 * later one maps it instead: <foundation's folder>/.packed/<key>.bin when
 * that folder can be written, else $XDG_CACHE_HOME/lora-share/packed (or
 * ~/.cache/lora-share/packed), or ls_options.packed_cache_dir. The file is
 * written under a temporary name and renamed when complete; it holds its key
 * (the foundation's fingerprint, the program's sha256, the ExecuTorch and
 * lora-share versions, the CPU's features), checked before it is mapped. A
 * file that is truncated, damaged or for another key is ignored with a
 * one-line note on stderr and written again; with no folder to write in,
 * the weights are packed in memory (also noted). Processes map one file at
 * once; deleting it is always safe (the next start writes it again).
 */
#ifndef LORA_SHARE_H
#define LORA_SHARE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define LS_API
#else
#define LS_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The most KV slots (ls_options.parallel) a runtime may have, and the length
 * of ls_runtime_stats.batch_size_counts. */
#define LS_MAX_PARALLEL 32

/* ls_options.speculation (SPECULATION). */
#define LS_SPECULATION_OFF 0
#define LS_SPECULATION_ON 1
#define LS_SPECULATION_EVERY_DRAFT 2

/* The name that asks for the foundation alone (no adapter): ls_generate_named
 * and ls_check_request take it; no adapter may be called that. */
#define LS_BASE_NAME "base"

typedef enum {
  LS_OK = 0,
  LS_ERR_ARGUMENT = 1,  /* a NULL pointer, a bad option value */
  LS_ERR_NOT_FOUND = 2, /* no adapter by that name */
  LS_ERR_LOAD = 3,      /* a file is missing, damaged, of the wrong kind, or
                           built for another foundation */
  LS_ERR_REQUEST = 4,   /* the request does not fit the program: token ids
                           outside the vocabulary, max_new_tokens < 1, prompt
                           + new tokens longer than the context, a constraint
                           that is invalid or unsupported */
  LS_ERR_RUN = 5,       /* the program failed while running */
  LS_ERR_BUDGET = 6,    /* the memory budget cannot hold what is asked */
  LS_ERR_BUSY = 7       /* called from inside this runtime's own callback */
} ls_status;

/* Filled by every failing call; untouched fields are undefined on success. */
typedef struct {
  ls_status code;
  char message[1024]; /* one line, NUL-terminated, truncated if longer */
} ls_error;

typedef struct ls_runtime ls_runtime; /* one foundation, its adapters */
typedef struct ls_adapter ls_adapter; /* an adapter the runtime knows: valid
                                         until ls_close, resident or not */

typedef struct {
  const char* shared_ptd;          /* adapters_shared.ptd for ls_open, or NULL;
                                      ls_open_dir reads it from manifest.json */
  int verify;                      /* nonzero (default): refuse an adapter whose
                                      record names another foundation */
  uint64_t budget_bytes;           /* 0 (default): no budget, nothing is evicted */
  uint64_t adapter_overhead_bytes; /* the per-adapter constant of the budget's
                             accounting (MEMORY BUDGET); 0 (default): 512 KiB */
  int parallel;                    /* KV slots, 1..LS_MAX_PARALLEL: requests that run
                                      in one batch at once (THREADS); default 1: one
                                      request at a time (which still verifies drafts:
                                      SPECULATION) */
  int packed_cache;                /* nonzero (default): keep XNNPACK's packed weights
                                      in a file between starts (PACKED WEIGHTS); 0:
                                      pack them in memory at every start */
  const char* packed_cache_dir;    /* NULL (default): the file beside the
                                foundation (<its folder>/.packed/) when that
                                folder can be written, else in the user's cache
                                folder; else this folder (made if missing; one
                                that cannot be written is refused at open) */
  int speculation;                 /* LS_SPECULATION_ON (default): requests may verify
                                      drafts (SPECULATION), with any parallel, each
                                      step as many as pay for its width (timed);
                                      LS_SPECULATION_EVERY_DRAFT: every draft found
                                      (draft counts that timing cannot move: tests,
                                      comparisons); LS_SPECULATION_OFF: none
                                      (--no-speculation), and one slot then loads no
                                      decode_batch (less memory: SPECULATION) */
} ls_options;

/* STRUCTURED OUTPUT (docs/structured-output.md). ls_generate_options.
 * constraint restricts the answer to a language: each generated token is
 * one the constraint allows after the tokens before it (a mask over the
 * vocabulary, per request, so a batch mixes constrained rows, free rows and
 * adapters freely). The end-of-sequence id is allowed exactly where the
 * language can end, and is all that is allowed once it must; a constrained
 * answer that reaches max_new_tokens first is cut there (as any answer).
 * The grammars are xgrammar's (built into the library), compiled for the
 * build's tokenizer (a build without one, or without EOS ids, refuses every
 * constraint) and kept in a cache keyed by kind and text: a schema compiles
 * once, then every request that gives it starts at once (ls_runtime_stats
 * counts both). Each constrained row's mask is filled on a worker thread
 * while the step that computes the row's logits runs.
 * Refused (LS_ERR_REQUEST, naming the kind and what is wrong): text that is
 * not valid JSON or not a schema, a schema keyword the engine would not
 * enforce (not, if/then/else, uniqueItems, contains, dependent..., multipleOf
 * on numbers, a $ref outside the schema or to nothing, ...), a grammar or
 * regex that does not parse, an empty list of choices or an empty choice. */
typedef enum {
  LS_CONSTRAINT_NONE = 0,        /* free text (default) */
  LS_CONSTRAINT_JSON_SCHEMA = 1, /* constraint_text: a JSON Schema (draft
                                    2020-12's keywords); the answer is compact
                                    JSON that validates against it; properties
                                    and items it does not name are not
                                    generated */
  LS_CONSTRAINT_JSON_OBJECT = 2, /* any JSON object (OpenAI's json_object);
                                    constraint_text NULL */
  LS_CONSTRAINT_GRAMMAR = 3,     /* constraint_text: an EBNF grammar in
                                    llama.cpp's GBNF notation, root rule
                                    "root" */
  LS_CONSTRAINT_REGEX = 4,       /* constraint_text: a regular expression the
                                    whole answer matches */
  LS_CONSTRAINT_CHOICES = 5      /* choices: the answer is one of them,
                                    exactly */
} ls_constraint_kind;

/* One generated token and what the request asked to know of it, for
 * ls_generate_options.on_token_info. Valid during the call only. */
typedef struct {
  int64_t token;
  int32_t choice;            /* which of the request's n answers: 0..n-1 */
  float logprob;             /* with logprobs: the token's log-probability,
                                log_softmax of the model's raw logits (before
                                temperature, penalties, logit_bias and the
                                constraint's mask); NAN without */
  int32_t n_top;             /* top_logprobs, or fewer with a smaller vocab */
  const int64_t* top_ids;    /* the n_top likeliest ids under those same raw
                                logits, likeliest first (equal: lower id) */
  const float* top_logprobs; /* their log-probabilities */
} ls_token_info;

/* Called with each generated token of each choice, before on_token. Return
 * 0 to go on, nonzero to stop that choice. */
typedef int (*ls_token_info_callback)(const ls_token_info* info, void* user_data);

typedef struct {
  int64_t max_new_tokens; /* default 16; at least 1 */
  double temperature;     /* default 0: greedy (argmax) */
  uint64_t seed;          /* sampling seed when temperature > 0 */
  int ignore_eos;         /* 0 (default): stop after the build's end-of-
                             sequence id (it is the last token on_token
                             sees), as transformers' generate does; nonzero:
                             generate max_new_tokens whatever comes (refused
                             with a constraint, which ends at EOS). The EOS
                             ids are the tokenizer section's of the
                             manifest.json beside the foundation.ptd; a build
                             without a tokenizer has none. */
  /* How each token is picked beyond temperature (transformers' warpers and
   * penalties, OpenAI's presence/frequency; see runtime/sampler.h): the
   * filters act only when temperature > 0, the penalties always. */
  int64_t top_k;            /* default 0: off; else the k likeliest ids */
  double top_p;             /* default 1: off; [0, 1] (0: the likeliest id) */
  double min_p;             /* default 0: off; [0, 1] */
  double repeat_penalty;    /* default 1: off; > 0, over prompt + answer */
  double presence_penalty;  /* default 0; [-2, 2], over the answer */
  double frequency_penalty; /* default 0; [-2, 2], over the answer */
  int cache_prompt;         /* nonzero (default): with parallel > 1, continue
                               from a KV slot that holds the prompt's start
                               on the same adapter (THREADS); 0: feed the
                               whole prompt. The same request can then answer
                               differently with and without a hit: the reused
                               tokens' KV was computed in other chunks, and a
                               quantized (8da4w) foundation amplifies those
                               last-bit differences (llama.cpp's cache_prompt
                               has the same caveat). 0 makes an answer
                               independent of what ran before it. */
  /* STRUCTURED OUTPUT (above). */
  int constraint;              /* ls_constraint_kind; default NONE */
  const char* constraint_text; /* UTF-8, NUL-terminated: the schema, grammar or
                                  regex; NULL for NONE, JSON_OBJECT, CHOICES */
  const char* const* choices;  /* CHOICES: n_choices UTF-8 strings */
  size_t n_choices;
  /* OpenAI's logit_bias: n_logit_bias ids (within the vocabulary), each
   * logit plus its value in [-100, 100] before the constraint's mask and
   * sampling; -100 bans the id. Default none. */
  const int64_t* logit_bias_ids;
  const double* logit_bias_values;
  size_t n_logit_bias;
  /* Log-probabilities (OpenAI's logprobs, top_logprobs), handed to
   * on_token_info: log_softmax of the model's raw logits at each step. */
  int logprobs;     /* nonzero: each token's logprob; default 0 */
  int top_logprobs; /* 0..20 likeliest ids with theirs (needs logprobs);
                       default 0 */
  /* n answers to one prompt (OpenAI's n), default 1, at most
   * LS_MAX_PARALLEL: the prompt is fed once and each choice continues from
   * its KV with its own sampler (choice i seeded seed + i) and its own
   * constraint state. With parallel > 1 the choices are rows of one batch
   * (n rows must be free at once; n above the batch's rows is LS_ERR_REQUEST);
   * with parallel = 1 they run one after the other (a program with sliding-
   * window layers feeds the prompt again for each: its ring rows are
   * overwritten). n > 1 needs on_token_info (on_token cannot tell the choices
   * apart: it must be NULL) and is refused by the text calls. */
  int n;
  ls_token_info_callback on_token_info; /* NULL (default), or called with each
                                           token of each choice */
  void* token_info_user_data;
  /* SPECULATION. With a program whose decode_batch takes drafts (exporter
   * revision 14), each step a row may carry its last token and up to 8
   * guessed next ones (drafts: prompt lookup over the prompt and the answer
   * so far, and `prediction`), checked in the one batched step: each token is
   * picked from the logits after the one before it, exactly as one-token
   * decode picks it, and the drafts are kept while they are the picks.
   * Answers are the same with and without (greedy: the same ids; sampled:
   * the same draws of the same seed); only the speed differs. With parallel
   * = 1 too (docs/batching.md, "One slot"): the runtime then loads
   * decode_batch, whose activations are planned for 16 rows x 9 tokens (on
   * the SmolLM2-135M demo, 20 MiB more planned memory and about 21 MiB more
   * PSS); steps without drafts, a request of n > 1 choices and one with
   * speculative = 0 run on the one-row path. */
  int speculative;           /* nonzero (default): draft; 0: never */
  const int64_t* prediction; /* OpenAI's Predicted Outputs: the answer as the
                                caller expects it, ids; NULL (default): none */
  size_t n_prediction;
  uint64_t* drafted;  /* NULL (default), or set when the call returns: the
                         drafts verified for this request */
  uint64_t* accepted; /* NULL, or set: those of them kept */
} ls_generate_options;

/* Called with each generated token id, in order. Return 0 to go on, nonzero
 * to stop generating (ls_generate then returns LS_OK). */
typedef int (*ls_token_callback)(int64_t token, void* user_data);

typedef struct {
  uint32_t adapters_known;    /* registered: the manifest's, plus loaded ones,
                                 less removed ones */
  uint32_t adapters_resident; /* loaded now */
  uint64_t loads;             /* adapter loads (first use or after eviction) */
  uint64_t evictions;         /* adapters unloaded to fit the budget */
  uint64_t hits;              /* requests whose adapter was resident */
  double last_load_ms;        /* the most recent load (open + forward) */
  double total_load_ms;
  uint64_t budget_bytes;     /* 0 = none */
  uint64_t foundation_bytes; /* accounted, see MEMORY BUDGET */
  uint64_t program_bytes;    /* accounted cost of every known program */
  uint64_t arena_bytes;
  uint64_t resident_adapter_bytes; /* accounted cost of the resident adapters */
  uint64_t largest_adapter_bytes;  /* accounted cost of the largest known one */
  int64_t process_pss_bytes;       /* the whole process's PSS now; -1 if unreadable */
  /* Batching (THREADS); with parallel = 1: parallel 1, no prefix hits, and
   * the decode steps of a runtime that speculates (SPECULATION), else 0. */
  uint32_t parallel;                           /* KV slots (ls_options.parallel) */
  uint32_t slots_in_use;                       /* requests running now */
  uint64_t prefix_hits;                        /* requests that continued a slot's tokens */
  uint64_t prefix_tokens;                      /* prompt tokens those hits did not feed again */
  uint64_t batch_steps;                        /* decode steps run */
  uint64_t batch_size_counts[LS_MAX_PARALLEL]; /* [b - 1]: steps of b rows */
  uint64_t slot_bytes;                         /* one slot's KV bytes (every layer's K and V) */
  uint64_t prompt_tokens_fed;                  /* prompt tokens run through the model: a prefix
                                                  hit's kept tokens are not, and n choices feed
                                                  their prompt once */
  /* STRUCTURED OUTPUT: what constraints cost. */
  uint64_t constraint_compiles;   /* constraints compiled (cache misses) */
  double constraint_compile_ms;   /* their total time */
  uint64_t constraint_cache_hits; /* requests whose constraint was compiled */
  double constraint_cache_hit_ms; /* their lookups' total time */
  uint64_t masked_tokens;         /* tokens picked under a mask */
  double mask_ms;                 /* total time filling those masks (on the
                                     mask worker, beside the model's step) */
  double mask_wait_ms;            /* total time picks waited for their mask
                                     after the step: what masks added to
                                     decoding */
  uint64_t slots_cleared;         /* slots whose KV held a non-finite value after
                                     a request: cleared, not continued (THREADS) */
  /* SPECULATION: drafts verified in all, and those kept. */
  uint64_t drafted_tokens;
  uint64_t accepted_tokens;
} ls_runtime_stats;

/* Defaults: no shared file, verify on, no budget, one slot. */
LS_API void ls_options_init(ls_options* options);
/* Defaults: 16 new tokens, greedy, seed 0, stop at EOS, no filter or
 * penalty, no constraint, bias or logprobs, one choice, no token info. */
LS_API void ls_generate_options_init(ls_generate_options* options);
/* "LS_OK", "LS_ERR_LOAD", ...; "unknown" for any other value. */
LS_API const char* ls_status_name(ls_status code);

/* Maps `ptd` (and options->shared_ptd). Adapters come with ls_load_adapter.
 * `options` may be NULL (defaults). The build's EOS ids are read from the
 * manifest.json beside `ptd` (none without one); a manifest whose tokenizer
 * section names another foundation is refused (LS_ERR_LOAD). */
LS_API ls_runtime* ls_open(const char* ptd, const ls_options* options, ls_error* error);
/* A deployment folder: checks manifest.json, the foundation and every adapter
 * it lists, sizes the arena to the largest program and loads none yet. */
LS_API ls_runtime* ls_open_dir(const char* dir, const ls_options* options, ls_error* error);
/* Unloads everything. NULL is ignored. Handles of `runtime` become invalid.
 * Called from inside this runtime's own on_token callback it does nothing
 * (it cannot report that: it returns void); close after ls_generate returns. */
LS_API void ls_close(ls_runtime* runtime);

/* Checks `pte` against the foundation and loads it now (evicting others if
 * the budget needs it; when the budget's room is held by adapters running
 * requests use, it is registered and loads at its first request instead).
 * Loading a path already known returns its handle. Its name is the file stem
 * and must be new. */
LS_API ls_adapter* ls_load_adapter(ls_runtime* runtime, const char* pte, ls_error* error);
/* Removes the adapter called `name`: from the moment it is called, new
 * requests on it (by name or by its handle) are LS_ERR_NOT_FOUND and the name
 * is free for ls_load_adapter again; requests already running on it finish on
 * it; then it is unloaded and the call returns. Its handle stays valid memory
 * until ls_close (ls_adapter_name still answers) but serves nothing; the
 * other adapters' handles and ls_adapter_at's order, less this one, are
 * unchanged. LS_ERR_NOT_FOUND: no adapter by that name ("base" included). */
LS_API ls_status ls_remove_adapter(ls_runtime* runtime, const char* name, ls_error* error);
/* The adapter called `name` (manifest name or file stem), loaded or not. */
LS_API ls_adapter* ls_adapter_by_name(ls_runtime* runtime, const char* name, ls_error* error);
/* The adapter registered `index`-th (0 <= index < ls_runtime_stats.
 * adapters_known: a folder's manifest order, then ls_load_adapter's), loaded
 * or not; LS_ERR_NOT_FOUND past the end. */
LS_API ls_adapter* ls_adapter_at(ls_runtime* runtime, size_t index, ls_error* error);
/* The adapter's name, valid until ls_close; "" for NULL. */
LS_API const char* ls_adapter_name(const ls_adapter* adapter);
/* Nonzero when `adapter` is loaded now. */
LS_API int ls_adapter_resident(const ls_adapter* adapter);

/* MIXES. Adapters of one runtime mixed with scales, run as one adapter: on
 * each envelope slot (a linear of a layer) their A matrices stacked along the
 * rank and their B matrices (each carrying its adapter's LoRA scale) scaled
 * by the term's scale and stacked, as peft's add_weighted_adapter(adapters,
 * weights, combination_type="cat") combines them. Adapters are inputs of the
 * one program every adapter of a deployment runs, so a mix is data too: no
 * export, no other program, while the summed rank fits the envelope. */
typedef struct {
  const char* name; /* an adapter the runtime knows ("base" is none) */
  double scale;     /* in [-LS_MAX_LORA_SCALE, LS_MAX_LORA_SCALE]: 1 the
                       adapter as trained, 0 nothing of it, negative its
                       opposite */
} ls_lora_term;

/* The largest |scale| of a mix's term: ComfyUI's bound for a LoRA's strength
 * (its LoraLoader takes -100..100). Scales in use are a few units (peft's
 * add_weighted_adapter weights, llama.cpp's --lora-scaled); far beyond, an
 * adapter's delta drowns the foundation's weights and the answer is noise,
 * and scales such as 1e30 overflow float32 activations to inf and NaN. The
 * bound refuses those as the request's mistake. What a request computes
 * within it stays its own: no KV row of it is read by another request, and a
 * KV slot that holds a non-finite value after its request is cleared, never
 * continued (THREADS). */
#define LS_MAX_LORA_SCALE 100.0

/* The mix of `n` terms, in order: a handle usable wherever an adapter's is
 * (ls_generate, ls_adapter_name, ls_adapter_resident), named after its terms
 * ("brief*0.5+json*1.1", scales written shortest), a name every call that
 * takes one accepts while the mix is held (ls_generate_named, ls_generate_text,
 * ls_generate_chat, ls_check_request, ls_context_length, ls_adapter_by_name).
 * A mix of one adapter at scale 1 is that adapter, bit for bit.
 * Refused: n == 0 or a NULL name (LS_ERR_ARGUMENT); a name the runtime does
 * not know (LS_ERR_NOT_FOUND); a scale outside [-LS_MAX_LORA_SCALE,
 * LS_MAX_LORA_SCALE] or not finite (the message names the term, the value
 * and the range), a summed rank on
 * a slot above the envelope's max rank (the message names the slot, the sum
 * and the bound), adapters whose files carry different program variants
 * (lora_envelope.skip_absent with other slots) (LS_ERR_REQUEST); a mix the
 * memory budget cannot hold beside the foundation (LS_ERR_BUDGET).
 * LIFETIME. Each call holds the mix once; the same terms (names and scales,
 * in order) give the same handle while it is held. ls_adapter_release drops
 * one hold; the last frees the mix, and its handle and name are invalid
 * after. ls_close frees every mix. Release a mix after the requests using it
 * have returned. The mix owns its tensors: its terms may be evicted, it does
 * not change.
 * MEMORY. Its tensors are composed on first use (its terms' files are read
 * then and not kept mapped) and the budget counts them as an adapter's
 * (1.05 x the terms' LoRA bytes + adapter_overhead_bytes); mixes and adapters
 * are evicted least recently used first, and an evicted mix is composed again
 * on its next use. A mix is not one of adapters_known (nor ls_adapter_at's). */
LS_API ls_adapter* ls_adapter_mix(ls_runtime* runtime, const ls_lora_term* terms, size_t n, ls_error* error);
/* Drops one hold of the mix `adapter` (see ls_adapter_mix). NULL is ignored;
 * an adapter that is no mix is LS_ERR_ARGUMENT (adapters live until ls_close). */
LS_API ls_status ls_adapter_release(ls_adapter* adapter, ls_error* error);

/* Prefill `prompt` (n ids), then generate up to options->max_new_tokens,
 * calling on_token (may be NULL) with each. Loads the adapter first if it is
 * not resident. `options` may be NULL (defaults).
 * A NULL `adapter` is the foundation alone ("base"): the program of the
 * first adapter the runtime knows, every LoRA input a zero rank-1 pair (at
 * least one adapter must be known: LS_ERR_REQUEST otherwise). */
LS_API ls_status ls_generate(ls_runtime* runtime, ls_adapter* adapter, const int64_t* prompt, size_t n,
                             const ls_generate_options* options, ls_token_callback on_token, void* user_data,
                             ls_error* error);
/* ls_generate for the adapter called `name`; "base" is the foundation alone
 * (as a NULL adapter for ls_generate). */
LS_API ls_status ls_generate_named(ls_runtime* runtime, const char* name, const int64_t* prompt, size_t n,
                                   const ls_generate_options* options, ls_token_callback on_token, void* user_data,
                                   ls_error* error);

/* Whether ls_generate_named would accept this request, without loading the
 * adapter or generating ("base" too): LS_ERR_NOT_FOUND for an unknown name, LS_ERR_REQUEST
 * (with ls_generate's message) for ids outside the vocabulary, an empty
 * prompt, max_new_tokens < 1 or a request longer than the context. A server
 * asks this before it answers, so a bad request gets an error, not a stream. */
LS_API ls_status ls_check_request(ls_runtime* runtime, const char* name, const int64_t* prompt, size_t n,
                                  int64_t max_new_tokens, ls_error* error);

/* Whether ls_generate_named would accept `options` for the adapter called
 * `name` ("base" too), without generating: every option's range
 * (LS_ERR_ARGUMENT, as ls_generate), logit_bias ids outside the vocabulary
 * and the constraint (LS_ERR_REQUEST, with ls_generate's message). The
 * constraint is compiled into the runtime's cache, so the request that
 * follows starts at once. A server asks this before it answers. */
LS_API ls_status ls_check_options(ls_runtime* runtime, const char* name, const ls_generate_options* options,
                                  ls_error* error);

/* The context (max_seq_len) of the program adapter `name` runs ("base"
 * too), into *max_seq_len: a prompt of n ids leaves room for
 * max_seq_len - n + 1 new tokens. LS_ERR_NOT_FOUND for an unknown name. */
LS_API ls_status ls_context_length(ls_runtime* runtime, const char* name, int64_t* max_seq_len, ls_error* error);

/* The runtime's counters and accounted memory. */
LS_API ls_status ls_stats(ls_runtime* runtime, ls_runtime_stats* stats, ls_error* error);

/* TEXT. A build whose checkpoint shipped a tokenizer has its tokenizer.json
 * (and manifest.json's tokenizer section: EOS ids, the chat template resolved
 * into text pieces) beside foundation.ptd. These calls use those files, with
 * the semantics of Hugging Face's `tokenizers` library, and render chat
 * messages as build/lora-share-server does: no tokenizer of your own needed.
 * A tokenizer may be used from several threads (its calls are serialised);
 * a detokenizer from one thread at a time. */
typedef struct ls_tokenizer ls_tokenizer;
typedef struct ls_detokenizer ls_detokenizer;

typedef struct {
  const char* role;    /* "system", "user", "assistant": the template's roles */
  const char* content; /* UTF-8, NUL-terminated */
} ls_chat_message;

/* A tokenizer from files: `path` a build's output folder (its manifest.json's
 * tokenizer, checked against its foundation.ptd as the runner checks it: the
 * chat template and EOS ids come with it) or a tokenizer.json file alone (no
 * chat template). Close it with ls_tokenizer_close. */
LS_API ls_tokenizer* ls_tokenizer_open(const char* path, ls_error* error);
/* NULL is ignored. Not for the runtime's own (ls_runtime_tokenizer). */
LS_API void ls_tokenizer_close(ls_tokenizer* tokenizer);
/* The tokenizer of the build beside the runtime's foundation.ptd (bound on
 * first ask, checked against the foundation), owned by the runtime: valid
 * until ls_close. LS_ERR_NOT_FOUND when the build has none. */
LS_API ls_tokenizer* ls_runtime_tokenizer(ls_runtime* runtime, ls_error* error);

/* Encodes `length` bytes of UTF-8 `text` (add_special nonzero: with the
 * tokenizer's special tokens, BOS where the model has one, as
 * `Tokenizer.encode(text).ids`). Sets *n_ids to the number of ids; writes
 * them to `ids` only when `capacity` holds them all (call with capacity 0 to
 * size a buffer). Text that is not valid UTF-8 is LS_ERR_REQUEST. */
LS_API ls_status ls_tokenize(ls_tokenizer* tokenizer, const char* text, size_t length, int add_special, int64_t* ids,
                             size_t capacity, size_t* n_ids, ls_error* error);

/* Text from ids as they arrive: each ls_detokenize call takes the next `n`
 * ids (n may be 0) and sets *text / *length to the text they complete (valid
 * until the next call on `detokenizer`): never part of a UTF-8 character,
 * text is held back while it ends inside one. `flush` nonzero hands out
 * what is held back too (the end of the output). The pieces joined are
 * `Tokenizer.decode(all ids, skip_special_tokens)`. */
LS_API ls_detokenizer* ls_detokenizer_new(ls_tokenizer* tokenizer, int skip_special, ls_error* error);
LS_API void ls_detokenizer_free(ls_detokenizer* detokenizer);
LS_API ls_status ls_detokenize(ls_detokenizer* detokenizer, const int64_t* ids, size_t n, int flush, const char** text,
                               size_t* length, ls_error* error);

/* The prompt text of `n` chat messages in the build's chat template (with
 * the generation prompt), as build/lora-share-server renders them; encode it
 * with add_special = 0 (the template holds its special tokens). Sets *length
 * to its bytes; writes them and a NUL to `buffer` only when `capacity` holds
 * length + 1. LS_ERR_NOT_FOUND: the build has no chat template;
 * LS_ERR_REQUEST: a role the template does not know. */
LS_API ls_status ls_apply_chat_template(ls_tokenizer* tokenizer, const ls_chat_message* messages, size_t n,
                                        char* buffer, size_t capacity, size_t* length, ls_error* error);

/* Called with each piece of generated text (UTF-8, whole characters, not
 * NUL-terminated). Return 0 to go on, nonzero to stop. */
typedef int (*ls_text_callback)(const char* text, size_t length, void* user_data);

typedef enum {
  LS_FINISH_LENGTH = 0,   /* max_new_tokens generated */
  LS_FINISH_EOS = 1,      /* an end-of-sequence id ended it (OpenAI's "stop") */
  LS_FINISH_CALLBACK = 2, /* the callback asked to stop */
  LS_FINISH_STOP = 3      /* one of a request's stop strings ended it (REQUESTS;
                             OpenAI's "stop" too) */
} ls_finish_reason;

typedef struct {
  uint64_t prompt_tokens;     /* the prompt's ids */
  uint64_t completion_tokens; /* generated ids, an EOS that ended it excluded */
  ls_finish_reason finish_reason;
  /* SPECULATION (REQUESTS): drafts kept and drafts not, as OpenAI's
   * usage.completion_tokens_details names them */
  uint64_t accepted_prediction_tokens;
  uint64_t rejected_prediction_tokens;
} ls_text_result;

/* ls_generate_named with text: `prompt` (UTF-8) encoded with the runtime's
 * tokenizer and its special tokens, the answer decoded as it arrives and
 * handed to on_text (may be NULL) in whole characters; EOS ids are never
 * text. `result` (may be NULL) says how it ended. */
LS_API ls_status ls_generate_text(ls_runtime* runtime, const char* name, const char* prompt,
                                  const ls_generate_options* options, ls_text_callback on_text, void* user_data,
                                  ls_text_result* result, ls_error* error);
/* ls_generate_text for chat messages rendered by ls_apply_chat_template. */
LS_API ls_status ls_generate_chat(ls_runtime* runtime, const char* name, const ls_chat_message* messages, size_t n,
                                  const ls_generate_options* options, ls_text_callback on_text, void* user_data,
                                  ls_text_result* result, ls_error* error);

/* The build's end-of-sequence ids generation stops after (the tokenizer
 * section of its manifest.json; none without one, or when the runtime was
 * opened not to read them): *ids (valid until ls_close, NULL when n is 0)
 * and *n. An application that decodes ids itself keeps these out of its text
 * when it generates past them (ignore_eos). */
LS_API ls_status ls_runtime_eos_ids(ls_runtime* runtime, const int64_t** ids, size_t* n, ls_error* error);

/* REQUESTS. The one request schema of every door: build/lora-share-server's
 * POST /v1/completions and /v1/chat/completions, build/runner --serve's JSON
 * lines and lora_share.Runtime's create_completion / create_chat_completion
 * send the same OpenAI JSON body through these calls, so every field is taken,
 * checked and answered the same way whatever the door (docs/server.md lists
 * the fields, their defaults and ranges):
 *
 *   ls_request* r = ls_request_parse(LS_REQUEST_CHAT, body, strlen(body), &err);
 *   if (r != NULL && ls_request_prepare(rt, r, &err) == LS_OK)   // a bad request ends here
 *     ls_request_run(rt, r, on_event, user_data, NULL, &err);     // the OpenAI JSON events
 *   ls_request_free(r);
 *
 * PARSE reads the body alone. It is refused while it is read, before any
 * value is built from it, when it is over LS_REQUEST_MAX_BYTES or nests
 * arrays and objects deeper than LS_REQUEST_MAX_DEPTH (the body's own object
 * is level 1), so no body makes the library recurse deeply or hold more than
 * its bytes' worth. Then every field's type and range is checked. The fields
 * that shape the answer are served (docs/structured-output.md):
 * response_format (json_object, json_schema), llama-server's grammar and
 * json_schema, logprobs with top_logprobs, logit_bias, n, and chat's tools
 * with tool_choice (the history's tool_calls and tool messages rendered in a
 * generic format). A field that would change the answer and is not served
 * (best_of > 1, echo, suffix, functions, ...) is refused by
 * name unless it holds its no-op value, as is any field the schema does not
 * know; fields that change nothing (user, metadata, ...) are accepted and a
 * null value is the field left out. Every problem is LS_ERR_REQUEST with one
 * message naming the field, quoting at most a short prefix of its value.
 * Chat messages: content a string or a list of text parts ({"type": "text",
 * "text": ...}, joined with newlines); the "developer" role is "system".
 *
 * PREPARE does what needs the runtime, so that a server can refuse a request
 * before it starts a stream: the model (LS_ERR_NOT_FOUND for an adapter the
 * runtime does not know), the "lora" mix (ls_adapter_mix, held by the request
 * until ls_request_free: its errors, LS_ERR_REQUEST or LS_ERR_BUDGET, start
 * with "lora"), the prompt (ids as given, text encoded with the runtime's
 * tokenizer and its special tokens, or messages rendered with its chat
 * template: LS_ERR_REQUEST when the build has no tokenizer or template, or a
 * role is unknown), max_tokens (default: the rest of the context) and the
 * whole request against the program (ls_check_request's LS_ERR_REQUEST).
 *
 * RUN generates and hands on_event each OpenAI event as it comes, UTF-8 JSON
 * text of `length` bytes (not NUL-terminated, valid during the call):
 *   stream false: one event, the whole response ("chat.completion" or
 *     "text_completion", with usage);
 *   stream true: the chunks ("chat.completion.chunk" / "text_completion"),
 *     each naming its choice (n): a chat's first carries delta {"role":
 *     "assistant", "content": ""}; then one per generated token (its text,
 *     whole UTF-8 characters, its id in "tokens" and, asked, its logprobs),
 *     one with the text held back at the end, one with finish_reason, and
 *     with stream_options.include_usage one with no choices and the usage.
 *     With tools offered the answer may be a call, so it comes whole at the
 *     end: its text, or delta.tool_calls and finish_reason "tool_calls".
 *     Server-sent events' framing ("data: ", "[DONE]") is the caller's.
 * Generation ends at max_tokens, after an end-of-sequence id (not text, not
 * in "tokens", unless ignore_eos) or at a stop string (none of it is ever
 * handed out, even across tokens). on_event returning nonzero (a client that
 * left) ends generation at the next token and ls_request_run returns LS_OK
 * without more events. `result` (may be NULL): the prompt and completion
 * tokens and how it ended (LS_FINISH_CALLBACK when on_event stopped it).
 * A request runs once; on_event must not call back into the runtime.
 * THREADS as ls_generate: with ls_options.parallel > 1, requests from several
 * threads run in one batch. */
typedef struct ls_request ls_request;

typedef enum {
  LS_REQUEST_COMPLETION = 0, /* OpenAI's completions body: "prompt" */
  LS_REQUEST_CHAT = 1        /* OpenAI's chat completions body: "messages" */
} ls_request_kind;

#define LS_REQUEST_MAX_BYTES (64u << 20)
#define LS_REQUEST_MAX_DEPTH 64

typedef int (*ls_event_callback)(const char* json, size_t length, void* user_data);

/* The request in `body` (`length` bytes of JSON), or NULL with `error` set. */
LS_API ls_request* ls_request_parse(ls_request_kind kind, const char* body, size_t length, ls_error* error);
/* See PREPARE. A request is prepared once, against one runtime. */
LS_API ls_status ls_request_prepare(ls_runtime* runtime, ls_request* request, ls_error* error);
/* See RUN: `request` prepared against `runtime`. */
LS_API ls_status ls_request_run(ls_runtime* runtime, ls_request* request, ls_event_callback on_event, void* user_data,
                                ls_text_result* result, ls_error* error);
/* Releases its mix, if any. NULL is ignored. Not while it runs, and before
 * ls_close of the runtime it was prepared against (its mix is the runtime's). */
LS_API void ls_request_free(ls_request* request);
/* Its "model" field, valid until ls_request_free. */
LS_API const char* ls_request_model(const ls_request* request);
/* Nonzero: its "stream" field is true (the answer comes as chunks). */
LS_API int ls_request_stream(const ls_request* request);
/* For a caller that runs a prepared request itself (build/runner --serve's
 * report of timings): its prompt ids (*prompt, *n: valid until
 * ls_request_free), the adapter (or mix) name ls_generate_named takes (valid
 * as long), and `options` filled from its fields. The events, stop strings
 * and text are then the caller's. LS_ERR_ARGUMENT before prepare. */
LS_API ls_status ls_request_generation(const ls_request* request, const int64_t** prompt, size_t* n,
                                       const char** adapter, ls_generate_options* options, ls_error* error);

/* PROGRAMS. A deployment built from PT2 archives (`programs:` in the config):
 * any exported model's forward, tensors in and out. Open its foundation.ptd
 * with ls_open; every program loaded reads the tensors the programs share
 * from it (mapped and packed once), and holds only its own. */
typedef struct ls_program ls_program; /* valid until ls_close */
typedef struct {
  int32_t dtype; /* ExecuTorch ScalarType: 6 float32, 4 int64, 3 int32,
                    5 float16, 0 uint8, 1 int8, 11 bool */
  int32_t ndim;
  const int64_t* sizes; /* ndim sizes, row-major (contiguous) data */
  void* data;
  size_t nbytes;
} ls_tensor;

LS_API ls_program* ls_load_program(ls_runtime* runtime, const char* pte, ls_error* error);
/* forward on `inputs` (copied in; each of the dtype and rank forward takes,
 * no size above its export's): fills outputs[0 .. *n_outputs) (at most
 * max_outputs; LS_ERR_REQUEST if forward returns more), whose sizes and data
 * stay valid until the next call on `program` or ls_close. */
LS_API ls_status ls_run_program(ls_program* program, const ls_tensor* inputs, size_t n_inputs, ls_tensor* outputs,
                                size_t max_outputs, size_t* n_outputs, ls_error* error);

#ifdef __cplusplus
}
#endif

#endif /* LORA_SHARE_H */
