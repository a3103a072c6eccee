#include "bounded_json.h"

#include <utility>
#include <vector>

namespace lora_share::requests {
namespace {

using nlohmann::json;

// Counts nesting and stops the parse at the first level past the bound;
// builds nothing.
class DepthCheck : public nlohmann::json_sax<json> {
 public:
  explicit DepthCheck(size_t max_depth) : max_depth_(max_depth) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return enter(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    error_at_ = position;
    return false;
  }

  bool too_deep() const { return too_deep_; }
  size_t error_at() const { return error_at_; }

 private:
  bool enter() {
    if (++depth_ > max_depth_) too_deep_ = true;
    return !too_deep_;
  }
  bool leave() {
    --depth_;
    return true;
  }

  size_t max_depth_;
  size_t depth_ = 0;
  bool too_deep_ = false;
  size_t error_at_ = 0;
};

std::string bytes_text(size_t n) {
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return std::to_string(n >> 20) + " MiB";
  return std::to_string(n) + " bytes";
}

// One JSON scalar as text, strings cut to `room` bytes (on a UTF-8 boundary).
std::string scalar_text(const json& v, size_t room) {
  if (!v.is_string()) return v.dump();
  const std::string& s = v.get_ref<const std::string&>();
  if (s.size() + 2 <= room) return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  size_t cut = std::min(s.size(), room);
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return json(s.substr(0, cut)).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

StatusOr<json> parse_bounded(const std::string& text, const JsonBounds& bounds) {
  if (text.size() > bounds.max_bytes)
    return Status::usage("the request body is " + bytes_text(text.size()) + ", more than the " +
                         bytes_text(bounds.max_bytes) + " a request may be");
  DepthCheck check(bounds.max_depth);
  if (!json::sax_parse(text, &check, json::input_format_t::json, /*strict=*/true)) {
    if (check.too_deep())
      return Status::usage("the request body nests arrays and objects more than " + std::to_string(bounds.max_depth) +
                           " levels deep: no field takes that");
    return Status::usage("the request body is not valid JSON (at byte " + std::to_string(check.error_at()) + ")");
  }
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Status::usage("the request body is not valid JSON");
  return parsed;
}

std::string preview(const json& value, size_t limit) {
  // Each frame: a container and the next of its elements to write.
  struct Frame {
    const json* container;
    json::const_iterator next;
    bool first;
  };
  std::string out;
  std::vector<Frame> stack;
  const json* pending = &value;
  while (out.size() <= limit) {
    if (pending != nullptr) {
      const json& v = *pending;
      pending = nullptr;
      if (v.is_object() || v.is_array()) {
        out += v.is_object() ? '{' : '[';
        stack.push_back({&v, v.cbegin(), true});
      } else {
        out += scalar_text(v, limit + 1 - std::min(out.size(), limit));
      }
      continue;
    }
    if (stack.empty()) return out;
    Frame& top = stack.back();
    if (top.next == top.container->cend()) {
      out += top.container->is_object() ? '}' : ']';
      stack.pop_back();
      continue;
    }
    if (!top.first) out += ", ";
    top.first = false;
    if (top.container->is_object()) out += scalar_text(json(top.next.key()), limit) + ": ";
    pending = &*top.next;
    ++top.next;
  }
  size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
  return out.substr(0, cut) + "\xE2\x80\xA6";
}

}  // namespace lora_share::requests
