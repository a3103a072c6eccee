#include "flag_table.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace lora_share::flags {
namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t begin = s.find_first_not_of(ws);
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(ws) - begin + 1);
}

const Flag* find(const std::vector<Flag>& table, const std::string& name) {
  for (const Flag& f : table)
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

Status parse(const std::vector<Flag>& table, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2)
      return Status::usage("unexpected argument '" + arg + "' (flags start with --; see --help)");
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const Flag* flag = find(table, name);
    if (flag == nullptr) return Status::usage("unknown flag '--" + name + "' (see --help)");
    if (flag->value == nullptr) {
      if (inline_value) return Status::usage("--" + name + " takes no value");
    } else if (!inline_value) {
      if (i + 1 >= argc) return Status::usage("--" + name + " needs a value (" + flag->value + ")");
      value = argv[++i];
    }
    Status s = flag->set(value);
    if (!s.ok()) return s;
  }
  return Status();
}

std::string help(const std::vector<Flag>& table, size_t column) {
  std::ostringstream out;
  for (const Flag& f : table) {
    std::string left = std::string("  --") + f.name + (f.value ? std::string(" ") + f.value : "");
    out << left << std::string(left.size() < column ? column - left.size() : 1, ' ') << f.help;
    if (f.default_text[0] != '\0') out << " [default: " << f.default_text << "]";
    out << "\n";
  }
  return out.str();
}

bool parse_int64(const std::string& text, int64_t* out) {
  const std::string t = trim(text);
  if (t.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, 10);
  if (errno != 0 || end != t.c_str() + t.size()) return false;
  *out = v;
  return true;
}

bool parse_double(const std::string& text, double* out) {
  const std::string t = trim(text);
  if (t.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (errno != 0 || end != t.c_str() + t.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

StatusOr<uint64_t> parse_size(const std::string& text, const std::string& flag) {
  static const std::vector<std::pair<std::string, double>> units = {{"GiB", 1024.0 * 1024 * 1024},
                                                                    {"MiB", 1024.0 * 1024},
                                                                    {"KiB", 1024.0},
                                                                    {"GB", 1e9},
                                                                    {"MB", 1e6},
                                                                    {"KB", 1e3},
                                                                    {"B", 1},
                                                                    {"", 1}};
  for (const auto& [suffix, scale] : units) {
    if (text.size() < suffix.size() || text.compare(text.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string number = text.substr(0, text.size() - suffix.size());
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (number.empty() || *end != '\0' || !std::isfinite(value) || value < 0 || value * scale > 1.8e19) break;
    return static_cast<uint64_t>(value * scale);
  }
  return Status::usage(flag + " must be a size such as 600MiB, 1.5GiB or 800000000, got '" + text + "'");
}

}  // namespace lora_share::flags
