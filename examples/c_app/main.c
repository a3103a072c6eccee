/* A minimal application of the lora-share C API: open a foundation, load one
 * adapter, generate greedily from comma-separated token ids and print the
 * generated ids on one line. With a folder instead of a .ptd and a name
 * instead of a .pte, it serves the deployment under a memory budget. With
 * --chat, it asks the adapter one question in text (the build's tokenizer
 * and chat template, through the library) and prints the answer as it comes.
 *
 *   c_app FOUNDATION.ptd ADAPTER.pte IDS MAX_NEW_TOKENS
 *   c_app --dir DEPLOYMENT_DIR ADAPTER_NAME IDS MAX_NEW_TOKENS [BUDGET_BYTES]
 *   c_app --chat DEPLOYMENT_DIR ADAPTER_NAME QUESTION MAX_NEW_TOKENS
 *
 * Exit 0 on success; on failure one "error: <LS_ERR_...>: <message>" line and
 * exit 1. */
#include <lora_share.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int print_token(int64_t token, void* user_data) {
  int* count = (int*)user_data;
  printf(*count == 0 ? "%lld" : " %lld", (long long)token);
  ++*count;
  return 0; /* keep going */
}

static int print_text(const char* text, size_t length, void* user_data) {
  (void)user_data;
  fwrite(text, 1, length, stdout);
  fflush(stdout); /* each piece as soon as it is whole UTF-8 */
  return 0;
}

static int fail(const ls_error* err) {
  fprintf(stderr, "error: %s: %s\n", ls_status_name(err->code), err->message);
  return 1;
}

/* Parses "1,17,42" into `ids` (at most `cap`); returns the count, -1 if bad. */
static long parse_ids(const char* text, int64_t* ids, long cap) {
  long n = 0;
  const char* p = text;
  while (*p) {
    char* end;
    long long v = strtoll(p, &end, 10);
    if (end == p || n == cap) return -1;
    ids[n++] = v;
    p = (*end == ',') ? end + 1 : end;
    if (*end != ',' && *end != '\0') return -1;
  }
  return n;
}

/* --chat: one user message, the answer streamed as text. */
static int chat(const char* dir, const char* adapter, const char* question, const char* max_new) {
  ls_error err;
  ls_runtime* rt = ls_open_dir(dir, NULL, &err);
  if (rt == NULL) return fail(&err);
  ls_chat_message message = {"user", question};
  ls_generate_options gen;
  ls_generate_options_init(&gen);
  gen.max_new_tokens = atoll(max_new);
  ls_text_result result;
  ls_status status = ls_generate_chat(rt, adapter, &message, 1, &gen, print_text, NULL, &result, &err);
  printf("\n");
  ls_close(rt);
  if (status != LS_OK) return fail(&err);
  fprintf(stderr, "%llu prompt + %llu new tokens, %s\n", (unsigned long long)result.prompt_tokens,
          (unsigned long long)result.completion_tokens, result.finish_reason == LS_FINISH_EOS ? "stop" : "length");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 6 && strcmp(argv[1], "--chat") == 0) return chat(argv[2], argv[3], argv[4], argv[5]);
  int dir_mode = argc >= 2 && strcmp(argv[1], "--dir") == 0;
  int first = dir_mode ? 2 : 1;
  if (argc < first + 4) {
    fprintf(stderr,
            "usage: %s FOUNDATION.ptd ADAPTER.pte IDS MAX_NEW_TOKENS\n"
            "       %s --dir DEPLOYMENT_DIR ADAPTER_NAME IDS MAX_NEW_TOKENS [BUDGET_BYTES]\n"
            "       %s --chat DEPLOYMENT_DIR ADAPTER_NAME QUESTION MAX_NEW_TOKENS\n",
            argv[0], argv[0], argv[0]);
    return 2;
  }
  int64_t ids[4096];
  long n = parse_ids(argv[first + 2], ids, 4096);
  if (n < 0) {
    fprintf(stderr, "error: IDS must be comma-separated integers\n");
    return 2;
  }

  ls_error err;
  ls_options opts;
  ls_options_init(&opts);
  if (dir_mode && argc > first + 4) opts.budget_bytes = strtoull(argv[first + 4], NULL, 10);
  ls_runtime* rt = dir_mode ? ls_open_dir(argv[first], &opts, &err) : ls_open(argv[first], &opts, &err);
  if (rt == NULL) return fail(&err);
  ls_adapter* adapter =
      dir_mode ? ls_adapter_by_name(rt, argv[first + 1], &err) : ls_load_adapter(rt, argv[first + 1], &err);
  if (adapter == NULL) {
    ls_close(rt);
    return fail(&err);
  }

  ls_generate_options gen;
  ls_generate_options_init(&gen);
  gen.max_new_tokens = atoll(argv[first + 3]);
  int count = 0;
  ls_status status = ls_generate(rt, adapter, ids, (size_t)n, &gen, print_token, &count, &err);
  printf("\n");
  if (status != LS_OK) {
    ls_close(rt);
    return fail(&err);
  }
  ls_runtime_stats stats;
  if (ls_stats(rt, &stats, &err) == LS_OK)
    fprintf(stderr, "adapter '%s': %d tokens; resident %u of %u, loads %llu, last load %.2f ms\n",
            ls_adapter_name(adapter), count, stats.adapters_resident, stats.adapters_known,
            (unsigned long long)stats.loads, stats.last_load_ms);
  ls_close(rt);
  return 0;
}
