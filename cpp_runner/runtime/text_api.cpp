// The C API's text calls (lora_share.h, TEXT): the build's tokenizer
// (tokenizer/, linked into the library with its symbols hidden), bound to
// the foundation exactly as build/runner and build/lora-share-server bind it
// (tokenizer/binding.h), and generation that takes and hands out text. No
// C++ exception leaves this file.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "api_support.h"
#include "chat_format.h"
#include "file_check.h"
#include "manifest.h"

struct ls_detokenizer {
  ls_tokenizer* tokenizer;
  lora_share::tok::StreamDecoder decoder;
  std::string piece;  // what the last ls_detokenize handed out
};

namespace {

using lora_share::Status;
using lora_share::StatusOr;
using namespace lora_share::capi;
namespace tok = lora_share::tok;

// A build folder's tokenizer, bound to the foundation.ptd its manifest names.
StatusOr<tok::BoundTokenizer> open_folder(const std::string& dir) {
  auto manifest = lora_share::read_manifest(dir);
  if (!manifest.ok()) return manifest.status();
  const std::string ptd = dir + "/" + manifest->foundation_file;
  auto info = lora_share::check_ptd(ptd, "ptd");
  if (!info.ok()) return info.status();
  auto bound = tok::bind_tokenizer(manifest.value(), dir, ptd, info->record.present ? info->record.fingerprint : "");
  if (!bound.ok()) return bound.status();
  if (!bound->has_value()) {
    return Status::usage(dir +
                         " has no tokenizer (the build's checkpoint had none): give token ids, or add "
                         "foundation.tokenizer to the config and rebuild");
  }
  return std::move(bound->value());
}

StatusOr<tok::BoundTokenizer> open_tokenizer(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return open_folder(path);
  auto tokenizer = tok::Tokenizer::load(path);
  if (!tokenizer.ok()) return tokenizer.status();
  return tok::BoundTokenizer{tok::folder_of(path), std::move(tokenizer.value()), {}, std::nullopt, std::nullopt};
}

// LS_ERR_NOT_FOUND for a build without a tokenizer, else `usage_code` for
// files that do not go together, LS_ERR_LOAD for a failure.
ls_status report_open(ls_error* error, const Status& s, bool runner_messages = false,
                      ls_status usage_code = LS_ERR_LOAD) {
  const bool none = s.message().find(" has no tokenizer ") != std::string::npos;
  return report(error, s, none ? LS_ERR_NOT_FOUND : usage_code, LS_ERR_LOAD, runner_messages);
}

}  // namespace

namespace lora_share::capi {

ls_status runtime_tokenizer(ls_runtime* rt, ls_tokenizer** out, ls_error* error, ls_status usage_code) {
  if (!rt->tokenizer) {
    const std::string& ptd = rt->pool->ptd();
    if (ptd.empty()) {
      set_error(error, LS_ERR_NOT_FOUND, "this runtime has no foundation.ptd, so no build tokenizer");
      return LS_ERR_NOT_FOUND;
    }
    const std::string folder = rt->pool->tokenizer_folder();
    // The manifest the runtime read at open; a runtime that read none (its
    // EOS ids off) reads it now.
    std::optional<lora_share::Manifest> read;
    const lora_share::Manifest* manifest = rt->pool->tokenizer_manifest();
    const std::string path = (folder == "." ? std::string() : folder + "/") + "manifest.json";
    if (manifest == nullptr && std::ifstream(path)) {
      auto parsed = lora_share::parse_manifest(path);
      if (!parsed.ok()) return report_open(error, parsed.status(), rt->runner_messages, usage_code);
      read = std::move(parsed.value());
      manifest = &*read;
    }
    StatusOr<std::optional<tok::BoundTokenizer>> bound = std::optional<tok::BoundTokenizer>();
    if (manifest != nullptr) bound = tok::bind_tokenizer(*manifest, folder, ptd, rt->pool->foundation_fingerprint());
    if (!bound.ok()) return report_open(error, bound.status(), rt->runner_messages, usage_code);
    if (!bound->has_value()) {
      set_error(error, LS_ERR_NOT_FOUND, tok::no_tokenizer_message(folder), rt->runner_messages);
      return LS_ERR_NOT_FOUND;
    }
    rt->tokenizer = std::make_unique<ls_tokenizer>();
    rt->tokenizer->bound = std::move(bound->value());
  }
  *out = rt->tokenizer.get();
  return LS_OK;
}

}  // namespace lora_share::capi

namespace {

StatusOr<std::vector<tok::ChatTurn>> turns_of(const ls_chat_message* messages, size_t n) {
  if (messages == nullptr && n > 0) return Status::usage("messages is NULL");
  std::vector<tok::ChatTurn> turns;
  for (size_t i = 0; i < n; ++i) {
    if (messages[i].role == nullptr || messages[i].content == nullptr) {
      return Status::usage("messages[" + std::to_string(i) + "]: role and content must not be NULL");
    }
    turns.push_back({messages[i].role, messages[i].content});
  }
  return turns;
}

// The prompt text of `messages`; a usage error (LS_ERR_REQUEST) for a role
// the template lacks, LS_ERR_NOT_FOUND when it has no template.
ls_status render(ls_tokenizer* t, const ls_chat_message* messages, size_t n, std::string& text, ls_error* error) {
  if (!t->bound.chat) {
    set_error(error, LS_ERR_NOT_FOUND,
              "this tokenizer has no chat template (the build resolved none, or it is a bare tokenizer.json): "
              "give a text prompt");
    return LS_ERR_NOT_FOUND;
  }
  auto turns = turns_of(messages, n);
  if (!turns.ok()) return report(error, turns.status(), LS_ERR_ARGUMENT, LS_ERR_ARGUMENT);
  auto rendered = tok::render_chat(*t->bound.chat, turns.value());
  if (!rendered.ok()) return report(error, rendered.status(), LS_ERR_REQUEST, LS_ERR_REQUEST);
  text = std::move(rendered.value());
  return LS_OK;
}

// One text generation: ids in, decoded pieces out, EOS never text.
struct TextRun {
  const std::vector<int64_t>* eos;
  bool ignore_eos;
  tok::StreamDecoder decoder;
  ls_text_callback on_text;
  void* user_data;
  // The tokenizer's lock: with parallel > 1 other requests decode with it at once.
  std::mutex* tokenizer_lock;
  ls_text_result result{};
  bool stopped = false;  // the callback asked to stop

  bool hand_out(const std::string& piece) {
    if (stopped || piece.empty() || on_text == nullptr) return !stopped;
    stopped = on_text(piece.data(), piece.size(), user_data) != 0;
    return !stopped;
  }

  static int on_token(int64_t id, void* self) {
    auto* run = static_cast<TextRun*>(self);
    if (!run->ignore_eos && std::find(run->eos->begin(), run->eos->end(), id) != run->eos->end()) {
      run->result.finish_reason = LS_FINISH_EOS;
      return 1;
    }
    ++run->result.completion_tokens;
    std::string piece;
    {
      std::lock_guard<std::mutex> lock(*run->tokenizer_lock);
      piece = run->decoder.push(id);
    }
    return run->hand_out(piece) ? 0 : 1;
  }
};

// Encodes `text` and generates from it with the runtime's lock held.
ls_status generate_from_text(ls_runtime* rt, const char* name, const std::string& text, bool add_special,
                             const ls_generate_options* options, ls_text_callback on_text, void* user_data,
                             ls_text_result* result, ls_error* error) {
  if (options != nullptr && options->n > 1) {
    set_error(error, LS_ERR_ARGUMENT,
              "n is " + std::to_string(options->n) +
                  ": ls_generate_text and ls_generate_chat hand out one answer; for n choices use ls_generate "
                  "with on_token_info");
    return LS_ERR_ARGUMENT;
  }
  ls_tokenizer* t = nullptr;
  ls_status status = runtime_tokenizer(rt, &t, error);
  if (status != LS_OK) return status;
  std::vector<int64_t> ids;
  {
    std::lock_guard<std::mutex> lock(t->lock);
    auto encoded = t->bound.tokenizer.encode(text, add_special);
    if (!encoded.ok())
      return report(error, Status::usage("prompt: " + encoded.status().message()), LS_ERR_REQUEST, LS_ERR_REQUEST);
    ids = std::move(encoded.value());
  }
  if (ids.empty()) {
    set_error(error, LS_ERR_REQUEST, "the prompt encodes to no tokens: give some text");
    return LS_ERR_REQUEST;
  }
  size_t index = lora_share::AdapterPool::kBase;
  if (std::strcmp(name, lora_share::kBaseName) != 0) {
    int64_t found = rt->pool->find(name);
    if (found < 0) {
      set_error(error, LS_ERR_NOT_FOUND, unknown_adapter_message(rt, name));
      return LS_ERR_NOT_FOUND;
    }
    index = static_cast<size_t>(found);
  }
  // The adapter pool's EOS ids are the bound tokenizer's: both read the
  // same manifest.json section.
  TextRun run{&rt->pool->eos_ids(),
              options != nullptr && options->ignore_eos != 0,
              tok::StreamDecoder(t->bound.tokenizer, /*skip_special_tokens=*/true),
              on_text,
              user_data,
              &t->lock};
  run.result.prompt_tokens = ids.size();
  status =
      generate_index(rt, index, ids.data(), ids.size(), options, &TextRun::on_token, &run, GenerateExtras(), error);
  if (status != LS_OK) return status;
  std::string rest;
  {
    std::lock_guard<std::mutex> lock(t->lock);
    rest = run.decoder.finish();
  }
  run.hand_out(rest);
  if (run.stopped) run.result.finish_reason = LS_FINISH_CALLBACK;
  if (result != nullptr) *result = run.result;
  clear_error(error);
  return LS_OK;
}

}  // namespace

extern "C" {

ls_tokenizer* ls_tokenizer_open(const char* path, ls_error* error) {
  if (path == nullptr) return missing(error, "path"), nullptr;
  try {
    auto bound = open_tokenizer(path);
    if (!bound.ok()) return report_open(error, bound.status()), nullptr;
    auto* t = new ls_tokenizer();
    t->bound = std::move(bound.value());
    clear_error(error);
    return t;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_tokenizer_open: ") + e.what());
    return nullptr;
  }
}

void ls_tokenizer_close(ls_tokenizer* tokenizer) { delete tokenizer; }

ls_tokenizer* ls_runtime_tokenizer(ls_runtime* runtime, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime"), nullptr;
  Guard guard(runtime);
  if (!guard.held()) return busy(error), nullptr;
  try {
    ls_tokenizer* t = nullptr;
    if (runtime_tokenizer(runtime, &t, error) != LS_OK) return nullptr;
    clear_error(error);
    return t;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_LOAD, std::string("ls_runtime_tokenizer: ") + e.what());
    return nullptr;
  }
}

ls_status ls_tokenize(ls_tokenizer* tokenizer, const char* text, size_t length, int add_special, int64_t* ids,
                      size_t capacity, size_t* n_ids, ls_error* error) {
  if (tokenizer == nullptr) return missing(error, "tokenizer");
  if (text == nullptr && length > 0) return missing(error, "text");
  if (n_ids == nullptr) return missing(error, "n_ids");
  if (ids == nullptr && capacity > 0) return missing(error, "ids");
  try {
    std::lock_guard<std::mutex> lock(tokenizer->lock);
    auto encoded = tokenizer->bound.tokenizer.encode(std::string(text ? text : "", length), add_special != 0);
    if (!encoded.ok()) return report(error, encoded.status(), LS_ERR_REQUEST, LS_ERR_REQUEST);
    *n_ids = encoded->size();
    if (encoded->size() <= capacity) std::copy(encoded->begin(), encoded->end(), ids);
    clear_error(error);
    return LS_OK;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_tokenize: ") + e.what());
    return LS_ERR_RUN;
  }
}

ls_detokenizer* ls_detokenizer_new(ls_tokenizer* tokenizer, int skip_special, ls_error* error) {
  if (tokenizer == nullptr) return missing(error, "tokenizer"), nullptr;
  try {
    auto* d = new ls_detokenizer{tokenizer, tok::StreamDecoder(tokenizer->bound.tokenizer, skip_special != 0), {}};
    clear_error(error);
    return d;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_detokenizer_new: ") + e.what());
    return nullptr;
  }
}

void ls_detokenizer_free(ls_detokenizer* detokenizer) { delete detokenizer; }

ls_status ls_detokenize(ls_detokenizer* detokenizer, const int64_t* ids, size_t n, int flush, const char** text,
                        size_t* length, ls_error* error) {
  if (detokenizer == nullptr) return missing(error, "detokenizer");
  if (ids == nullptr && n > 0) return missing(error, "ids");
  if (text == nullptr || length == nullptr) return missing(error, text == nullptr ? "text" : "length");
  try {
    std::lock_guard<std::mutex> lock(detokenizer->tokenizer->lock);
    detokenizer->piece.clear();
    for (size_t i = 0; i < n; ++i) detokenizer->piece += detokenizer->decoder.push(ids[i]);
    if (flush) detokenizer->piece += detokenizer->decoder.finish();
    *text = detokenizer->piece.c_str();
    *length = detokenizer->piece.size();
    clear_error(error);
    return LS_OK;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_detokenize: ") + e.what());
    return LS_ERR_RUN;
  }
}

ls_status ls_apply_chat_template(ls_tokenizer* tokenizer, const ls_chat_message* messages, size_t n, char* buffer,
                                 size_t capacity, size_t* length, ls_error* error) {
  if (tokenizer == nullptr) return missing(error, "tokenizer");
  if (length == nullptr) return missing(error, "length");
  if (buffer == nullptr && capacity > 0) return missing(error, "buffer");
  try {
    std::string text;
    ls_status status = render(tokenizer, messages, n, text, error);
    if (status != LS_OK) return status;
    *length = text.size();
    if (text.size() < capacity) std::memcpy(buffer, text.c_str(), text.size() + 1);
    clear_error(error);
    return LS_OK;
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_apply_chat_template: ") + e.what());
    return LS_ERR_RUN;
  }
}

ls_status ls_generate_text(ls_runtime* runtime, const char* name, const char* prompt,
                           const ls_generate_options* options, ls_text_callback on_text, void* user_data,
                           ls_text_result* result, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (name == nullptr) return missing(error, "name");
  if (prompt == nullptr) return missing(error, "prompt");
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    return generate_from_text(runtime, name, prompt, /*add_special=*/true, options, on_text, user_data, result, error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_generate_text: ") + e.what());
    return LS_ERR_RUN;
  }
}

ls_status ls_generate_chat(ls_runtime* runtime, const char* name, const ls_chat_message* messages, size_t n,
                           const ls_generate_options* options, ls_text_callback on_text, void* user_data,
                           ls_text_result* result, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (name == nullptr) return missing(error, "name");
  Guard guard(runtime);
  if (!guard.held()) return busy(error);
  try {
    ls_tokenizer* t = nullptr;
    ls_status status = runtime_tokenizer(runtime, &t, error);
    if (status != LS_OK) return status;
    std::string text;
    status = render(t, messages, n, text, error);
    if (status != LS_OK) return status;
    // The template's text holds the special tokens it wants (BOS included).
    return generate_from_text(runtime, name, text, /*add_special=*/false, options, on_text, user_data, result, error);
  } catch (const std::exception& e) {
    set_error(error, LS_ERR_RUN, std::string("ls_generate_chat: ") + e.what());
    return LS_ERR_RUN;
  }
}

ls_status ls_runtime_eos_ids(ls_runtime* runtime, const int64_t** ids, size_t* n, ls_error* error) {
  if (runtime == nullptr) return missing(error, "runtime");
  if (ids == nullptr || n == nullptr) return missing(error, ids == nullptr ? "ids" : "n");
  // Read once at open and never changed: no lock needed, so a callback may ask.
  const std::vector<int64_t>& eos = runtime->pool->eos_ids();
  *ids = eos.empty() ? nullptr : eos.data();
  *n = eos.size();
  clear_error(error);
  return LS_OK;
}

}  // extern "C"
