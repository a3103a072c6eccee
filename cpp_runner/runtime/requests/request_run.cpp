#include "request_run.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>

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

// The messages as the chat template takes them, tools in the generic format
// (tool_calls.h): the tools offered at the end of the first system message
// (one is made when there is none), an assistant's calls as its text, a tool
// message's result as the user's.
std::vector<Message> rendered_messages(const Request& r) {
  std::vector<Message> out;
  for (const Message& m : r.messages) {
    Message turn{m.role, m.content, {}, {}};
    if (!m.tool_calls.empty()) turn.content += (turn.content.empty() ? "" : "\n") + calls_text(m.tool_calls);
    if (m.role == "tool") {
      std::string name;  // the function the result is of, from the call it answers
      for (const Message& earlier : r.messages)
        for (const ToolCall& c : earlier.tool_calls)
          if (!m.tool_call_id.empty() && c.id == m.tool_call_id) name = c.name;
      turn.role = "user";
      turn.content = result_text(m.tool_call_id, name, m.content);
    }
    out.push_back(std::move(turn));
  }
  if (r.tools.offered()) {
    const std::string prompt = tools_prompt(r.tools);
    auto system = std::find_if(out.begin(), out.end(), [](const Message& m) { return m.role == "system"; });
    if (system != out.end())
      system->content += "\n\n" + prompt;
    else
      out.insert(out.begin(), Message{"system", prompt, {}, {}});
  }
  return out;
}

ls_status chat_prompt(ls_tokenizer* tokenizer, const Request& r, std::vector<int64_t>* ids, ls_error* error) {
  const std::vector<Message> turns = rendered_messages(r);
  std::vector<ls_chat_message> messages;
  for (const Message& m : turns) messages.push_back({m.role.c_str(), m.content.c_str()});
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
  if (r.prediction && request->tokenizer == nullptr)
    return fail(error, LS_ERR_REQUEST, "prediction is text, and " + no_tokenizer + ": leave prediction out");
  if (r.prediction) {
    // The answer's ids as the model writes them: no special tokens.
    ls_status s = encode(request->tokenizer, *r.prediction, /*add_special=*/false, &request->prediction, &e);
    if (s != LS_OK) return fail(error, s, std::string("prediction: ") + e.message);
  }
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

// A token's bytes as the tokenizer decodes it alone (logprobs' "token" and
// "bytes"), looked up once per id a request meets.
class TokenBytes {
 public:
  explicit TokenBytes(ls_tokenizer* tokenizer) : tokenizer_(tokenizer) {}

  const std::string& of(int64_t id) {
    auto found = cache_.find(id);
    if (found != cache_.end()) return found->second;
    std::string bytes;
    ls_error e;
    ls_detokenizer* d = tokenizer_ != nullptr ? ls_detokenizer_new(tokenizer_, /*skip_special=*/0, &e) : nullptr;
    const char* text = nullptr;
    size_t length = 0;
    if (d != nullptr && ls_detokenize(d, &id, 1, /*flush=*/1, &text, &length, &e) == LS_OK) bytes.assign(text, length);
    ls_detokenizer_free(d);
    return cache_.emplace(id, std::move(bytes)).first->second;
  }

 private:
  ls_tokenizer* tokenizer_;
  std::unordered_map<int64_t, std::string> cache_;
};

// One choice of a generation: its text through the stop strings.
struct ChoiceRun {
  std::unique_ptr<ls_detokenizer, void (*)(ls_detokenizer*)> decoder{nullptr, ls_detokenizer_free};
  StopStrings stops{std::vector<std::string>()};
  bool done = false;  // ended by EOS, a stop string or the client
  ls_finish_reason finish = LS_FINISH_LENGTH;

  std::string decode(const int64_t* ids, size_t n, bool flush) {
    if (decoder == nullptr) return "";
    const char* text = nullptr;
    size_t length = 0;
    ls_error e;
    if (ls_detokenize(decoder.get(), ids, n, flush ? 1 : 0, &text, &length, &e) != LS_OK) return "";
    return std::string(text, length);
  }
};

// One generation: ids in, each choice's text out through its stop strings,
// events out.
struct Run {
  const Request* request;
  AnswerId id;
  Answer answer;
  std::vector<ChoiceRun> choices;
  std::vector<int64_t> eos;
  TokenBytes token_bytes;
  ls_event_callback on_event;
  void* user_data;
  bool client_gone = false;

  bool emit(const std::string& event) {
    if (!client_gone && on_event != nullptr && on_event(event.data(), event.size(), user_data) != 0) client_gone = true;
    return !client_gone;
  }

  void stopped_by(size_t c, ls_finish_reason why) {
    choices[c].finish = why;
    choices[c].done = true;
    answer.choices[c].finish_reason = "stop";
  }

  TokenLogprob logprob_of(const ls_token_info& info) {
    TokenLogprob entry{token_bytes.of(info.token), info.logprob, {}};
    for (int32_t i = 0; i < info.n_top; ++i)
      entry.top.push_back({token_bytes.of(info.top_ids[i]), info.top_logprobs[i]});
    return entry;
  }

  // Each token of each choice (ls_token_info): nonzero stops that choice.
  static int on_token(const ls_token_info* info, void* self) {
    auto* run = static_cast<Run*>(self);
    const auto c = static_cast<size_t>(info->choice);
    if (run->client_gone) return 1;
    if (c >= run->choices.size() || run->choices[c].done) return 1;
    ChoiceRun& state = run->choices[c];
    Choice& out = run->answer.choices[c];
    const int64_t token = info->token;
    if (!run->request->ignore_eos && std::find(run->eos.begin(), run->eos.end(), token) != run->eos.end()) {
      run->stopped_by(c, LS_FINISH_EOS);
      return 1;
    }
    out.tokens.push_back(token);
    std::vector<TokenLogprob> logprobs;
    if (run->request->logprobs) logprobs.push_back(run->logprob_of(*info));
    if (run->request->logprobs) out.logprobs.push_back(logprobs.back());
    const std::string piece = state.stops.push(state.decode(&token, 1, false));
    out.text += piece;
    // With tools offered the answer may be a call: it is sent whole at the end.
    const bool buffered = run->request->tools.offered();
    if (run->request->stream && !buffered && !run->emit(chunk_json(run->id, c, piece, {token}, logprobs, std::nullopt)))
      return 1;
    if (state.stops.stopped()) {
      run->stopped_by(c, LS_FINISH_STOP);
      return 1;
    }
    return 0;
  }

  // The text choice `c` still holds back (an incomplete UTF-8 tail, the start
  // of a stop string that never came), once generation ends.
  std::string finish_text(size_t c) {
    ChoiceRun& state = choices[c];
    std::string tail = state.stops.push(state.decode(nullptr, 0, true));
    if (state.stops.stopped() && state.finish != LS_FINISH_STOP) stopped_by(c, LS_FINISH_STOP);
    tail += state.stops.finish();
    answer.choices[c].text += tail;
    return tail;
  }
};

// With tools offered, each choice that ended at EOS with a call's JSON is
// that call: message.tool_calls and finish_reason "tool_calls".
void read_calls(const Request& r, const std::vector<ChoiceRun>& runs, Answer& answer) {
  for (size_t c = 0; c < runs.size(); ++c) {
    if (runs[c].finish != LS_FINISH_EOS) continue;
    std::optional<ToolCall> call = read_answer_call(r.tools, answer.choices[c].text);
    if (!call) continue;
    answer.choices[c].tool_calls.push_back(std::move(*call));
    answer.choices[c].finish_reason = "tool_calls";
  }
}

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
  g.constraint = request.constraint.kind;
  g.constraint_text =
      request.constraint.kind == LS_CONSTRAINT_JSON_SCHEMA || request.constraint.kind == LS_CONSTRAINT_GRAMMAR
          ? request.constraint.text.c_str()
          : nullptr;
  g.logit_bias_ids = request.logit_bias_ids.data();
  g.logit_bias_values = request.logit_bias_values.data();
  g.n_logit_bias = request.logit_bias_ids.size();
  g.logprobs = request.logprobs ? 1 : 0;
  g.top_logprobs = request.top_logprobs;
  g.n = request.n;
  g.speculative = request.speculative ? 1 : 0;
  return g;
}

// The fields that shape the answer, against the runtime (ls_check_options):
// logit_bias ids within the vocabulary, n within the batch, the constraint
// compiled (so the request then starts at once). A constraint's error names
// the field that gave it.
ls_status check_options(ls_runtime* runtime, ls_request* request, ls_error* error) {
  const Request& r = request->request;
  ls_generate_options options = generate_options(r, request->max_new_tokens);
  ls_error e;
  // Each tool's parameters compile as a schema, whether or not a call is forced.
  for (size_t i = 0; i < r.tools.tools.size(); ++i) {
    const std::string schema = r.tools.tools[i].parameters.dump();
    ls_generate_options check;
    ls_generate_options_init(&check);
    check.constraint = LS_CONSTRAINT_JSON_SCHEMA;
    check.constraint_text = schema.c_str();
    if (ls_check_options(runtime, request->adapter.c_str(), &check, &e) != LS_OK)
      return fail(error, LS_ERR_REQUEST, "tools[" + std::to_string(i) + "].function.parameters: " + e.message);
  }
  const int constraint = options.constraint;
  options.constraint = LS_CONSTRAINT_NONE;
  options.constraint_text = nullptr;
  ls_status s = ls_check_options(runtime, request->adapter.c_str(), &options, &e);
  if (s != LS_OK) return fail(error, LS_ERR_REQUEST, e.message);
  if (constraint == LS_CONSTRAINT_NONE) return LS_OK;
  if (r.ignore_eos)
    return fail(error, LS_ERR_REQUEST,
                "ignore_eos with " + r.constraint.field + ": a constrained answer ends with its end-of-sequence id");
  options = generate_options(r, request->max_new_tokens);
  s = ls_check_options(runtime, request->adapter.c_str(), &options, &e);
  if (s != LS_OK) return fail(error, LS_ERR_REQUEST, r.constraint.field + ": " + e.message);
  return LS_OK;
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
  if (s == LS_OK) s = check_options(runtime, request, error);
  if (s != LS_OK) return s;
  request->prepared = true;
  capi::clear_error(error);
  return LS_OK;
}

ls_status run(ls_request* request, ls_event_callback on_event, void* user_data, ls_text_result* result,
              ls_error* error) {
  const Request& r = request->request;
  ls_runtime* runtime = request->runtime;
  Run state{&r, new_answer_id(r.kind, r.model), Answer(), {}, {}, TokenBytes(request->tokenizer), on_event, user_data};
  state.answer.prompt_tokens = static_cast<int64_t>(request->ids.size());
  state.answer.logprobs = r.logprobs;
  state.answer.choices.resize(static_cast<size_t>(r.n));
  state.choices.resize(static_cast<size_t>(r.n));
  const int64_t* eos = nullptr;
  size_t n_eos = 0;
  ls_status s = ls_runtime_eos_ids(runtime, &eos, &n_eos, error);
  if (s != LS_OK) return s;
  state.eos.assign(eos, eos + n_eos);
  for (size_t c = 0; c < state.choices.size(); ++c) {
    state.answer.choices[c].finish_reason = "length";
    state.choices[c].stops = StopStrings(r.stop);
    if (request->tokenizer == nullptr) continue;
    state.choices[c].decoder.reset(ls_detokenizer_new(request->tokenizer, /*skip_special=*/1, error));
    if (state.choices[c].decoder == nullptr) return error ? error->code : LS_ERR_RUN;
  }
  if (r.stream && r.kind == Kind::kChat)
    for (size_t c = 0; c < state.choices.size(); ++c) state.emit(role_chunk_json(state.id, c));
  ls_generate_options options = generate_options(r, request->max_new_tokens);
  options.on_token_info = &Run::on_token;
  options.token_info_user_data = &state;
  uint64_t drafted = 0, accepted = 0;
  options.prediction = request->prediction.empty() ? nullptr : request->prediction.data();
  options.n_prediction = request->prediction.size();
  options.drafted = &drafted;
  options.accepted = &accepted;
  if (!state.client_gone) {
    s = ls_generate_named(runtime, request->adapter.c_str(), request->ids.data(), request->ids.size(), &options,
                          nullptr, nullptr, error);
    if (s != LS_OK) return s;
  }
  state.answer.accepted_prediction_tokens = static_cast<int64_t>(accepted);
  state.answer.rejected_prediction_tokens = static_cast<int64_t>(drafted - accepted);
  if (!state.client_gone) {
    std::vector<std::string> tails;
    for (size_t c = 0; c < state.choices.size(); ++c) tails.push_back(state.finish_text(c));
    if (r.tools.offered()) read_calls(r, state.choices, state.answer);
    if (!r.stream) {
      state.emit(response_json(state.id, state.answer));
    } else {
      for (size_t c = 0; c < state.choices.size(); ++c) {
        const Choice& choice = state.answer.choices[c];
        if (!choice.tool_calls.empty())
          state.emit(tool_calls_chunk_json(state.id, c, choice.tool_calls, choice.logprobs));
        else if (r.tools.offered())  // held back: the whole text now
          state.emit(chunk_json(state.id, c, choice.text, choice.tokens, choice.logprobs, std::nullopt));
        else if (!tails[c].empty())
          state.emit(chunk_json(state.id, c, tails[c], {}, {}, std::nullopt));
        state.emit(chunk_json(state.id, c, "", {}, {}, choice.finish_reason));
      }
      if (r.include_usage) state.emit(usage_chunk_json(state.id, state.answer));
    }
  }
  if (result != nullptr) {
    // The first choice's, as one answer's (ls_text_result holds one).
    result->prompt_tokens = request->ids.size();
    result->completion_tokens = state.answer.choices[0].tokens.size();
    result->finish_reason = state.client_gone ? LS_FINISH_CALLBACK : state.choices[0].finish;
    result->accepted_prediction_tokens = accepted;
    result->rejected_prediction_tokens = drafted - accepted;
  }
  capi::clear_error(error);
  return LS_OK;
}

}  // namespace lora_share::requests
