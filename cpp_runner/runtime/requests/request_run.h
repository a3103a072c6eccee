// A request (lora_share.h, REQUESTS) made ready against a runtime and run:
// written over the library's own public calls (ls_adapter_by_name,
// ls_adapter_mix, the TEXT calls, ls_check_request, ls_generate_named), as
// any application could write it, so every door answers as the C API does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lora_share.h"
#include "request_schema.h"

struct ls_request {
  lora_share::requests::Request request;
  // Filled by prepare:
  ls_runtime* runtime = nullptr;
  bool prepared = false;
  bool ran = false;
  std::string adapter;                // what the library runs: model, or the mix's name
  ls_adapter* mix = nullptr;          // the "lora" mix, held until ls_request_free
  std::vector<int64_t> ids;           // the prompt's
  std::vector<int64_t> prediction;    // the prediction's, encoded
  int64_t max_new_tokens = 0;         // max_tokens, or the rest of the context
  ls_tokenizer* tokenizer = nullptr;  // the runtime's; null when the build has none
};

namespace lora_share::requests {

// PREPARE (lora_share.h): LS_OK, or the error with `error` filled.
ls_status prepare(ls_runtime* runtime, ls_request* request, ls_error* error);

// RUN (lora_share.h) of a prepared request.
ls_status run(ls_request* request, ls_event_callback on_event, void* user_data, ls_text_result* result,
              ls_error* error);

// The ls_generate_options of a request's fields.
ls_generate_options generate_options(const Request& request, int64_t max_new_tokens);

}  // namespace lora_share::requests
