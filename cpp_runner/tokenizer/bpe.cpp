#include "bpe.h"

#include <cstdio>
#include <queue>

#include <nlohmann/json.hpp>

#include "utf8.h"

namespace lora_share::tok {

namespace {

using json = nlohmann::json;

constexpr size_t kCacheCapacity = 10000;  // words; the cache is dropped whole when full

std::string optional_string(const json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null() ? j.at(key).get<std::string>() : std::string();
}

}  // namespace

Status Bpe::add_merge(const std::string& a, const std::string& b, uint32_t rank, const Where& where) {
  auto ia = vocab_.find(a), ib = vocab_.find(b);
  if (ia == vocab_.end() || ib == vocab_.end()) {
    return Status::failure(where.str() + ": merge '" + a + " " + b + "' uses a token missing from the vocab");
  }
  // The merged token drops the right part's continuing-subword prefix.
  std::string right = !prefix_.empty() && b.compare(0, prefix_.size(), prefix_) == 0 ? b.substr(prefix_.size()) : b;
  auto merged = vocab_.find(a + right);
  if (merged == vocab_.end()) {
    return Status::failure(where.str() + ": merge '" + a + " " + b + "' makes a token missing from the vocab");
  }
  merges_[pair_key(ia->second, ib->second)] = Merge{rank, merged->second};  // a repeated pair: the last rank wins
  return Status();
}

StatusOr<Bpe> Bpe::load(const json& model, const Where& where) {
  Bpe bpe;
  if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout").get<double>() != 0.0) {
    return Status::failure(where.str() + ".dropout: BPE dropout is not supported (generation needs determinism)");
  }
  for (const auto& [token, id] : model.at("vocab").items()) {
    bpe.vocab_[token] = id.get<int64_t>();
    bpe.vocab_r_[id.get<int64_t>()] = token;
  }
  std::string unk = optional_string(model, "unk_token");
  if (!unk.empty()) bpe.unk_token_ = unk;
  bpe.prefix_ = optional_string(model, "continuing_subword_prefix");
  bpe.suffix_ = optional_string(model, "end_of_word_suffix");
  bpe.fuse_unk_ = model.value("fuse_unk", false);
  bpe.byte_fallback_ = model.value("byte_fallback", false);
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  const json& merges = model.at("merges");
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    Where at = where.at(".merges[" + std::to_string(i) + "]");
    std::string a, b;
    if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else if (m.is_string()) {
      const std::string line = m.get<std::string>();
      size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return Status::failure(at.str() + ": '" + line + "' is not two tokens separated by one space");
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else {
      return Status::failure(at.str() + ": a merge is \"a b\" or [\"a\", \"b\"]");
    }
    Status s = bpe.add_merge(a, b, static_cast<uint32_t>(i), at);
    if (!s.ok()) return s;
  }
  if (bpe.unk_token_ && !bpe.vocab_.count(*bpe.unk_token_)) {
    return Status::failure(where.str() + ".unk_token: '" + *bpe.unk_token_ + "' is not in the vocab");
  }
  return bpe;
}

// One symbol per character (with prefix / suffix), unknown characters as
// their <0xNN> bytes (byte_fallback) or the unk token (fused when fuse_unk).
std::vector<int64_t> Bpe::initial_symbols(const std::string& word) const {
  std::vector<int64_t> symbols;
  std::optional<int64_t> pending_unk;
  std::vector<std::string_view> chars = utf8_chars(word);
  for (size_t i = 0; i < chars.size(); ++i) {
    std::string s(chars[i]);
    if (i > 0 && !prefix_.empty()) s = prefix_ + s;
    if (i + 1 == chars.size() && !suffix_.empty()) s += suffix_;
    auto found = vocab_.find(s);
    if (found != vocab_.end()) {
      if (pending_unk) symbols.push_back(*pending_unk);
      pending_unk.reset();
      symbols.push_back(found->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int64_t> bytes;
      for (unsigned char b : s) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        auto id = vocab_.find(name);
        if (id == vocab_.end()) break;
        bytes.push_back(id->second);
      }
      // As the Rust library: byte tokens go in before a still-pending unk.
      if (bytes.size() == s.size()) {
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (!unk_token_) continue;  // no unk token: the character is dropped
    int64_t unk_id = vocab_.at(*unk_token_);
    if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
    pending_unk = unk_id;
  }
  if (pending_unk) symbols.push_back(*pending_unk);
  return symbols;
}

std::vector<int64_t> Bpe::merge_all(std::vector<int64_t> symbols) const {
  struct Candidate {
    uint32_t rank;
    size_t pos;
    int64_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const size_t n = symbols.size();
  std::vector<ptrdiff_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<ptrdiff_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<ptrdiff_t>(i + 1) : -1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push = [&](size_t left) {
    if (next[left] < 0) return;
    auto m = merges_.find(pair_key(symbols[left], symbols[next[left]]));
    if (m != merges_.end()) queue.push({m->second.rank, left, m->second.new_id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    size_t right = static_cast<size_t>(next[top.pos]);
    // Stale entry: the pair at this position has changed since it was queued.
    auto m = merges_.find(pair_key(symbols[top.pos], symbols[right]));
    if (m == merges_.end() || m->second.new_id != top.new_id) continue;
    symbols[top.pos] = top.new_id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = static_cast<ptrdiff_t>(top.pos);
    if (prev[top.pos] >= 0) push(static_cast<size_t>(prev[top.pos]));
    push(top.pos);
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) out.push_back(symbols[i]);
  return out;
}

void Bpe::tokenize(const std::string& word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto whole = vocab_.find(word);
    if (whole != vocab_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  auto hit = cache_.find(word);
  if (hit == cache_.end()) {
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    hit = cache_.emplace(word, merge_all(initial_symbols(word))).first;
  }
  out.insert(out.end(), hit->second.begin(), hit->second.end());
}

std::optional<int64_t> Bpe::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int64_t id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

}  // namespace lora_share::tok
