#include "text.h"

#include <algorithm>
#include <memory>

namespace lora_share {
namespace {

Status usage_of(const ls_error& error) { return status_of(LS_ERR_REQUEST, error); }

}  // namespace

StatusOr<std::optional<RunnerText>> runner_text(const RunnerRuntime& runtime, bool required) {
  ls_error error;
  RunnerText text;
  text.tokenizer = ls_runtime_tokenizer(runtime.handle(), &error);
  if (text.tokenizer == nullptr) {
    if (error.code == LS_ERR_NOT_FOUND && !required) return std::optional<RunnerText>();
    return error.code == LS_ERR_NOT_FOUND ? usage_of(error) : status_of(error.code, error);
  }
  const int64_t* eos = nullptr;
  size_t n = 0;
  if (ls_runtime_eos_ids(runtime.handle(), &eos, &n, &error) != LS_OK) return status_of(error.code, error);
  text.eos.assign(eos, eos + n);
  // No messages: LS_ERR_NOT_FOUND says the build has no template.
  size_t length = 0;
  text.chat = ls_apply_chat_template(text.tokenizer, nullptr, 0, nullptr, 0, &length, &error) == LS_OK;
  return std::optional<RunnerText>(std::move(text));
}

StatusOr<std::vector<int64_t>> encode_prompt(const RunnerText& text, const std::string& prompt,
                                             const std::string& what) {
  ls_error error;
  size_t n = 0;
  std::vector<int64_t> ids;
  if (ls_tokenize(text.tokenizer, prompt.data(), prompt.size(), 1, nullptr, 0, &n, &error) == LS_OK) {
    ids.resize(n);
    if (ls_tokenize(text.tokenizer, prompt.data(), prompt.size(), 1, ids.data(), n, &n, &error) == LS_OK) {
      if (ids.empty()) return Status::usage(what + ": the text encodes to no tokens: give some text");
      return ids;
    }
  }
  return Status::usage(what + ": " + error.message);
}

StatusOr<std::vector<int64_t>> encode_chat(const RunnerText& text, const std::string& message,
                                           const std::string& what) {
  if (!text.chat)
    return Status::usage(what +
                         ": the build has no chat format (its tokenizer has no chat template, or one that "
                         "is not fixed text per role): give the formatted text as the prompt");
  const ls_chat_message user = {"user", message.c_str()};
  ls_error error;
  size_t length = 0;
  if (ls_apply_chat_template(text.tokenizer, &user, 1, nullptr, 0, &length, &error) != LS_OK)
    return Status::usage(what + ": " + error.message);
  std::string rendered(length + 1, '\0');
  if (ls_apply_chat_template(text.tokenizer, &user, 1, rendered.data(), rendered.size(), &length, &error) != LS_OK)
    return Status::usage(what + ": " + error.message);
  rendered.resize(length);
  size_t n = 0;
  std::vector<int64_t> ids;
  if (ls_tokenize(text.tokenizer, rendered.data(), rendered.size(), 0, nullptr, 0, &n, &error) == LS_OK) {
    ids.resize(n);
    if (ls_tokenize(text.tokenizer, rendered.data(), rendered.size(), 0, ids.data(), n, &n, &error) == LS_OK)
      return ids;
  }
  return Status::usage(what + ": " + error.message);
}

StatusOr<TextGeneration> generate_text(const RunnerRuntime& runtime, const AdapterView& adapter, const RunnerText& text,
                                       const GenerateRequest& request, const TextWriter& write) {
  ls_error error;
  std::unique_ptr<ls_detokenizer, void (*)(ls_detokenizer*)> decoder(
      ls_detokenizer_new(text.tokenizer, /*skip_special=*/1, &error), ls_detokenizer_free);
  if (!decoder) return status_of(error.code, error);
  std::string all;
  auto hand_out = [&](const int64_t* ids, size_t n, bool flush) {
    const char* piece = nullptr;
    size_t length = 0;
    ls_error e;
    if (ls_detokenize(decoder.get(), ids, n, flush ? 1 : 0, &piece, &length, &e) != LS_OK || length == 0) return;
    all.append(piece, length);
    if (write) write(std::string(piece, length));
  };
  std::function<void(int64_t)> on_token = [&](int64_t id) {
    if (std::find(text.eos.begin(), text.eos.end(), id) != text.eos.end()) return;  // kept in tokens, not text
    hand_out(&id, 1, false);
  };
  auto g = runtime.generate(adapter, request, on_token);
  if (!g.ok()) return g.status();
  hand_out(nullptr, 0, true);
  return TextGeneration{std::move(g.value()), std::move(all)};
}

}  // namespace lora_share
