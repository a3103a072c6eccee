#include "request_run.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "api_support.h"
#include "openai_json.h"
#include "stop_strings.h"

namespace lora_share::requests {
namespace {

using capi::set_error;

// `error` set to `code` with `message`; returns `code`.
ls_status fail(ls_error* error, ls_status code, const std::string& message) {
  set_error(error, code, message);
  return code;
}

// The names of the adapters `runtime` knows, for messages: "a, b, c".
std::string known_adapters(ls_runtime* runtime) {
  ls_runtime_stats stats;
  ls_error e;
  if (ls_stats(runtime, &stats, &e) != LS_OK) return "";
  std::string names;
  for (size_t i = 0; i < stats.adapters_known && names.size() < 400; ++i) {
    ls_adapter* a = ls_adapter_at(runtime, i, &e);
    if (a != nullptr) names += (names.empty() ? "" : ", ") + std::string(ls_adapter_name(a));
  }
  return names.empty() ? "none" : names;
}

std::string no_adapter(ls_runtime* runtime, const std::string& where, const std::string& name) {
  return where + ": no adapter called '" + name + "' (known: " + known_adapters(runtime) +
         "; 'base' is the foundation alone)";
}

// The model, or the lora mix on the foundation, into request->adapter.
ls_status resolve_adapter(ls_runtime* runtime, ls_request* request, ls_error* error) {
  const Request& r = request->request;
  request->adapter = r.model;
  ls_error e;
  if (r.lora.empty()) {
    if (r.model == LS_BASE_NAME || ls_adapter_by_name(runtime, r.model.c_str(), &e) != nullptr) return LS_OK;
    if (e.code != LS_ERR_NOT_FOUND) return fail(error, e.code, e.message);
    return fail(error, LS_ERR_NOT_FOUND, no_adapter(runtime, "model", r.model));
  }
  std::vector<ls_lora_term> terms;
  for (size_t i = 0; i < r.lora.size(); ++i) {
    const std::string& name = r.lora[i].name;
    if (name == LS_BASE_NAME || ls_adapter_by_name(runtime, name.c_str(), &e) == nullptr)
      return fail(
          error, LS_ERR_REQUEST,
          no_adapter(runtime, "lora[" + std::to_string(i) + "].name", name) + ", and 'base' is no adapter to mix");
    terms.push_back({name.c_str(), r.lora[i].scale});
  }
  request->mix = ls_adapter_mix(runtime, terms.data(), terms.size(), &e);
  if (request->mix == nullptr) return fail(error, e.code, std::string("lora: ") + e.message);
  request->adapter = ls_adapter_name(request->mix);
  return LS_OK;
}

// ls_tokenize into a vector.
ls_status encode(ls_tokenizer* tokenizer, const std::string& text, bool add_special, std::vector<int64_t>* ids,
                 ls_error* error) {
  size_t n = 0;
  ls_status s = ls_tokenize(tokenizer, text.data(), text.size(), add_special, nullptr, 0, &n, error);
  if (s != LS_OK) return s;
  ids->resize(n);
  return ls_tokenize(tokenizer, text.data(), text.size(), add_special, ids->data(), n, &n, error);
}

ls_status chat_prompt(ls_tokenizer* tokenizer, const Request& r, std::vector<int64_t>* ids, ls_error* error) {
  std::vector<ls_chat_message> messages;
  for (const Message& m : r.messages) messages.push_back({m.role.c_str(), m.content.c_str()});
  ls_error e;
  size_t length = 0;
  ls_status s = ls_apply_chat_template(tokenizer, messages.data(), messages.size(), nullptr, 0, &length, &e);
  if (s == LS_ERR_NOT_FOUND)
    return fail(error, LS_ERR_REQUEST,
                "messages: this deployment's tokenizer has no chat template: send the formatted text to "
                "/v1/completions (create_completion) instead");
  if (s != LS_OK) return fail(error, s, e.message);
  std::string text(length + 1, '\0');
  s = ls_apply_chat_template(tokenizer, messages.data(), messages.size(), text.data(), text.size(), &length, &e);
  if (s != LS_OK) return fail(error, s, e.message);
  text.resize(length);
  // The template's text holds the special tokens it wants (BOS included).
  s = encode(tokenizer, text, /*add_special=*/false, ids, &e);
  if (s != LS_OK) return fail(error, s, std::string("messages: ") + e.message);
  return LS_OK;
}

// The prompt's ids, encoded or rendered with the runtime's tokenizer.
ls_status prompt_ids(ls_runtime* runtime, ls_request* request, ls_error* error) {
  const Request& r = request->request;
  const bool needs_text = r.kind == Kind::kChat || !r.prompt_is_ids;
  ls_error e;
  request->tokenizer = ls_runtime_tokenizer(runtime, &e);
  if (request->tokenizer == nullptr && e.code != LS_ERR_NOT_FOUND) return fail(error, e.code, e.message);
  const std::string no_tokenizer = request->tokenizer == nullptr ? std::string(e.message) : "";
  if (needs_text && request->tokenizer == nullptr)
    return fail(error, LS_ERR_REQUEST,
                std::string(r.kind == Kind::kChat ? "messages are" : "prompt is") + " text, and " + no_tokenizer);
  if (!r.stop.empty() && request->tokenizer == nullptr)
    return fail(error, LS_ERR_REQUEST, "stop needs the text of the answer, and " + no_tokenizer + ": leave stop out");
  if (r.kind == Kind::kChat) return chat_prompt(request->tokenizer, r, &request->ids, error);
  if (r.prompt_is_ids) {
    request->ids = r.prompt_ids;
    return LS_OK;
  }
  ls_status s = encode(request->tokenizer, r.prompt, /*add_special=*/true, &request->ids, &e);
  if (s != LS_OK) return fail(error, s, std::string("prompt: ") + e.message);
  if (request->ids.empty()) return fail(error, LS_ERR_REQUEST, "prompt encodes to no tokens: give some text");
  return LS_OK;
}

// One generation: ids in, text out through the stop strings, events out.
struct Run {
  const Request* request;
  AnswerId id;
  Answer answer;
  ls_detokenizer* decoder = nullptr;
  std::vector<int64_t> eos;
  StopStrings stops;
  ls_event_callback on_event;
  void* user_data;
  bool client_gone = false;
  ls_finish_reason finish = LS_FINISH_LENGTH;

  bool emit(const std::string& event) {
    if (!client_gone && on_event != nullptr && on_event(event.data(), event.size(), user_data) != 0) client_gone = true;
    return !client_gone;
  }

  std::string decode(const int64_t* ids, size_t n, bool flush) {
    if (decoder == nullptr) return "";
    const char* text = nullptr;
    size_t length = 0;
    ls_error e;
    if (ls_detokenize(decoder, ids, n, flush ? 1 : 0, &text, &length, &e) != LS_OK) return "";
    return std::string(text, length);
  }

  void stopped_by(ls_finish_reason why) {
    finish = why;
    answer.finish_reason = "stop";
  }

  static int on_token(int64_t token, void* self) {
    auto* run = static_cast<Run*>(self);
    if (!run->request->ignore_eos && std::find(run->eos.begin(), run->eos.end(), token) != run->eos.end()) {
      run->stopped_by(LS_FINISH_EOS);
      return 1;
    }
    run->answer.tokens.push_back(token);
    const std::string piece = run->stops.push(run->decode(&token, 1, false));
    run->answer.text += piece;
    if (run->request->stream && !run->emit(chunk_json(run->id, piece, {token}, std::nullopt))) return 1;
    if (run->stops.stopped()) {
      run->stopped_by(LS_FINISH_STOP);
      return 1;
    }
    return 0;
  }

  // The text still held back (an incomplete UTF-8 tail, the start of a stop
  // string that never came), once generation ends.
  std::string finish_text() {
    std::string tail = stops.push(decode(nullptr, 0, true));
    if (stops.stopped() && finish != LS_FINISH_STOP) stopped_by(LS_FINISH_STOP);
    tail += stops.finish();
    answer.text += tail;
    return tail;
  }
};

}  // namespace

ls_generate_options generate_options(const Request& request, int64_t max_new_tokens) {
  ls_generate_options g;
  ls_generate_options_init(&g);
  g.max_new_tokens = max_new_tokens;
  g.temperature = request.temperature;
  g.seed = request.seed;
  g.top_k = request.top_k;
  g.top_p = request.top_p;
  g.min_p = request.min_p;
  g.repeat_penalty = request.repeat_penalty;
  g.presence_penalty = request.presence_penalty;
  g.frequency_penalty = request.frequency_penalty;
  g.ignore_eos = request.ignore_eos ? 1 : 0;
  g.cache_prompt = request.cache_prompt ? 1 : 0;
  return g;
}

ls_status prepare(ls_runtime* runtime, ls_request* request, ls_error* error) {
  request->runtime = runtime;
  ls_status s = resolve_adapter(runtime, request, error);
  if (s == LS_OK) s = prompt_ids(runtime, request, error);
  if (s != LS_OK) return s;
  // No max_tokens: until EOS or the end of the context, as OpenAI's and
  // llama-server's (a prompt that fills the context asks for one token, so
  // the check below says it is too long).
  const Request& r = request->request;
  request->max_new_tokens = r.max_tokens.value_or(0);
  if (!r.max_tokens) {
    int64_t context = 0;
    s = ls_context_length(runtime, request->adapter.c_str(), &context, error);
    if (s != LS_OK) return s;
    request->max_new_tokens = std::max<int64_t>(1, context - static_cast<int64_t>(request->ids.size()) + 1);
  }
  s = ls_check_request(runtime, request->adapter.c_str(), request->ids.data(), request->ids.size(),
                       request->max_new_tokens, error);
  if (s != LS_OK) return s;
  request->prepared = true;
  capi::clear_error(error);
  return LS_OK;
}

ls_status run(ls_request* request, ls_event_callback on_event, void* user_data, ls_text_result* result,
              ls_error* error) {
  const Request& r = request->request;
  ls_runtime* runtime = request->runtime;
  Run state{&r, new_answer_id(r.kind, r.model), Answer(), nullptr, {}, StopStrings(r.stop), on_event, user_data};
  state.answer.finish_reason = "length";
  state.answer.prompt_tokens = static_cast<int64_t>(request->ids.size());
  const int64_t* eos = nullptr;
  size_t n_eos = 0;
  ls_status s = ls_runtime_eos_ids(runtime, &eos, &n_eos, error);
  if (s != LS_OK) return s;
  state.eos.assign(eos, eos + n_eos);
  if (request->tokenizer != nullptr) {
    state.decoder = ls_detokenizer_new(request->tokenizer, /*skip_special=*/1, error);
    if (state.decoder == nullptr) return error ? error->code : LS_ERR_RUN;
  }
  std::unique_ptr<ls_detokenizer, void (*)(ls_detokenizer*)> decoder(state.decoder, ls_detokenizer_free);
  if (r.stream && r.kind == Kind::kChat) state.emit(role_chunk_json(state.id));
  const ls_generate_options options = generate_options(r, request->max_new_tokens);
  if (!state.client_gone) {
    s = ls_generate_named(runtime, request->adapter.c_str(), request->ids.data(), request->ids.size(), &options,
                          &Run::on_token, &state, error);
    if (s != LS_OK) return s;
  }
  if (state.client_gone) {
    state.finish = LS_FINISH_CALLBACK;
  } else {
    const std::string tail = state.finish_text();
    if (!r.stream) {
      state.emit(response_json(state.id, state.answer));
    } else {
      if (!tail.empty()) state.emit(chunk_json(state.id, tail, {}, std::nullopt));
      state.emit(chunk_json(state.id, "", {}, state.answer.finish_reason));
      if (r.include_usage) state.emit(usage_chunk_json(state.id, state.answer));
    }
    if (state.client_gone) state.finish = LS_FINISH_CALLBACK;
  }
  if (result != nullptr) {
    result->prompt_tokens = request->ids.size();
    result->completion_tokens = state.answer.tokens.size();
    result->finish_reason = state.finish;
  }
  capi::clear_error(error);
  return LS_OK;
}

}  // namespace lora_share::requests
