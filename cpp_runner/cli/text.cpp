#include "text.h"

#include <algorithm>
#include <fstream>

#include "file_check.h"
#include "manifest.h"

namespace lora_share {

std::string tokenizer_folder(const Options& options) {
  return options.tokenizer_dir.empty() ? tok::folder_of(options.ptd) : options.tokenizer_dir;
}

StatusOr<std::optional<tok::BoundTokenizer>> load_text_tokenizer(const Options& options) {
  if (options.ptd.empty()) return std::optional<tok::BoundTokenizer>();
  // The fingerprint recorded inside the .ptd: what the manifest must name.
  auto ptd = check_ptd(options.ptd, "--ptd");
  if (!ptd.ok()) return ptd.status();
  std::string fingerprint = ptd->record.present ? ptd->record.fingerprint : "";
  std::string folder = tokenizer_folder(options);
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  const std::string path = folder + "/manifest.json";
  if (!std::ifstream(path)) return std::optional<tok::BoundTokenizer>();
  auto manifest = parse_manifest(path);
  if (!manifest.ok()) return manifest.status();
  return tok::bind_tokenizer(manifest.value(), folder, options.ptd, fingerprint);
}

StatusOr<std::vector<int64_t>> encode_prompt(const tok::BoundTokenizer& tokenizer, const std::string& text,
                                             const std::string& what) {
  auto ids = tokenizer.tokenizer.encode(text, /*add_special_tokens=*/true);
  if (!ids.ok()) return Status::usage(what + ": " + ids.status().message());
  if (ids->empty()) return Status::usage(what + ": the text encodes to no tokens: give some text");
  return ids;
}

StatusOr<std::vector<int64_t>> encode_chat(const tok::BoundTokenizer& tokenizer,
                                           const std::vector<tok::ChatTurn>& messages, const std::string& what) {
  if (!tokenizer.chat) {
    return Status::usage(what +
                         ": the build has no chat format (its tokenizer has no chat template, or one that "
                         "is not fixed text per role): give the formatted text as the prompt");
  }
  auto text = tok::render_chat(*tokenizer.chat, messages);
  if (!text.ok()) return Status::usage(what + ": " + text.status().message());
  auto ids = tokenizer.tokenizer.encode(text.value(), /*add_special_tokens=*/false);
  if (!ids.ok()) return Status::usage(what + ": " + ids.status().message());
  return ids;
}

std::optional<std::vector<int64_t>> stop_ids_for(const Options& options, const tok::BoundTokenizer* tokenizer) {
  if (options.ignore_eos) return std::vector<int64_t>();
  if (tokenizer != nullptr) return tokenizer->eos_token_ids;
  return std::nullopt;
}

StatusOr<TextGeneration> generate_text(const RunnerRuntime& runtime, const AdapterView& adapter,
                                       const tok::BoundTokenizer& tokenizer, const GenerateRequest& request,
                                       const TextWriter& write) {
  const std::vector<int64_t>& eos = tokenizer.eos_token_ids;
  tok::StreamDecoder stream(tokenizer.tokenizer, /*skip_special_tokens=*/true);
  std::vector<int64_t> text_ids;
  std::function<void(int64_t)> on_token = [&](int64_t id) {
    if (std::find(eos.begin(), eos.end(), id) != eos.end()) return;  // kept in tokens, not printed
    text_ids.push_back(id);
    std::string piece = stream.push(id);
    if (write && !piece.empty()) write(piece);
  };
  auto g = runtime.generate(adapter, request, on_token);
  if (!g.ok()) return g.status();
  std::string rest = stream.finish();
  if (write && !rest.empty()) write(rest);
  return TextGeneration{std::move(g.value()), tokenizer.tokenizer.decode(text_ids, /*skip_special_tokens=*/true)};
}

}  // namespace lora_share
