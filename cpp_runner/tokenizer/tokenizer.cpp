#include "tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "utf8.h"

namespace lora_share::tok {

namespace {

using json = nlohmann::json;

const char* const kReplacementChar = "\xEF\xBF\xBD";

Status check_unsupported_options(const json& j, const std::string& path) {
  if (j.contains("truncation") && !j.at("truncation").is_null()) {
    return Status::failure(path + ": truncation is set; this runtime encodes without truncation");
  }
  Where file{path, ""};
  const json& model = j.at("model");
  if (model.value("type", std::string("BPE")) != "BPE") {
    return unsupported(file.at("model"), model.at("type").get<std::string>());
  }
  return Status();
}

// How the decoder turns tokens into bytes, as Hugging Face's converters write
// it: a ByteLevel or ByteFallback step, alone or in a Sequence.
Vocabulary::Kind vocab_kind(const json& decoder) {
  if (!decoder.is_object()) return Vocabulary::Kind::kRaw;
  json steps = decoder.value("type", std::string()) == "Sequence" ? decoder.value("decoders", json::array())
                                                                  : json::array({decoder});
  for (const json& step : steps) {
    if (!step.is_object()) continue;
    std::string type = step.value("type", std::string());
    if (type == "ByteLevel") return Vocabulary::Kind::kByteLevel;
    if (type == "ByteFallback") return Vocabulary::Kind::kByteFallback;
  }
  return Vocabulary::Kind::kRaw;
}

// Whether encoding puts "▁" (a space) before the text: a Prepend("▁")
// normalizer, or a Metaspace pre-tokenizer that prepends.
bool prefix_space(const json& j) {
  const json normalizer = j.value("normalizer", json());
  if (normalizer.is_object()) {
    json steps = normalizer.value("type", std::string()) == "Sequence" ? normalizer.value("normalizers", json::array())
                                                                       : json::array({normalizer});
    for (const json& step : steps)
      if (step.is_object() && step.value("type", std::string()) == "Prepend" &&
          step.value("prepend", std::string()) == "\xE2\x96\x81")
        return true;
  }
  const json pre = j.value("pre_tokenizer", json());
  if (!pre.is_object() || pre.value("type", std::string()) != "Metaspace") return false;
  std::string scheme = pre.value("prepend_scheme", std::string());
  return scheme == "always" || scheme == "first";
}

}  // namespace

Vocabulary Tokenizer::vocabulary() const {
  Vocabulary v;
  v.kind = vocab_kind_;
  v.prefix_space = prefix_space_;
  int64_t last = -1;
  for (const auto& [id, token] : model_->tokens_by_id()) last = std::max(last, id);
  for (const auto& [id, content] : added_by_id_) last = std::max(last, id);
  v.tokens.assign(static_cast<size_t>(last + 1), std::string());
  v.special.assign(static_cast<size_t>(last + 1), false);
  for (const auto& [id, token] : model_->tokens_by_id())
    if (id >= 0) v.tokens[static_cast<size_t>(id)] = token;
  for (const auto& [id, content] : added_by_id_) {
    if (id < 0) continue;
    v.tokens[static_cast<size_t>(id)] = content;
    v.special[static_cast<size_t>(id)] = special_contents_.count(content) > 0;
  }
  return v;
}

Status Tokenizer::load_added_tokens(const json& list, const Where& where) {
  raw_matcher_ = std::make_unique<AddedTokenMatcher>();
  normalized_matcher_ = std::make_unique<AddedTokenMatcher>();
  for (size_t i = 0; i < list.size(); ++i) {
    const json& t = list[i];
    AddedToken a;
    a.id = t.at("id").get<int64_t>();
    a.content = t.at("content").get<std::string>();
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);
    auto in_vocab = model_->token_to_id(a.content);
    if (in_vocab && *in_vocab != a.id) {
      return Status::failure(where.str() + "[" + std::to_string(i) + "]: '" + a.content + "' has id " +
                             std::to_string(a.id) + " but the model's vocab gives it " + std::to_string(*in_vocab));
    }
    added_by_id_[a.id] = a.content;
    if (a.special) special_contents_.insert(a.content);
    if (a.normalized) {
      normalized_matcher_->add(a, normalizer_ ? normalizer_->normalize(a.content) : a.content);
    } else {
      raw_matcher_->add(a, a.content);
    }
  }
  raw_matcher_->finish();
  normalized_matcher_->finish();
  return Status();
}

Status Tokenizer::load_post_processor(const json& j, const Where& where) {
  if (j.is_null()) return Status();
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return Status();  // only moves offsets, which the ids do not carry
  if (type == "Sequence") {
    const json& list = j.at("processors");
    for (size_t i = 0; i < list.size(); ++i) {
      Status s = load_post_processor(list[i], where.at(".processors[" + std::to_string(i) + "]"));
      if (!s.ok()) return s;
    }
    return Status();
  }
  if (type != "TemplateProcessing") return unsupported(where, type);
  if (!template_.empty()) return Status::failure(where.str() + ": more than one TemplateProcessing");
  const json& specials = j.at("special_tokens");
  for (const json& item : j.at("single")) {
    if (item.contains("Sequence")) {
      template_.push_back({true, {}});
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    if (!specials.contains(name)) {
      return Status::failure(where.str() + ".single: special token '" + name + "' is not in special_tokens");
    }
    template_.push_back({false, specials.at(name).at("ids").get<std::vector<int64_t>>()});
  }
  return Status();
}

StatusOr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::failure(path + ": cannot open the tokenizer file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  Where file{path, ""};
  try {
    json j = json::parse(buffer.str());
    Status s = check_unsupported_options(j, path);
    if (!s.ok()) return s;
    Tokenizer t;
    auto model = Bpe::load(j.at("model"), file.at("model"));
    if (!model.ok()) return model.status();
    t.model_ = std::make_unique<Bpe>(std::move(model.value()));
    auto normalizer = make_normalizer(j.value("normalizer", json()), file.at("normalizer"));
    if (!normalizer.ok()) return normalizer.status();
    t.normalizer_ = std::move(normalizer.value());
    auto pre = make_pre_tokenizer(j.value("pre_tokenizer", json()), file.at("pre_tokenizer"));
    if (!pre.ok()) return pre.status();
    t.pre_tokenizer_ = std::move(pre.value());
    auto decoder = make_decoder(j.value("decoder", json()), file.at("decoder"));
    if (!decoder.ok()) return decoder.status();
    t.decoder_ = std::move(decoder.value());
    s = t.load_added_tokens(j.value("added_tokens", json::array()), file.at("added_tokens"));
    if (!s.ok()) return s;
    s = t.load_post_processor(j.value("post_processor", json()), file.at("post_processor"));
    if (!s.ok()) return s;
    t.vocab_kind_ = vocab_kind(j.value("decoder", json()));
    t.prefix_space_ = prefix_space(j);
    return t;
  } catch (const json::exception& e) {
    return Status::failure(path + ": not a valid tokenizer.json (" + e.what() + ")");
  }
}

// Normalize, cut out the normalized added tokens, pre-tokenize, BPE.
void Tokenizer::encode_text(const Segment& segment, std::vector<int64_t>& ids) const {
  std::string normalized = normalizer_ ? normalizer_->normalize(segment.text) : segment.text;
  for (const Segment& part : normalized_matcher_->split(normalized, segment.at_start)) {
    if (part.id) {
      ids.push_back(*part.id);
      continue;
    }
    std::vector<Piece> pieces{{part.text, part.at_start}};
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
    for (const Piece& p : pieces) model_->tokenize(p.text, ids);
  }
}

StatusOr<std::vector<int64_t>> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  if (!utf8_valid(text)) return Status::usage("the text to encode is not valid UTF-8");
  std::vector<int64_t> ids;
  for (const Segment& segment : raw_matcher_->split(text, true)) {
    if (segment.id)
      ids.push_back(*segment.id);
    else
      encode_text(segment, ids);
  }
  if (!add_special_tokens || template_.empty()) return ids;
  std::vector<int64_t> out;
  for (const TemplateItem& item : template_) {
    const std::vector<int64_t>& part = item.is_sequence ? ids : item.ids;
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    auto added = added_by_id_.find(id);
    const std::string* token = added != added_by_id_.end() ? &added->second : model_->id_to_token(id);
    if (token == nullptr) continue;
    if (skip_special_tokens && special_contents_.count(*token)) continue;
    tokens.push_back(*token);
  }
  std::string out;
  if (!decoder_) {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const std::string& piece : decoder_->decode_chain(std::move(tokens))) out += piece;
  return out;
}

std::string StreamDecoder::emit(bool final) {
  std::string text = tokenizer_.decode(ids_, skip_special_);
  // A trailing U+FFFD may be a character whose remaining bytes are still to come.
  bool held = !final && text.size() >= 3 && text.compare(text.size() - 3, 3, kReplacementChar) == 0;
  if (held) return "";
  // Text already printed cannot be taken back: print from where it diverges.
  size_t common = 0;
  while (common < emitted_.size() && common < text.size() && emitted_[common] == text[common]) ++common;
  // Diverging inside a character (two characters that share their lead byte) must not start the
  // piece with a continuation byte: that piece alone would not be valid UTF-8.
  while (common > 0 && common < text.size() && (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) --common;
  std::string fresh = text.substr(common);
  emitted_ = std::move(text);
  return fresh;
}

std::string StreamDecoder::push(int64_t id) {
  ids_.push_back(id);
  return emit(false);
}

std::string StreamDecoder::finish() { return emit(true); }

}  // namespace lora_share::tok
