// The C API's request calls (lora_share.h, REQUESTS): argument checks and no
// C++ exception past the boundary; the work is request_schema.cpp's (parse)
// and request_run.cpp's (prepare, run).
#include <string>

#include "api_support.h"
#include "bounded_json.h"
#include "lora_share.h"
#include "request_run.h"

using namespace lora_share::capi;
namespace rq = lora_share::requests;

extern "C" {

ls_request* ls_request_parse(ls_request_kind kind, const char* body, size_t length, ls_error* error) {
  if (body == nullptr && length > 0) return missing(error, "body"), nullptr;
  if (kind != LS_REQUEST_COMPLETION && kind != LS_REQUEST_CHAT) {
    set_error(error, LS_ERR_ARGUMENT, "kind must be LS_REQUEST_COMPLETION or LS_REQUEST_CHAT");
    return nullptr;
  }
  try {
    auto parsed =
        rq::parse_bounded(std::string(body ? body : "", length), {LS_REQUEST_MAX_BYTES, LS_REQUEST_MAX_DEPTH});
    if (!parsed.ok()) return report(error, parsed.status(), LS_ERR_REQUEST, LS_ERR_REQUEST), nullptr;
    auto request = rq::read_request(parsed.value(), kind == LS_REQUEST_CHAT ? rq::Kind::kChat : rq::Kind::kCompletion);
    if (!request.ok()) return report(error, request.status(), LS_ERR_REQUEST, LS_ERR_REQUEST), nullptr;
    auto* out = new ls_request();
    out->request = std::move(request.value());
    clear_error(error);
    return out;
  } catch (const std::exception& e) {  // bad_alloc, or a value of a type the checks missed
    set_error(error, LS_ERR_REQUEST, std::string("the request could not be read: ") + e.what());
    return nullptr;
  }
}

ls_status ls_request_prepare(ls_runtime* runtime, ls_request* request, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (request == nullptr) return missing(error, "request");
  if (request->prepared || request->runtime != nullptr) {
    set_error(error, LS_ERR_ARGUMENT, "this request was prepared already: parse it again");
    return LS_ERR_ARGUMENT;
  }
  try {
    return rq::prepare(runtime, request, error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_request_prepare: ") + e.what());
    return LS_ERR_RUN;
  }
}

ls_status ls_request_run(ls_runtime* runtime, ls_request* request, ls_event_callback on_event, void* user_data,
                         ls_text_result* result, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (request == nullptr) return missing(error, "request");
  if (!request->prepared || request->runtime != runtime) {
    set_error(error, LS_ERR_ARGUMENT, "run a request after ls_request_prepare on the same runtime");
    return LS_ERR_ARGUMENT;
  }
  if (request->ran) {
    set_error(error, LS_ERR_ARGUMENT, "this request has run already: a request runs once");
    return LS_ERR_ARGUMENT;
  }
  request->ran = true;
  try {
    return rq::run(request, on_event, user_data, result, error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_request_run: ") + e.what());
    return LS_ERR_RUN;
  }
}

void ls_request_free(ls_request* request) {
  if (request == nullptr) return;
  if (request->mix != nullptr) ls_adapter_release(request->mix, nullptr);
  delete request;
}

const char* ls_request_model(const ls_request* request) { return request ? request->request.model.c_str() : ""; }

int ls_request_stream(const ls_request* request) { return request && request->request.stream ? 1 : 0; }

ls_status ls_request_generation(const ls_request* request, const int64_t** prompt, size_t* n, const char** adapter,
                                ls_generate_options* options, ls_error* error) {
  if (request == nullptr) return missing(error, "request");
  if (prompt == nullptr || n == nullptr || adapter == nullptr || options == nullptr)
    return missing(error, prompt == nullptr    ? "prompt"
                          : n == nullptr       ? "n"
                          : adapter == nullptr ? "adapter"
                                               : "options");
  if (!request->prepared) {
    set_error(error, LS_ERR_ARGUMENT, "ls_request_generation needs a prepared request (ls_request_prepare)");
    return LS_ERR_ARGUMENT;
  }
  *prompt = request->ids.data();
  *n = request->ids.size();
  *adapter = request->adapter.c_str();
  *options = rq::generate_options(request->request, request->max_new_tokens);
  options->prediction = request->prediction.empty() ? nullptr : request->prediction.data();
  options->n_prediction = request->prediction.size();
  clear_error(error);
  return LS_OK;
}

}  // extern "C"
